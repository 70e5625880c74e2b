"""Opening server-layer reports: the inverse of sealing, for the holder of the server key.

Built on the keyless core :mod:`sealing.unseal`; the key comes from
:class:`server.keys.ServerKeyPair`. No shuffler module imports this package.
"""
from __future__ import annotations

import numpy as np

from sealing.envelope import SERVER_LAYER, RoundContext
from sealing.unseal import REJECT_KINDS, Opened, empty_rejects, open_rows
from server.keys import ServerKeyPair

__all__ = ["ReportOpener", "REJECT_KINDS"]


class ReportOpener:
    """Opens one job's server-layer reports, rejecting and counting bad ones (never raises).

    Kinds (:data:`REJECT_KINDS`): ``malformed`` (bad shape, version, layer, length or
    padding), ``wrong_job`` / ``wrong_round`` (clear header names another job or
    round), ``tampered`` (header matches, AEAD tag fails). Duplicates (``replayed``)
    are the accumulator's to judge, by report id across the whole job
    (:class:`server.accumulator.RoundAccumulator`), so that several openers can work
    in parallel. ``payload_len`` is the round's message size, from the mechanism and
    never from a report: one short report cannot redefine what the honest ones must be.
    """

    def __init__(self, keypair: ServerKeyPair, ctx: RoundContext, payload_len: int):
        if int(payload_len) < 0:
            raise ValueError(f"payload_len must be >= 0, got {payload_len}")
        self.keypair, self.ctx, self.payload_len = keypair, ctx, int(payload_len)
        self.totals = empty_rejects()
        self.opened = 0

    def start_round(self, round_id: int, payload_len: int | None = None) -> None:
        """Move to the next round of the same job (its message size may differ)."""
        self.ctx = RoundContext(self.ctx.job_id, round_id, self.ctx.version)
        if payload_len is not None:
            self.payload_len = int(payload_len)

    def open_batch(self, ciphertexts: np.ndarray) -> Opened:
        """Open one batch: payloads, report ids, and rejects by kind."""
        out = open_rows(self.keypair.exchange, self.keypair.public_bytes(), ciphertexts,
                        self.ctx, SERVER_LAYER, self.payload_len)
        self.opened += len(out.payloads)
        self.totals.update(out.rejects)
        return out

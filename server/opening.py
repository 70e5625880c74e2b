"""Opening server-layer reports: the inverse of sealing, for the holder of the server key.

Built on the keyless core :mod:`sealing.unseal`; the key comes from
:class:`server.keys.ServerKeyPair`. No shuffler module imports this package.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from sealing.envelope import SERVER_LAYER, RoundContext
from sealing.unseal import REJECT_KINDS, ReplayGuard, empty_rejects, open_rows
from server.keys import ServerKeyPair

__all__ = ["ReportOpener", "REJECT_KINDS"]


class ReportOpener:
    """Opens one job's server-layer reports, rejecting and counting bad ones (never raises).

    Kinds (:data:`REJECT_KINDS`): ``malformed`` (bad shape, version, layer, length or
    padding), ``wrong_job`` / ``wrong_round`` (clear header names another job or
    round), ``tampered`` (header matches, AEAD tag fails), ``replayed`` (an ephemeral
    key already opened in this job: replays are caught across calls and rounds).
    ``payload_len`` is the round's message size; if None, the first batch's most
    common declared length is adopted for the job.
    """

    def __init__(self, keypair: ServerKeyPair, ctx: RoundContext, payload_len: int | None = None):
        self.keypair, self.ctx, self.payload_len = keypair, ctx, payload_len
        self._replays = ReplayGuard()
        self.totals = empty_rejects()
        self.opened = 0

    def start_round(self, round_id: int) -> None:
        """Move to the next round of the same job (replay memory is kept)."""
        self.ctx = RoundContext(self.ctx.job_id, round_id, self.ctx.version)

    def open_batch(self, ciphertexts: np.ndarray) -> tuple[np.ndarray, Counter]:
        """``(payloads (M_ok, L) uint8, rejects Counter by kind)`` for one batch of reports."""
        payloads, eph, _, rejects = open_rows(self.keypair.exchange, self.keypair.public_bytes(),
                                              ciphertexts, self.ctx, SERVER_LAYER, self.payload_len)
        fresh = self._replays.fresh(eph)
        rejects["replayed"] += int((~fresh).sum())
        payloads = payloads[fresh]
        if self.payload_len is None and len(payloads):
            self.payload_len = payloads.shape[1]
        self.opened += len(payloads)
        self.totals.update(rejects)
        return payloads, rejects

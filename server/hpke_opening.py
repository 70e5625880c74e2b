"""Opening HPKE reports (docs/wire-format.md) at the server: the layer sealed for its key.

The keyless core is :mod:`sealing.hpke_open`; the key stays in
:class:`server.keys.ServerKeyPair` (its ``hpke_open``). Replays are not judged here:
report ids come back with the payloads, and the job-wide memory of ids is the
accumulator's, so several openers can work in parallel (as with :mod:`server.opening`).
"""
from __future__ import annotations

import numpy as np

from sealing.hpke_open import REJECT_KINDS, LayerOpened, empty_rejects, open_rows
from sealing.hpke_report import SERVER_LAYER, SPEC_HASH_LEN
from server.keys import ServerKeyPair

__all__ = ["HpkeReportOpener", "HpkeBatchOpener", "REJECT_KINDS"]


class HpkeReportOpener:
    """Opens one round's server-layer HPKE reports; rejects and counts bad ones, never raises.

    ``spec_hash`` is the content hash of the round's signed specification (a report made
    for another one is ``wrong_spec``); ``payload_len`` is the round's message length from
    the specification, never from a report.
    """

    def __init__(self, keypair: ServerKeyPair, spec_hash: bytes, payload_len: int):
        if len(spec_hash) != SPEC_HASH_LEN:
            raise ValueError(f"spec_hash is the {SPEC_HASH_LEN}-byte SHA-256 of the specification, "
                             f"got {len(spec_hash)} bytes")
        if int(payload_len) < 0:
            raise ValueError(f"payload_len must be >= 0, got {payload_len}")
        self.keypair, self.spec_hash, self.payload_len = keypair, bytes(spec_hash), int(payload_len)
        self.totals = empty_rejects()
        self.opened = 0

    def open_batch(self, records) -> LayerOpened:
        """Open a batch ((M, width) uint8 rows or a list of records): payloads, ids, rejects."""
        out = open_rows(self.keypair.hpke_open, records, self.spec_hash, SERVER_LAYER,
                        self.payload_len)
        self.opened += len(out.kept)
        self.totals.update(out.rejects)
        return out


class HpkeBatchOpener(HpkeReportOpener):
    """The same opener, answering as :class:`server.opening.ReportOpener` does, so the
    server's opener processes and accumulator (:func:`server.accumulator.open_and_check`)
    take a released batch of HPKE reports (a remote round, rknn_ray/job/remote_session.py)
    exactly as they take the simulation's envelopes."""

    def open_batch(self, records):
        from sealing.unseal import Opened        # the accumulator's view of an opened batch
        out = super().open_batch(records)
        return Opened(out.plaintexts, out.report_ids, np.zeros(len(out.kept), "S32"), out.kept,
                      out.rejects)

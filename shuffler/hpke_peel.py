"""A shuffler hop peeling its own layer of HPKE reports (docs/wire-format.md).

Hop ``h`` (layer ``h >= 1``) opens with its :class:`shuffler.layers.LayerKeyPair` through
the keyless core :mod:`sealing.hpke_open`; what comes out is the next layer's record,
which it checks but cannot open (the server layer is sealed to the server's key). A
report id seen before in this round is a retry or a replay: the first copy is kept, later
ones are counted as ``replayed`` and dropped (DAP's rule), so a retried upload counts once.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from sealing.hpke_open import empty_rejects, open_rows
from sealing.hpke_report import LAYER_OVERHEAD, REPORT_ID_LEN, VERSION, unpack_header
from sealing.replay import ReplayGuard
from shuffler.layers import LayerKeyPair


class HpkeLayerPeeler:
    """Removes one hop's layer from a round's reports; refuses and counts, never raises.

    ``inner_len`` is the length of the record under this layer (from the specification:
    ``record_len(payload_len, layers below)``).
    """

    def __init__(self, keypair: LayerKeyPair, spec_hash: bytes, inner_len: int):
        if int(inner_len) < LAYER_OVERHEAD:
            raise ValueError(f"an inner record has at least {LAYER_OVERHEAD} bytes, got {inner_len}")
        self.keypair, self.spec_hash, self.inner_len = keypair, bytes(spec_hash), int(inner_len)
        self._seen = ReplayGuard(REPORT_ID_LEN)
        self.totals = empty_rejects()
        self.totals["replayed"] = 0

    def peel(self, records) -> tuple[np.ndarray, np.ndarray, Counter]:
        """``(inner records (M_ok, inner_len) uint8, kept row indices, rejects by kind)``."""
        out = open_rows(self.keypair.hpke_open, records, self.spec_hash, self.keypair.layer,
                        self.inner_len)
        rejects = out.rejects
        rejects["replayed"] = 0
        good = np.array([self._inner_matches(row.tobytes(), rid)
                         for row, rid in zip(out.plaintexts, out.report_ids)], bool)
        rejects["malformed"] += int((~good).sum())
        fresh = np.zeros(len(good), bool)
        if good.any():
            fresh[good] = self._seen.fresh(out.report_ids[good])
        rejects["replayed"] += int((good & ~fresh).sum())
        self.totals.update(rejects)
        return out.plaintexts[fresh], out.kept[fresh], rejects

    def _inner_matches(self, inner: bytes, report_id: bytes) -> bool:
        """The inner record is the next layer of the same report: version, layer, spec, id."""
        head = unpack_header(inner)
        return (head.version == VERSION and head.layer == self.keypair.layer - 1
                and head.spec_hash == self.spec_hash and head.report_id == report_id)

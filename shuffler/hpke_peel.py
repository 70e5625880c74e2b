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

from sealing.hpke_open import Refused, empty_rejects, open_record, open_rows
from sealing.hpke_report import LAYER_OVERHEAD, REPORT_ID_LEN, VERSION, unpack_header
from sealing.replay import ReplayGuard
from shuffler.layers import LayerKeyPair


class HpkeLayerPeeler:
    """Removes one hop's layer from a round's reports; refuses and counts, never raises.

    ``inner_len`` is the length of the record under this layer (from the specification:
    ``record_len(payload_len, layers below)``). ``hops`` is the specification's number of
    shufflers H: the first hop is outermost, so under layer h < H lies layer h + 1 and under
    the last hop's layer H the server's layer 0 (default: this hop is the last).
    """

    def __init__(self, keypair: LayerKeyPair, spec_hash: bytes, inner_len: int,
                 hops: int | None = None):
        if int(inner_len) < LAYER_OVERHEAD:
            raise ValueError(f"an inner record has at least {LAYER_OVERHEAD} bytes, got {inner_len}")
        hops = keypair.layer if hops is None else int(hops)
        if hops < keypair.layer:
            raise ValueError(f"hop {keypair.layer} of a chain of {hops} shufflers does not exist")
        self.keypair, self.spec_hash, self.inner_len = keypair, bytes(spec_hash), int(inner_len)
        self.inner_layer = keypair.layer + 1 if keypair.layer < hops else 0
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

    def peel_one(self, record: bytes) -> bytes:
        """The inner record of one report, or :class:`sealing.hpke_open.Refused` with its kind.
        No replay memory: for a caller that keeps its own (the shuffler service's store)."""
        report_id, inner = open_record(self.keypair.hpke_open, record, self.spec_hash,
                                       self.keypair.layer, self.inner_len)
        if not self._inner_matches(inner, report_id):
            raise Refused("malformed", "the inner record is not the next layer of this report")
        return inner

    def _inner_matches(self, inner: bytes, report_id: bytes) -> bool:
        """The inner record is the next layer inward of the same report: version, layer, spec, id."""
        head = unpack_header(inner)
        # an 'S16' array element drops trailing zero bytes: pad back before comparing
        report_id = bytes(report_id).ljust(REPORT_ID_LEN, b"\x00")
        return (head.version == VERSION and head.layer == self.inner_layer
                and head.spec_hash == self.spec_hash and head.report_id == report_id)

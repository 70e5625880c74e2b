"""Opening one layer of an HPKE report (:mod:`sealing.hpke_report`) for whoever holds its key.

No key lives here: the key holder passes its ``open`` function (``open(sealed, info) ->
plaintext``, HPKE OpenBase with its private key), as :mod:`sealing.unseal` takes an
``exchange``; :mod:`server.hpke_opening` (the server layer) and :mod:`shuffler.hpke_peel`
(a hop's own layer) share this core without importing each other.

Every refusal has a kind (:data:`REJECT_KINDS`): ``malformed`` (wrong length, version or
layer byte: nothing to open), ``wrong_spec`` (the clear spec hash names another round
specification: refused before any cryptography), ``tampered`` (the header is this round's
but HPKE refuses: a changed byte anywhere, or a layer sealed to another key).
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, NamedTuple

import numpy as np
from cryptography.exceptions import InvalidTag

from sealing.hpke_report import (ENC_LEN, HEADER_LEN, REPORT_ID_LEN, TAG_LEN, VERSION,
                                 layer_info, unpack_header)

REJECT_KINDS = ("malformed", "wrong_spec", "tampered")
OpenFn = Callable[[bytes, bytes], bytes]


class Refused(ValueError):
    """A record that does not open, with its kind (one of :data:`REJECT_KINDS`)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


class LayerOpened(NamedTuple):
    """What :func:`open_rows` returns: the good rows' plaintexts and ids, bad rows by kind."""
    plaintexts: np.ndarray   # (M_ok, plaintext_len) uint8
    report_ids: np.ndarray   # (M_ok,) 'S16'
    kept: np.ndarray         # (M_ok,) row index of each in the input
    rejects: Counter


def empty_rejects() -> Counter:
    """A Counter with every kind present (zeros show in reports)."""
    return Counter(dict.fromkeys(REJECT_KINDS, 0))


def open_record(open_fn: OpenFn, record: bytes, spec_hash: bytes, layer: int,
                plaintext_len: int) -> tuple[bytes, bytes]:
    """``(report id, plaintext)`` of one layer; :class:`Refused` (with its kind) otherwise.

    ``plaintext_len`` comes from the specification (the round's message length, or the
    inner record's length), never from the report.
    """
    record = bytes(record)
    want = HEADER_LEN + ENC_LEN + int(plaintext_len) + TAG_LEN
    if len(record) != want:
        raise Refused("malformed", f"a layer-{layer} record of this round is {want} bytes, "
                                   f"got {len(record)}")
    head = unpack_header(record)
    if head.version != VERSION or head.layer != layer:
        raise Refused("malformed", f"expected version {VERSION} layer {layer}, got version "
                                   f"{head.version} layer {head.layer}")
    if head.spec_hash != bytes(spec_hash):
        raise Refused("wrong_spec", f"report for specification {head.spec_hash.hex()[:16]}..., "
                                    f"this round's is {bytes(spec_hash).hex()[:16]}...")
    try:
        plaintext = open_fn(record[HEADER_LEN:], layer_info(record[:HEADER_LEN]))
    except (InvalidTag, ValueError):
        raise Refused("tampered", "HPKE open failed: the record was changed or sealed to "
                                  "another key") from None
    return head.report_id, plaintext


def open_rows(open_fn: OpenFn, rows, spec_hash: bytes, layer: int,
              plaintext_len: int) -> LayerOpened:
    """Open every row of an (M, width) uint8 array (or a list of records); count, never raise."""
    rejects = empty_rejects()
    if isinstance(rows, np.ndarray) and rows.ndim == 2 and rows.dtype == np.uint8:
        records = [r.tobytes() for r in rows]
    else:
        try:
            records = [bytes(r) for r in rows]
        except Exception:  # noqa: BLE001 - junk from the network is counted, not raised
            rejects["malformed"] += 1
            records = []
    plains, ids, kept = [], [], []
    for i, record in enumerate(records):
        try:
            rid, plain = open_record(open_fn, record, spec_hash, layer, plaintext_len)
        except Refused as exc:
            rejects[exc.kind] += 1
            continue
        plains.append(plain)
        ids.append(rid)
        kept.append(i)
    plain = np.frombuffer(b"".join(plains), np.uint8).reshape(len(kept), int(plaintext_len))
    return LayerOpened(plain, np.array(ids, dtype=f"S{REPORT_ID_LEN}"),
                       np.asarray(kept, np.int64), rejects)

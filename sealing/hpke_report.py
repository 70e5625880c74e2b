"""Reports in the standard wire format: RFC 9180 HPKE, one layer per recipient (public keys only).

This is the format parties run apart use (holders, a shuffler service, the operator's
server); any correct HPKE implementation can produce a report the server opens. It is
documented byte for byte in docs/wire-format.md; the in-cluster simulation still uses
:mod:`sealing.envelope` (format versions 1 and 2; this one is version 3, so byte 0 tells
the two apart).

Suite (fixed by the version): base mode, DHKEM(X25519, HKDF-SHA256) (kem 0x0020),
HKDF-SHA256 (kdf 0x0001), AES-128-GCM (aead 0x0001): the suite DAP makes mandatory, the
first suite of RFC 9180's test vectors (Appendix A.1), and AES-NI makes the AEAD cheap on
servers; the X25519 work dominates either way.

One layer is ``header (50) | enc (32) | ciphertext (len(plaintext) + 16)``; the header is
``version u8 | layer u8 | spec hash (32) | report id (16)`` in the clear, so a recipient
can refuse a report for another specification before any cryptography and a shuffler can
collapse a retried report by its id. The whole header is bound into HPKE's ``info``
(:func:`layer_info`), so editing any of its bytes makes the layer unopenable. ``aad`` is
empty: ``cryptography``'s single-shot HPKE has none, and ``info`` already carries
everything to bind. Layer 0 is the server's (plaintext: the payload, exactly the round's
message length); layer ``h >= 1`` is shuffler hop ``h`` of H (plaintext: the whole record of
the next layer inward: layer ``h+1``, or the server's layer 0 under the last hop ``H``), the
first hop outermost, every layer under the same spec hash and report id.
"""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import numpy as np
from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from sealing.hpke_seal import seal_base

VERSION = 3                   # 1, 2: sealing.envelope's in-cluster format
SUITE = hpke.Suite(hpke.KEM.X25519, hpke.KDF.HKDF_SHA256, hpke.AEAD.AES_128_GCM)
SUITE_IDS = (0x0020, 0x0001, 0x0001)        # kem, kdf, aead (RFC 9180 section 7)
SERVER_LAYER = 0
SPEC_HASH_LEN = 32            # SHA-256 of the signed round specification's content
REPORT_ID_LEN = 16
HEADER_LEN = 1 + 1 + SPEC_HASH_LEN + REPORT_ID_LEN   # 50
ENC_LEN = 32                  # X25519 public key (RFC 9180 SerializePublicKey)
TAG_LEN = 16                  # AES-128-GCM tag
LAYER_OVERHEAD = HEADER_LEN + ENC_LEN + TAG_LEN      # 98 bytes per layer
INFO_LABEL = b"rknn-ray report\x00"                  # 16 bytes, then the header


class Header(NamedTuple):
    """The clear part of one layer."""
    version: int
    layer: int
    spec_hash: bytes
    report_id: bytes


def record_len(payload_len: int, layers: int = 1) -> int:
    """Bytes of a report carrying ``payload_len`` bytes under ``layers`` layers."""
    return int(payload_len) + LAYER_OVERHEAD * int(layers)


def pack_header(layer: int, spec_hash: bytes, report_id: bytes) -> bytes:
    """The 50 clear bytes of one layer; ValueError on a wrong length or layer."""
    if not 0 <= int(layer) <= 255:
        raise ValueError(f"layer must be in [0, 255], got {layer}")
    if len(spec_hash) != SPEC_HASH_LEN:
        raise ValueError(f"a spec hash is {SPEC_HASH_LEN} bytes (SHA-256), got {len(spec_hash)}")
    if len(report_id) != REPORT_ID_LEN:
        raise ValueError(f"a report id is {REPORT_ID_LEN} bytes, got {len(report_id)}")
    return bytes([VERSION, int(layer)]) + bytes(spec_hash) + bytes(report_id)


def unpack_header(record: bytes) -> Header:
    """The header of a record (at least :data:`HEADER_LEN` bytes; not checked against anything)."""
    if len(record) < HEADER_LEN:
        raise ValueError(f"a record has at least {HEADER_LEN} bytes, got {len(record)}")
    return Header(record[0], record[1], bytes(record[2:34]), bytes(record[34:HEADER_LEN]))


def layer_info(header: bytes) -> bytes:
    """HPKE ``info`` of a layer: the label, then the layer's 50-byte header."""
    return INFO_LABEL + bytes(header)


def public_key(key: bytes | X25519PublicKey) -> X25519PublicKey:
    """A recipient key as the object HPKE takes; ValueError unless 32 raw X25519 bytes."""
    if isinstance(key, X25519PublicKey):
        return key
    if len(key) != ENC_LEN:
        raise ValueError(f"an HPKE recipient key is {ENC_LEN} raw X25519 bytes, got {len(key)}")
    return _public_key(bytes(key))


@functools.lru_cache(maxsize=64)
def _public_key(raw: bytes) -> X25519PublicKey:
    """A round's few recipient keys are parsed once per process, not once per report (the
    object is immutable: a public key)."""
    return X25519PublicKey.from_public_bytes(raw)


def seal_layer(recipient: bytes | X25519PublicKey, plaintext: bytes, spec_hash: bytes,
               report_id: bytes, layer: int) -> bytes:
    """One layer: header, then HPKE SealBase(pkR, info = label | header, aad = "", plaintext)."""
    head = pack_header(layer, spec_hash, report_id)
    raw = recipient.public_bytes_raw() if isinstance(recipient, X25519PublicKey) else recipient
    # SUITE's SealBase (sealing.hpke_seal: libsodium's X25519, the same bytes on the wire)
    return head + seal_base(raw, plaintext, layer_info(head))


def seal_report(server: bytes | X25519PublicKey, payload: bytes, spec_hash: bytes,
                report_id: bytes, shufflers: list[bytes] = ()) -> bytes:
    """A report: sealed for the server, then once per shuffler (``shufflers[0]`` = first hop,
    outermost), all layers under one spec hash and report id."""
    record = seal_layer(server, payload, spec_hash, report_id, SERVER_LAYER)
    for hop in reversed(range(len(shufflers))):
        record = seal_layer(shufflers[hop], record, spec_hash, report_id, hop + 1)
    return record


def seal_reports(server: bytes | X25519PublicKey, payloads: np.ndarray, spec_hash: bytes,
                 report_ids: np.ndarray | None = None, shufflers: list[bytes] = ()) -> np.ndarray:
    """Seal each row of an (M, L) uint8 array; returns (M, record_len(L, layers)) uint8.

    ``report_ids`` (M, 16) uint8: the sender's own ids (retries re-send the same ones);
    None draws 16 random bytes per report.
    """
    payloads = np.ascontiguousarray(payloads)
    if payloads.dtype != np.uint8 or payloads.ndim != 2:
        raise ValueError("payloads must be an (M, L) uint8 array, one message per row")
    m, length = payloads.shape
    if report_ids is None:
        report_ids = np.frombuffer(os.urandom(REPORT_ID_LEN * m), np.uint8).reshape(m, -1)
    report_ids = np.ascontiguousarray(report_ids, np.uint8)
    if report_ids.shape != (m, REPORT_ID_LEN):
        raise ValueError(f"report_ids must be ({m}, {REPORT_ID_LEN}) uint8, got {report_ids.shape}")
    server = public_key(server)
    hops = [public_key(k) for k in shufflers]
    out = np.empty((m, record_len(length, 1 + len(hops))), np.uint8)
    for i in range(m):
        rec = seal_report(server, payloads[i].tobytes(), spec_hash, report_ids[i].tobytes(), hops)
        out[i] = np.frombuffer(rec, np.uint8)
    return out

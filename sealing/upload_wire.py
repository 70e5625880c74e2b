"""The upload protocol's bytes (docs/wire-format.md, "Upload protocol"): no key, no I/O.

Holders, the shuffler service and the operator all speak it, so it lives in
:mod:`sealing` beside the report format. A holder signs each report with its own Ed25519
key over ``label | spec hash | report id | SHA-256(report)`` (the first two read from the
report's clear header), so the service can refuse an unregistered or forged sender before
it spends any HPKE work; the operator fetches the released batch with a signature over the
spec hash and the current time. Everything here is encoding and decoding; signing takes
the signer's ``sign`` function, as :func:`sealing.round_spec.sign` does.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Callable, Iterator, NamedTuple

from sealing.hpke_report import HEADER_LEN, REPORT_ID_LEN, SPEC_HASH_LEN

UPLOAD_MAGIC = b"RKNNUPLD"
BATCH_MAGIC = b"RKNNBTCH"
PROTOCOL_VERSION = 1
KEY_ID_LEN = 32                    # a holder's raw Ed25519 public key is its key id
SIGNATURE_LEN = 64
UPLOAD_LABEL = b"rknn-ray upload\x00"           # 16 bytes
BATCH_LABEL = b"rknn-ray batch request\x00"     # 23 bytes
CLOSE_LABEL = b"rknn-ray close window\x00"      # 22 bytes
MAX_ENTRIES = 10_000               # per request
MAX_REPORT = 1 << 20               # bytes of one report
MAX_BODY = 16 << 20                # bytes of one request body
UPLOAD_HEAD = len(UPLOAD_MAGIC) + 1 + 4                         # magic | version | count
ENTRY_HEAD = KEY_ID_LEN + SIGNATURE_LEN + 4                     # key id | signature | length
BATCH_HEAD = len(BATCH_MAGIC) + 1 + SPEC_HASH_LEN + 1 + 4 + 8   # 54
BATCH_SKEW_S = 300                 # a batch request's time may differ this much from the service's

#: per-report answers (docs/wire-format.md lists them in the order the service checks)
CODES = ("accepted", "duplicate", "malformed", "unknown_key", "bad_signature", "wrong_spec",
         "too_early", "too_late", "over_allowance", "tampered")
SUCCESS = ("accepted", "duplicate")       # a holder stops retrying on either


class WireError(ValueError):
    """A request or batch whose framing is wrong (one line: what, and where)."""


class Entry(NamedTuple):
    """One report of an upload request, with its sender's key id and signature."""
    key_id: bytes
    signature: bytes
    report: bytes


def signed_message(report: bytes) -> bytes:
    """What a holder signs for one report: label | spec hash | report id | SHA-256(report)."""
    report = bytes(report)
    if len(report) < HEADER_LEN:
        raise WireError(f"a report has at least {HEADER_LEN} bytes (its header), got {len(report)}")
    return UPLOAD_LABEL + report[2:2 + SPEC_HASH_LEN + REPORT_ID_LEN] + hashlib.sha256(report).digest()


def sign_entry(key_id: bytes, sign: Callable[[bytes], bytes], report: bytes) -> Entry:
    """An entry for ``report`` signed by ``sign`` (the holder key's ``sign``)."""
    signature = sign(signed_message(report))
    if len(key_id) != KEY_ID_LEN or len(signature) != SIGNATURE_LEN:
        raise WireError(f"a key id is {KEY_ID_LEN} bytes and an Ed25519 signature "
                        f"{SIGNATURE_LEN}, got {len(key_id)} and {len(signature)}")
    return Entry(bytes(key_id), bytes(signature), bytes(report))


def encode_upload(entries: list[Entry]) -> bytes:
    """The body of ``POST /reports``: magic | version | u32le count | entries."""
    if not 1 <= len(entries) <= MAX_ENTRIES:
        raise WireError(f"an upload carries 1..{MAX_ENTRIES} reports, got {len(entries)}")
    parts = [UPLOAD_MAGIC, bytes([PROTOCOL_VERSION]), struct.pack("<I", len(entries))]
    for e in entries:
        if len(e.key_id) != KEY_ID_LEN or len(e.signature) != SIGNATURE_LEN:
            raise WireError(f"a key id is {KEY_ID_LEN} bytes and a signature {SIGNATURE_LEN}, "
                            f"got {len(e.key_id)} and {len(e.signature)}")
        parts += [e.key_id, e.signature, struct.pack("<I", len(e.report)), e.report]
    return b"".join(parts)


def decode_upload(body: bytes) -> list[Entry]:
    """The entries of a request body; WireError unless it is framed exactly."""
    body = memoryview(bytes(body))
    if len(body) < UPLOAD_HEAD or bytes(body[:8]) != UPLOAD_MAGIC:
        raise WireError("not an upload (magic bytes RKNNUPLD missing)")
    if body[8] != PROTOCOL_VERSION:
        raise WireError(f"upload protocol version {body[8]}, this service speaks {PROTOCOL_VERSION}")
    (count,) = struct.unpack_from("<I", body, 9)
    if not 1 <= count <= MAX_ENTRIES:
        raise WireError(f"an upload carries 1..{MAX_ENTRIES} reports, got {count}")
    entries, at = [], UPLOAD_HEAD
    for i in range(count):
        if at + ENTRY_HEAD > len(body):
            raise WireError(f"upload truncated in entry {i} of {count}")
        key_id = bytes(body[at:at + KEY_ID_LEN])
        signature = bytes(body[at + KEY_ID_LEN:at + KEY_ID_LEN + SIGNATURE_LEN])
        (n,) = struct.unpack_from("<I", body, at + KEY_ID_LEN + SIGNATURE_LEN)
        at += ENTRY_HEAD
        if n > MAX_REPORT or at + n > len(body):
            raise WireError(f"upload truncated or oversized in entry {i} of {count} "
                            f"(report length {n})")
        entries.append(Entry(key_id, signature, bytes(body[at:at + n])))
        at += n
    if at != len(body):
        raise WireError(f"{len(body) - at} bytes after the last of {count} entries")
    return entries


def batch_request_message(spec_hash: bytes, unix_time: int) -> bytes:
    """What the operator signs to fetch the batch: label | spec hash | u64le unix seconds."""
    if len(spec_hash) != SPEC_HASH_LEN:
        raise WireError(f"a spec hash is {SPEC_HASH_LEN} bytes, got {len(spec_hash)}")
    return BATCH_LABEL + bytes(spec_hash) + struct.pack("<Q", int(unix_time))


def close_request_message(spec_hash: bytes, unix_time: int) -> bytes:
    """What the operator signs to close the upload window early: label | spec hash | u64le
    unix seconds (a batch request's signature cannot be replayed as a close, nor back)."""
    if len(spec_hash) != SPEC_HASH_LEN:
        raise WireError(f"a spec hash is {SPEC_HASH_LEN} bytes, got {len(spec_hash)}")
    return CLOSE_LABEL + bytes(spec_hash) + struct.pack("<Q", int(unix_time))


def batch_header(spec_hash: bytes, layer: int, record_len: int, count: int) -> bytes:
    """The 54 bytes before a batch's records."""
    return (BATCH_MAGIC + bytes([PROTOCOL_VERSION]) + bytes(spec_hash) + bytes([layer])
            + struct.pack("<IQ", record_len, count))


class BatchHeader(NamedTuple):
    spec_hash: bytes
    layer: int
    record_len: int
    count: int


def parse_batch_header(head: bytes) -> BatchHeader:
    """The header of a released batch; WireError unless it is one."""
    if len(head) != BATCH_HEAD or head[:8] != BATCH_MAGIC or head[8] != PROTOCOL_VERSION:
        raise WireError("not a released batch (magic bytes RKNNBTCH and version 1 expected)")
    record_len, count = struct.unpack_from("<IQ", head, 42)
    return BatchHeader(bytes(head[9:41]), head[41], record_len, count)


def read_batch(read: Callable[[int], bytes]) -> tuple[BatchHeader, Iterator[bytes]]:
    """A batch from a stream's ``read(n)``: its header, then an iterator over its records
    (WireError if the stream ends early or a record has another length)."""
    header = parse_batch_header(_exactly(read, BATCH_HEAD))

    def records() -> Iterator[bytes]:
        for i in range(header.count):
            (n,) = struct.unpack("<I", _exactly(read, 4))
            if n != header.record_len:
                raise WireError(f"batch record {i} is {n} bytes, the header says {header.record_len}")
            yield _exactly(read, n)
        if read(1):
            raise WireError(f"bytes after the {header.count} records the batch header announced")
    return header, records()


def _exactly(read: Callable[[int], bytes], n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = read(n - len(out))
        if not chunk:
            raise WireError(f"batch stream ended early ({len(out)} of {n} bytes of a field)")
        out += chunk
    return out

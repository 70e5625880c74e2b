"""Sealed reports: the round context, the wire format, and sealing.

Only a recipient's *public* key is needed here: clients seal, nobody opens.
Opening lives with the key holders (:mod:`server.opening` for the server,
:mod:`shuffler.layers` for a shuffler's own layer), both built on
:mod:`sealing.unseal`; nothing in this module can open a report.

Each report is hybrid public-key encryption (ephemeral X25519, a BLAKE2b key derivation,
ChaCha20-Poly1305) of one fixed-length message, laid out as::

    header (clear, 46 bytes)                      | sealed (16 + 2 + pad_to + 16 bytes)
    version u8 | layer u8 | job tag 8 | round u32 | eph pub 32 | AEAD(report id 16 | len u16 | payload | zeros)

The header says which job / round / layer the report is for, so a recipient
can tell a report from another round (header mismatch) from a tampered one
(header matches, tag fails). The header is also part of the AEAD associated
data (with the full SHA-256 of the job id), so editing it breaks the tag.
Every plaintext is padded to ``pad_to`` bytes: all ciphertexts of a round have
one length, which reveals nothing about the content.

The *report id* inside the plaintext is the report's identity: a client derives it
from its secret and (job, round, batch, message) with a PRF, so a retried or
restarted client re-sends the same id even though every sealing uses a fresh
ephemeral key, and the server counts the report once. To anyone without the
client's secret the id is uniformly random: it links nothing across reports or
rounds. Without ids (``report_ids=None``) each report gets 16 fresh random bytes.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from sealing.encapsulation import (CHUNK as SEAL_CHUNK, KDF_LABEL, KEY_LEN, EncapsulationPool,
                                   derive_key, encapsulate, layer_info, recipient_key)

TAG_LEN = 16                  # Poly1305 tag
ID_LEN = 16                   # report identity, first field of the plaintext
LEN_PREFIX = 2                # u16 payload length inside the plaintext
PLAIN_HEAD = ID_LEN + LEN_PREFIX
JOB_TAG_LEN = 8
HEADER_LEN = 1 + 1 + JOB_TAG_LEN + 4 + KEY_LEN   # 46
CONTEXT_LEN = HEADER_LEN - KEY_LEN               # version, layer, job tag, round
SERVER_LAYER = 0
MAX_PAYLOAD = 2 ** 16 - 1
NONCE = bytes(12)             # each AEAD key is used exactly once, so a fixed nonce is safe
WIRE_VERSION = 2              # 2: BLAKE2b key derivation (1: HKDF-SHA256); in every header


@dataclass(frozen=True)
class RoundContext:
    """What a report is bound to: a job, a round in it, and the protocol version."""
    job_id: str
    round_id: int
    version: int = WIRE_VERSION

    def __post_init__(self):
        if not isinstance(self.job_id, str) or not self.job_id:
            raise ValueError("job_id must be a non-empty string (e.g. the run's uuid)")
        if not 0 <= int(self.round_id) < 2 ** 32:
            raise ValueError(f"round_id must be in [0, 2**32), got {self.round_id}")
        if not 1 <= int(self.version) <= 255:
            raise ValueError(f"version must be in [1, 255], got {self.version}")

    @property
    def job_digest(self) -> bytes:
        """SHA-256 of the job id: bound in full as associated data."""
        return hashlib.sha256(b"rknn-ray job\x00" + self.job_id.encode()).digest()

    def header_prefix(self, layer: int = SERVER_LAYER) -> bytes:
        """The clear header without the ephemeral key (version, layer, job tag, round)."""
        if not 0 <= layer <= 255:
            raise ValueError(f"layer must be in [0, 255], got {layer}")
        return (bytes([self.version, layer]) + self.job_digest[:JOB_TAG_LEN]
                + int(self.round_id).to_bytes(4, "big"))


def ciphertext_len(pad_to: int) -> int:
    """Length of one sealed report whose payloads are padded to ``pad_to`` bytes."""
    return HEADER_LEN + PLAIN_HEAD + pad_to + TAG_LEN


def report_ids_from_key(key: bytes, count: int) -> np.ndarray:
    """``count`` pseudorandom 16-byte report ids: the ChaCha20 keystream of a 32-byte key.

    The key is a PRF output of the client's secret and (job, round, batch), so the
    same batch always gets the same ids (see the module docstring).
    """
    if len(key) != 32:
        raise ValueError(f"a report-id key is 32 bytes, got {len(key)}")
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(ID_LEN * count)), np.uint8).reshape(count, ID_LEN)


def _padded_plaintexts(payloads: np.ndarray, pad_to: int | None,
                       report_ids: np.ndarray | None = None) -> np.ndarray:
    """(M, 18 + pad_to) rows: report id, u16 big-endian length, payload, zeros (numpy, no per-row loop)."""
    payloads = np.ascontiguousarray(payloads)
    if payloads.dtype != np.uint8 or payloads.ndim != 2:
        raise ValueError("payloads must be an (M, L) uint8 array, one fixed-length message per row")
    m, length = payloads.shape
    pad_to = length if pad_to is None else int(pad_to)
    if pad_to < length:
        raise ValueError(f"pad_to={pad_to} is shorter than the messages ({length} bytes); "
                         f"set pad_to >= {length}")
    if pad_to > MAX_PAYLOAD:
        raise ValueError(f"pad_to={pad_to} exceeds {MAX_PAYLOAD} bytes; split the message")
    if report_ids is None:
        report_ids = np.frombuffer(os.urandom(ID_LEN * m), np.uint8).reshape(m, ID_LEN)
    report_ids = np.asarray(report_ids, np.uint8)
    if report_ids.shape != (m, ID_LEN):
        raise ValueError(f"report_ids must be ({m}, {ID_LEN}) uint8, got {report_ids.shape}")
    plain = np.zeros((m, PLAIN_HEAD + pad_to), np.uint8)
    plain[:, :ID_LEN] = report_ids
    plain[:, ID_LEN], plain[:, ID_LEN + 1] = length >> 8, length & 0xFF
    plain[:, PLAIN_HEAD:PLAIN_HEAD + length] = payloads
    return plain


def seal_batch(server_public_key: bytes, payloads: np.ndarray, ctx: RoundContext,
               pad_to: int | None = None, *, layer: int = SERVER_LAYER,
               report_ids: np.ndarray | None = None,
               pool: EncapsulationPool | None = None) -> np.ndarray:
    """Seal each row of ``payloads`` for the holder of ``server_public_key``.

    Returns an (M, ciphertext_len(pad_to)) uint8 array, one report per row.
    ``layer`` is 0 for the server; onion layers for shufflers use 1, 2, ...
    (see :func:`shuffler.layers.seal_onion`). Each report gets its own encapsulation:
    from ``pool`` when one was made ahead (each handed out once), else made here
    (:mod:`sealing.encapsulation`). The loops are the bare cryptography, one primitive
    at a time; padding and assembly are numpy.
    """
    pub_obj, pub_bytes = recipient_key(server_public_key)
    plain = _padded_plaintexts(payloads, pad_to, report_ids)
    m, plen = plain.shape
    prefix = ctx.header_prefix(layer)
    aad_head = ctx.job_digest + prefix
    info = layer_info(prefix)
    plain_bytes = memoryview(plain.tobytes())
    if pool is not None:
        eph_pubs, keys = pool.take(pub_bytes, info, m)
    else:
        eph_pubs, keys = encapsulate(pub_obj, m, info)
    aead = ChaCha20Poly1305
    sealed = [aead(key).encrypt(NONCE, plain_bytes[i * plen:(i + 1) * plen], aad_head + eph_pub)
              for i, key, eph_pub in zip(range(m), keys, eph_pubs)]
    del keys
    out = np.empty((m, HEADER_LEN + plen + TAG_LEN), np.uint8)
    out[:, :CONTEXT_LEN] = np.frombuffer(prefix, np.uint8)
    if m:
        out[:, CONTEXT_LEN:HEADER_LEN] = np.frombuffer(b"".join(eph_pubs), np.uint8).reshape(m, KEY_LEN)
        out[:, HEADER_LEN:] = np.frombuffer(b"".join(sealed), np.uint8).reshape(m, plen + TAG_LEN)
    return out


def crypto_floor_seconds(num_messages: int, payload_len: int, sample: int = 2000) -> float:
    """Seconds the bare primitives need to seal ``num_messages`` reports, measured here.

    Times ``min(sample, num_messages)`` iterations of exactly the per-message work
    (X25519 key generation + exchange, key derivation, ChaCha20-Poly1305) with no
    framing, and scales linearly: the floor any sealing implementation pays.
    The clock is this thread's CPU time, so other load on a shared machine does
    not inflate the floor (compare it with CPU time, or wall time on an idle core).
    """
    if num_messages <= 0:
        return 0.0
    n = max(1, min(int(sample), int(num_messages)))
    recipient = X25519PrivateKey.generate().public_key()
    recipient_bytes = recipient.public_bytes_raw()
    plain = os.urandom(PLAIN_HEAD + payload_len)
    aad = bytes(32 + HEADER_LEN)
    t0 = time.thread_time()
    for _ in range(n):
        eph = X25519PrivateKey.generate()
        eph_pub = eph.public_key().public_bytes_raw()
        key = derive_key(eph.exchange(recipient), eph_pub, recipient_bytes, KDF_LABEL)
        ChaCha20Poly1305(key).encrypt(NONCE, plain, aad)
    return (time.thread_time() - t0) * num_messages / n


# ----------------------------------------------------------------------------- Arrow

def to_arrow(ciphertexts: np.ndarray, senders: np.ndarray | None = None) -> pa.RecordBatch:
    """Reports as an Arrow batch: ``sender`` int64 (when given) and ``report`` fixed_size_binary."""
    ct = np.ascontiguousarray(ciphertexts, dtype=np.uint8)
    if ct.ndim != 2:
        raise ValueError("ciphertexts must be an (M, L_ct) uint8 array")
    m, width = ct.shape
    report = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), m, [None, pa.py_buffer(ct)])
    if senders is None:
        return pa.RecordBatch.from_arrays([report], names=["report"])
    senders = np.asarray(senders, np.int64)
    if senders.shape != (m,):
        raise ValueError(f"one sender id per report: got {senders.shape} for {m} reports")
    return pa.RecordBatch.from_arrays([numeric_array(senders, pa.int64()), report],
                                      names=["sender", "report"])


_INTEGER_TYPES = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32,
                  pa.int64(): np.int64, pa.uint8(): np.uint8, pa.uint16(): np.uint16,
                  pa.uint32(): np.uint32, pa.uint64(): np.uint64}


def numeric_array(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
    """An Arrow integer array over ``values``' bytes. Not ``pa.array``, nor ``to_numpy``
    below: both import pandas, once in every actor of a round."""
    values = np.ascontiguousarray(values, _INTEGER_TYPES[arrow_type])
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def integer_column(col: pa.Array, name: str) -> np.ndarray:
    """The values of an integer column without nulls, zero-copy (ValueError otherwise)."""
    dtype = _INTEGER_TYPES.get(col.type)
    if dtype is None:
        raise ValueError(f"'{name}' must be an integer column, got {col.type}")
    if col.null_count:
        raise ValueError(f"'{name}' has {col.null_count} nulls")
    buf = col.buffers()[1]
    if buf is None or not len(col):
        return np.zeros(0, dtype)
    return np.frombuffer(buf, dtype, count=len(col), offset=col.offset * np.dtype(dtype).itemsize)


def from_arrow(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray | None]:
    """``(ciphertexts (M, L_ct) uint8, senders (M,) int64 or None)``; zero-copy where possible."""
    if "report" not in batch.schema.names:
        raise ValueError(f"an Arrow batch of reports needs a 'report' column; got {batch.schema.names}")
    col = batch.column("report")
    if not pa.types.is_fixed_size_binary(col.type):
        raise ValueError(f"'report' must be fixed_size_binary (one length per round), got {col.type}")
    if col.null_count:
        raise ValueError(f"'report' has {col.null_count} nulls; send only sealed reports")
    width, m = col.type.byte_width, len(col)
    buf = col.buffers()[1]
    flat = np.frombuffer(buf, np.uint8) if buf is not None else np.zeros(0, np.uint8)
    ct = flat[col.offset * width:(col.offset + m) * width].reshape(m, width)
    senders = None
    if "sender" in batch.schema.names:
        s = batch.column("sender")
        if s.null_count:
            raise ValueError("'sender' has nulls; every report needs its sender id")
        senders = integer_column(s, "sender").astype(np.int64, copy=False)
    return ct, senders

"""The inverse of sealing, for whoever holds a private key (server or onion layer).

No key lives here: a key holder passes its ``exchange`` function, so this module
can be shared by :mod:`server.opening` (server layer) and :mod:`shuffler.layers`
(a shuffler's own layer) without either importing the other. The plain
shuffler pool (:mod:`shuffler.pool`) never imports it.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, NamedTuple

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

from sealing.encapsulation import derive_key, parse_public_key
from sealing.envelope import (CONTEXT_LEN, HEADER_LEN, ID_LEN, JOB_TAG_LEN, KEY_LEN, NONCE,
                               PLAIN_HEAD, SEAL_CHUNK, TAG_LEN, RoundContext, layer_info)

REJECT_KINDS = ("malformed", "wrong_job", "wrong_round", "tampered", "replayed")


class Opened(NamedTuple):
    """What :func:`open_rows` returns: the good rows and the count of bad ones by kind."""
    payloads: np.ndarray     # (M_ok, L) uint8 messages
    report_ids: np.ndarray   # (M_ok,) 'S16' report identities (see sealing.envelope)
    eph_pubs: np.ndarray     # (M_ok,) 'S32' ephemeral public keys (a byte-identical replay repeats one)
    kept: np.ndarray         # (M_ok,) row index of each in the input
    rejects: Counter


def empty_rejects() -> Counter:
    """A Counter with every reject kind present (zeros show up in reports)."""
    return Counter(dict.fromkeys(REJECT_KINDS, 0))


def open_rows(exchange: Callable[[X25519PublicKey], bytes], recipient_pub: bytes,
              rows, ctx: RoundContext, layer: int,
              payload_len: int | None = None) -> Opened:
    """Open sealed rows with a key holder's ``exchange``; reject and count, never raise.

    ``payload_len`` is the length every message of the round must declare; None
    adopts the most common declared length of this call (only for onion layers,
    whose inner length is a ciphertext's). Replay detection is the caller's (it owns the job-wide state). Classification:
    bad shape / version / layer / length / padding -> malformed; job tag differs ->
    wrong_job; round differs -> wrong_round; header matches but the tag fails -> tampered.
    """
    rejects = empty_rejects()
    try:
        rows = np.asarray(rows)
        ok_shape = rows.dtype == np.uint8 and rows.ndim == 2
    except Exception:  # noqa: BLE001 - arbitrary junk from the network is counted, not raised
        ok_shape = False
    if not ok_shape or rows.shape[1] < HEADER_LEN + PLAIN_HEAD + TAG_LEN:
        try:
            rejects["malformed"] += len(rows)
        except Exception:  # noqa: BLE001
            rejects["malformed"] += 1
        return _empty_result(payload_len, rejects)
    width = rows.shape[1]
    plen = width - HEADER_LEN - TAG_LEN
    expect = np.frombuffer(ctx.header_prefix(layer), np.uint8)
    head = rows[:, :CONTEXT_LEN]
    bad_format = (head[:, 0] != expect[0]) | (head[:, 1] != expect[1])
    job = slice(2, 2 + JOB_TAG_LEN)
    rnd = slice(2 + JOB_TAG_LEN, CONTEXT_LEN)
    wrong_job = ~bad_format & np.any(head[:, job] != expect[job], axis=1)
    wrong_round = ~bad_format & ~wrong_job & np.any(head[:, rnd] != expect[rnd], axis=1)
    rejects["malformed"] += int(bad_format.sum())
    rejects["wrong_job"] += int(wrong_job.sum())
    rejects["wrong_round"] += int(wrong_round.sum())
    candidates = np.flatnonzero(~(bad_format | wrong_job | wrong_round))

    aad_head = ctx.job_digest + ctx.header_prefix(layer)
    info = layer_info(aad_head[32:])
    data = np.ascontiguousarray(rows).tobytes()
    opened, kept = [], []
    # one primitive at a time over a chunk (as in sealing.envelope.seal_batch: ~10% less CPU)
    rows_left = candidates.tolist()
    for lo in range(0, len(rows_left), SEAL_CHUNK):
        chunk = rows_left[lo:lo + SEAL_CHUNK]
        pubs = [data[i * width + CONTEXT_LEN:i * width + HEADER_LEN] for i in chunk]
        shared = [_exchange_or_none(exchange, eph_pub) for eph_pub in pubs]
        keys = [None if secret is None else derive_key(secret, eph_pub, recipient_pub, info)
                for eph_pub, secret in zip(pubs, shared)]
        for i, eph_pub, key in zip(chunk, pubs, keys):
            if key is None:     # low-order point: all-zero shared secret, crafted input
                rejects["malformed"] += 1
                continue
            base = i * width
            try:
                opened.append(ChaCha20Poly1305(key).decrypt(NONCE, data[base + HEADER_LEN:base + width],
                                                            aad_head + eph_pub))
            except InvalidTag:
                rejects["tampered"] += 1
                continue
            kept.append(i)
    if not kept:
        return _empty_result(payload_len, rejects)
    kept = np.asarray(kept, np.int64)
    plain = np.frombuffer(b"".join(opened), np.uint8).reshape(len(kept), plen)
    lengths = plain[:, ID_LEN].astype(np.int64) << 8 | plain[:, ID_LEN + 1]
    if payload_len is None:   # the round's length: the most common declared one
        values, counts = np.unique(lengths, return_counts=True)
        payload_len = int(values[np.argmax(counts)])
    good = lengths == payload_len
    if payload_len > plen - PLAIN_HEAD:
        good[:] = False
    else:
        good &= ~np.any(plain[:, PLAIN_HEAD + payload_len:], axis=1)   # padding must be zeros
    rejects["malformed"] += int((~good).sum())
    kept = kept[good]
    payloads = plain[good, PLAIN_HEAD:PLAIN_HEAD + payload_len].copy()
    ids = np.ascontiguousarray(plain[good, :ID_LEN]).view(f"S{ID_LEN}").ravel()
    eph = np.ascontiguousarray(rows[kept, CONTEXT_LEN:HEADER_LEN]).view(f"S{KEY_LEN}").ravel()
    return Opened(payloads, ids, eph, kept, rejects)


def _exchange_or_none(exchange, eph_pub: bytes) -> bytes | None:
    """The X25519 shared secret, or None for a point the library refuses (low order)."""
    try:
        return exchange(parse_public_key(eph_pub))
    except ValueError:
        return None


def _empty_result(payload_len, rejects) -> Opened:
    return Opened(np.zeros((0, payload_len or 0), np.uint8), np.zeros(0, f"S{ID_LEN}"),
                  np.zeros(0, f"S{KEY_LEN}"), np.zeros(0, np.int64), rejects)

"""Sender credentials: who may send in a round, and how many messages each may send.

The simulation's credential authority (:class:`CredentialIssuer`, held by the job
driver) has a 32-byte master key. Client shard ``i``, hosting the virtual clients with
ids in ``[lo, hi)``, receives ``shard_key = MAC(master, job | i | lo | hi)``; virtual
client ``c`` of that shard signs with ``client_key(c) = MAC(shard_key, c)``. MAC is keyed
BLAKE2b (RFC 7693's keyed mode, a PRF and MAC by design; WireGuard's MAC is its BLAKE2s
sibling): 1.3 us a tag here against HMAC-SHA256's 3.6 us, paid for every message on both
sides. Version 1 (``_DOMAIN``) used HMAC-SHA256. A shard
can therefore speak for its own clients only, and nobody but the authority and the
verifier can speak for anyone.

Every message carries three clear columns beside its sealed ``report``:

* ``sender`` (int64): the client id;
* ``seq`` (uint32): the message's number for that sender in this round, 0, 1, ...;
* ``tag`` (16 bytes): MAC(client_key, round header | sender | seq | report), a 128-bit
  BLAKE2b output, so the credential binds the exact ciphertext.

The party that sees senders -- the first shuffler in the shuffle model, the server in
the central and local models -- admits a batch with :class:`SenderAdmission`: unknown
ids (``unknown_sender``), a batch whose reports are not the round's one sealed length
(``wrong_length``: the length comes from the mechanism, never from a report), ``seq``
beyond the mechanism's per-sender allowance
(``over_limit``), a wrong tag or missing columns (``bad_credential``) and a second
message under the same (sender, seq) (``duplicate_message``: a retried client's copy,
or a second message a sender tries to slip in) are dropped and counted. Tags are checked
before duplicates, so a forged message cannot use up an honest sender's slot. The
number of *authenticated* distinct senders (at least one admitted message) is the n the
amplification uses. The shuffler forwards only the ``report`` column: the server never
learns who sent what in the shuffle model.

When more rounds of the job follow, a client's key is derived once per process and kept
(:class:`ClientKeyTable`), so the later rounds compute one MAC per message on each side,
the tag; a one-round job keeps none.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from hashlib import blake2b

import numpy as np
import pyarrow as pa

from sealing.envelope import RoundContext, from_arrow, integer_column, numeric_array
from sealing.replay import ReplayGuard

TAG_LEN = 16
CREDENTIAL_REJECT_KINDS = ("bad_credential", "unknown_sender", "over_limit", "duplicate_message",
                           "wrong_length")
_DOMAIN = b"rknn-ray/credential/v2"


def _mac(key: bytes, msg: bytes, size: int = 32) -> bytes:
    """Keyed BLAKE2b of ``msg`` (``size`` bytes out; the size is part of BLAKE2b's
    parameter block, so outputs of different sizes are unrelated)."""
    return blake2b(msg, key=key, digest_size=size).digest()


def empty_credential_rejects() -> Counter:
    return Counter(dict.fromkeys(CREDENTIAL_REJECT_KINDS, 0))


def _shard_key(master: bytes, job_id: str, shard: int, lo: int, hi: int) -> bytes:
    msg = b"%s|shard|%s|%d|%d|%d" % (_DOMAIN, job_id.encode(), shard, lo, hi)
    return _mac(master, msg)


def _client_keys(shard_keys: list[bytes], senders: np.ndarray, shards: np.ndarray) -> list[bytes]:
    """Message j's client key, MAC(shard key, "client" | sender as signed big-endian i64):
    one MAC per distinct sender, each on one slice of a prebuilt byte string."""
    ids, first, inverse = np.unique(senders, return_index=True, return_inverse=True)
    msgs = np.empty((ids.size, 14), np.uint8)
    msgs[:, :6] = np.frombuffer(b"client", np.uint8)
    msgs[:, 6:] = ids.astype(">i8").view(np.uint8).reshape(-1, 8)
    data, sh = msgs.tobytes(), shards[first].tolist()
    keys = [blake2b(data[14 * j:14 * j + 14], key=shard_keys[sh[j]], digest_size=32).digest()
            for j in range(ids.size)]
    return [keys[j] for j in inverse.ravel().tolist()]


TABLE_MAX_CLIENTS = 1 << 21      # a key table per id range up to this size (33 bytes a client)
TABLES_KEPT = 4                  # tables per process (a job's one verifier or credential, spare)


class ClientKeyTable:
    """The client keys of one id range ``[lo, hi)``, each derived at its first use and kept.

    A client's key depends only on the job's keys and its id, so every later round of the
    job reuses it: a warm round pays one MAC per message (the tag), not two. It holds what
    its owner (the shard's key, the verifier's master) can derive anyway.
    """

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = int(lo), int(hi)
        self._keys = np.zeros((self.hi - self.lo, 32), np.uint8)
        self._known = np.zeros(self.hi - self.lo, bool)

    def keys(self, shard_keys: list[bytes], senders: np.ndarray, shards: np.ndarray) -> list[bytes]:
        """:func:`_client_keys` for ``senders`` (all in ``[lo, hi)``), from the table where known."""
        idx = np.asarray(senders, np.int64) - self.lo
        new = np.flatnonzero(~self._known[idx])
        if new.size:
            fresh = new.size == idx.size          # a first round: every key is new, kept as made
            made = (_client_keys(shard_keys, np.asarray(senders), np.asarray(shards)) if fresh
                    else _client_keys(shard_keys, np.asarray(senders)[new], np.asarray(shards)[new]))
            self._keys[idx[new]] = np.frombuffer(b"".join(made), np.uint8).reshape(-1, 32)
            self._known[idx[new]] = True
            if fresh:
                return made
        flat = self._keys[idx].tobytes()
        return [flat[32 * j:32 * j + 32] for j in range(idx.size)]


_TABLES: dict = {}


def _key_table(owner, lo: int, hi: int, create: bool = True) -> ClientKeyTable | None:
    """This process's table for ``owner`` (a ShardCredential or SenderVerifier: equal owners
    share one, so a verifier unpickled anew every round finds the last round's keys). None
    for a range over TABLE_MAX_CLIENTS, and, unless ``create`` (more rounds follow), where
    no earlier round made one: a one-round job has no reuse to pay for."""
    if hi - lo > TABLE_MAX_CLIENTS or hi <= lo:
        return None
    table = _TABLES.pop(owner, None)
    if table is None:
        if not create:
            return None
        table = ClientKeyTable(lo, hi)
    _TABLES[owner] = table                       # most recently used last
    while len(_TABLES) > TABLES_KEPT:
        _TABLES.pop(next(iter(_TABLES)))
    return table


def _tag_prefix(ctx: RoundContext) -> bytes:
    return _DOMAIN + ctx.job_digest + int(ctx.round_id).to_bytes(4, "big")


def _tags(keys: list[bytes], prefix: bytes, senders: np.ndarray, seqs: np.ndarray,
          reports: np.ndarray) -> np.ndarray:
    """(M, 16) uint8 tags; ``keys[j]`` is message j's client key. Every tagged message
    (prefix | sender | seq | report) is a row of one numpy array, so each MAC takes one
    slice: no per-message concatenation or numpy object."""
    m = len(keys)
    rows = np.ascontiguousarray(reports, np.uint8).reshape(m, -1)
    head = len(prefix)
    width = head + 12 + rows.shape[1]
    msgs = np.empty((m, width), np.uint8)
    msgs[:, :head] = np.frombuffer(prefix, np.uint8)
    msgs[:, head:head + 8] = np.asarray(senders).astype(">i8").view(np.uint8).reshape(m, 8)
    msgs[:, head + 8:head + 12] = np.asarray(seqs).astype(">u4").view(np.uint8).reshape(m, 4)
    msgs[:, head + 12:] = rows
    data = msgs.tobytes()
    tags = [blake2b(data[width * j:width * (j + 1)], key=key, digest_size=TAG_LEN).digest()
            for j, key in enumerate(keys)]
    return np.frombuffer(b"".join(tags), np.uint8).reshape(m, TAG_LEN)


def sequence_numbers(senders: np.ndarray) -> np.ndarray:
    """0, 1, 2, ... per sender, in the order the messages appear."""
    senders = np.asarray(senders, np.int64)
    order = np.argsort(senders, kind="stable")
    s = senders[order]
    starts = np.r_[0, np.flatnonzero(np.diff(s)) + 1] if s.size else np.zeros(0, np.int64)
    run_start = np.repeat(starts, np.diff(np.r_[starts, s.size]))
    seq = np.empty(senders.size, np.int64)
    seq[order] = np.arange(s.size) - run_start
    return seq.astype(np.uint32)


@dataclass(frozen=True)
class ShardCredential:
    """What one client shard holds: the key for its client-id range (never the master)."""
    job_id: str
    shard: int
    lo: int
    hi: int
    key: bytes

    def sign(self, ctx: RoundContext, senders: np.ndarray, reports: np.ndarray,
             keep: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(seq uint32, tags (M, 16) uint8) for messages of this shard's clients; ``keep``:
        more rounds follow, keep the client keys for them (:class:`ClientKeyTable`)."""
        senders = np.asarray(senders, np.int64)
        if senders.size and (senders.min() < self.lo or senders.max() >= self.hi):
            raise ValueError(f"shard {self.shard} holds credentials for clients [{self.lo}, "
                             f"{self.hi}) only")
        seqs = sequence_numbers(senders)
        zeros = np.zeros(senders.size, np.int64)
        table = _key_table(self, self.lo, self.hi, create=keep)
        keys = (table.keys([self.key], senders, zeros) if table is not None
                else _client_keys([self.key], senders, zeros))
        return seqs, _tags(keys, _tag_prefix(ctx), senders, seqs, reports)


def with_credentials(batch: pa.RecordBatch, seqs: np.ndarray, tags: np.ndarray) -> pa.RecordBatch:
    """Add the ``seq`` and ``tag`` columns to a ``sender`` + ``report`` batch."""
    tags = np.ascontiguousarray(tags, np.uint8)
    tag_col = pa.FixedSizeBinaryArray.from_buffers(pa.binary(TAG_LEN), len(tags),
                                                   [None, pa.py_buffer(tags)])
    return pa.RecordBatch.from_arrays([*batch.columns, numeric_array(seqs, pa.uint32()), tag_col],
                                      names=[*batch.schema.names, "seq", "tag"])


class CredentialIssuer:
    """The simulation's credential authority: issues shard keys, builds verifiers."""

    def __init__(self, job_id: str, master: bytes | None = None):
        self.job_id = job_id
        self._master = master if master is not None else os.urandom(32)
        if len(self._master) != 32:
            raise ValueError("the credential master key has 32 bytes")

    def shard_credential(self, shard: int, lo: int, hi: int) -> ShardCredential:
        return ShardCredential(self.job_id, int(shard), int(lo), int(hi),
                               _shard_key(self._master, self.job_id, shard, lo, hi))

    def verifier(self, ranges: list[tuple[int, int]]) -> "SenderVerifier":
        """A verifier for shards 0..len(ranges)-1 with these client-id ranges."""
        return SenderVerifier(self.job_id, self._master, tuple((int(a), int(b)) for a, b in ranges))


@dataclass(frozen=True)
class SenderVerifier:
    """Checks tags for any client of the job (held by the party that sees senders)."""
    job_id: str
    master: bytes
    ranges: tuple[tuple[int, int], ...]

    def __post_init__(self):
        los = [a for a, _ in self.ranges]
        if los != sorted(los) or any(a > b for a, b in self.ranges):
            raise ValueError("shard ranges must be ordered, non-overlapping [lo, hi) pairs")

    def shard_of(self, senders: np.ndarray) -> np.ndarray:
        """Shard index per sender, -1 for an id no shard hosts."""
        lo = np.array([a for a, _ in self.ranges], np.int64)
        hi = np.array([b for _, b in self.ranges], np.int64)
        idx = np.searchsorted(lo, senders, side="right") - 1
        ok = (idx >= 0) & (senders < hi[np.clip(idx, 0, None)]) if lo.size else \
            np.zeros(senders.size, bool)
        return np.where(ok, idx, -1)

    def valid(self, ctx: RoundContext, senders: np.ndarray, seqs: np.ndarray,
              reports: np.ndarray, tags: np.ndarray, shards: np.ndarray,
              keep: bool = False) -> np.ndarray:
        """Mask of messages whose tag is right (``shards`` from :meth:`shard_of`, all >= 0);
        ``keep``: more rounds follow, keep the client keys for them."""
        shard_keys = [_shard_key(self.master, self.job_id, i, a, b)
                      for i, (a, b) in enumerate(self.ranges)]
        senders = np.asarray(senders, np.int64)
        lo = min((a for a, _ in self.ranges), default=0)
        table = _key_table(self, lo, max((b for _, b in self.ranges), default=0), create=keep)
        keys = (table.keys(shard_keys, senders, np.asarray(shards)) if table is not None
                else _client_keys(shard_keys, senders, np.asarray(shards)))
        want = _tags(keys, _tag_prefix(ctx), senders, seqs, reports)
        return np.all(want == tags, axis=1)    # all 16 bytes of every row: no early exit


class SenderAdmission:
    """One round's admission at the party that sees senders (see module docstring)."""

    def __init__(self, verifier: SenderVerifier, ctx: RoundContext, allowance: int,
                 report_width: int | None = None, keep_keys: bool = False):
        if int(allowance) < 1:
            raise ValueError(f"the per-sender allowance must be >= 1 message, got {allowance}")
        self.verifier, self.ctx, self.allowance = verifier, ctx, int(allowance)
        self.report_width = None if report_width is None else int(report_width)
        self.keep_keys = bool(keep_keys)       # more rounds follow: keep the client keys
        self._slots = ReplayGuard(12)          # (sender, seq) admitted so far
        self._senders = ReplayGuard(8)         # senders with at least one admitted message
        self.authenticated_senders = 0
        self.admitted = 0
        self.rejected = empty_credential_rejects()

    def admit(self, batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray, Counter]:
        """(reports (M', L) uint8, senders (M',), this batch's rejects) of the admitted messages."""
        rejects = empty_credential_rejects()
        try:
            reports, senders = from_arrow(batch)
            seqs, tags = _credential_columns(batch)
            if senders is None:
                raise ValueError("no sender column")
        except Exception:  # noqa: BLE001 - an unreadable batch is counted, never fatal
            rejects["bad_credential"] += _rows(batch)
            return self._nothing(rejects)
        if self.report_width is not None and reports.shape[1] != self.report_width:
            rejects["wrong_length"] += len(senders)
            return self._nothing(rejects)
        keep = np.ones(len(senders), bool)
        shards = self.verifier.shard_of(senders)
        unknown = shards < 0
        rejects["unknown_sender"] += int(unknown.sum())
        over = ~unknown & (seqs >= self.allowance)
        rejects["over_limit"] += int(over.sum())
        keep &= ~unknown & ~over
        idx = np.flatnonzero(keep)
        if idx.size:
            good = self.verifier.valid(self.ctx, senders[idx], seqs[idx], reports[idx], tags[idx],
                                       shards[idx], self.keep_keys)
            rejects["bad_credential"] += int((~good).sum())
            keep[idx[~good]] = False
        idx = np.flatnonzero(keep)
        if idx.size:
            slot = np.empty((idx.size, 12), np.uint8)
            slot[:, :8] = senders[idx].astype(">i8").view(np.uint8).reshape(-1, 8)
            slot[:, 8:] = seqs[idx].astype(">u4").view(np.uint8).reshape(-1, 4)
            fresh = self._slots.fresh(slot.view("S12").ravel())
            rejects["duplicate_message"] += int((~fresh).sum())
            keep[idx[~fresh]] = False
        out_senders = senders[keep]
        if out_senders.size:
            ids = np.unique(out_senders).astype(">i8").view("S8")
            self.authenticated_senders += int(self._senders.fresh(ids).sum())
        self.admitted += int(keep.sum())
        self.rejected.update(rejects)
        return reports[keep], out_senders, rejects

    def _nothing(self, rejects: Counter):
        self.rejected.update(rejects)
        width = self.report_width or 0
        return np.zeros((0, width), np.uint8), np.zeros(0, np.int64), rejects

    def stats(self) -> dict:
        return {"authenticated_senders": self.authenticated_senders, "admitted": self.admitted,
                "allowance_per_sender": self.allowance, "rejected": dict(self.rejected)}


def _rows(batch) -> int:
    """Rows of something that arrived as a batch (1 for anything that is not a table)."""
    try:
        return int(batch.num_rows)
    except Exception:  # noqa: BLE001
        return 1


def _credential_columns(batch: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    names = batch.schema.names
    if "seq" not in names or "tag" not in names:
        raise ValueError("no credential columns")
    seq_col, tag_col = batch.column("seq"), batch.column("tag")
    if seq_col.null_count or tag_col.null_count or not pa.types.is_fixed_size_binary(tag_col.type) \
            or tag_col.type.byte_width != TAG_LEN:
        raise ValueError("malformed credential columns")
    seqs = integer_column(seq_col, "seq").astype(np.int64)
    if seqs.size and seqs.min() < 0:
        raise ValueError("negative seq")
    buf = tag_col.buffers()[1]
    flat = np.frombuffer(buf, np.uint8)
    tags = flat[tag_col.offset * TAG_LEN:(tag_col.offset + len(tag_col)) * TAG_LEN]
    return seqs, tags.reshape(-1, TAG_LEN)

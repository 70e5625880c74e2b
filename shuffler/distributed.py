"""A secure shuffle that outgrows one process: sort by random keys across the cluster.

Every sealed message gets a 128-bit key from the OS CSPRNG (``os.urandom``, never a
seeded RNG); sorting by i.i.d. uniform keys is a uniformly random permutation. Two
keys tie with probability about n^2 / 2^129 (about 1e-25 at n = 10^7); tied keys
are ordered by fresh ``os.urandom`` keys, never by arrival order. Reports stay in
Ray's object store (which spills to disk when it is full) rather than in the
Shuffler actor's heap; only the 8-byte sender ids are gathered, to count distinct
senders for the floor, and they never leave: the sender column is dropped before
the sort, so no sorted block carries it.

The sort runs on plain Ray tasks, in two stages. *map*: one task per input batch
draws the keys and splits its rows into ``P`` buckets by the keys' top bits (keys are
uniform, so equal key ranges have equal expected sizes and no sampling pass is needed);
*reduce*: one task per bucket sorts its rows by key. Tasks ask for a fraction of a CPU,
so they run beside the protocol's actors.
"""
from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import ray

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import from_arrow, to_arrow
from shuffler.pool import round_width

KEY_BYTES = 16
TARGET_BUCKET_BYTES = 64 << 20


def _keys(m: int) -> np.ndarray:
    """(m, 2) uint64 keys (high word first) from the OS CSPRNG."""
    return np.frombuffer(os.urandom(KEY_BYTES * m), dtype=">u8").astype(np.uint64).reshape(m, 2)


def _key_order(hi: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """Rows in (hi, lo) key order; tied keys (chance ~n^2/2^129) ordered by fresh CSPRNG keys."""
    order = np.lexsort((lo, hi))
    h, l_ = hi[order], lo[order]
    if h.size > 1 and np.any((h[1:] == h[:-1]) & (l_[1:] == l_[:-1])):
        fresh = _keys(hi.size)[:, 0]
        order = np.lexsort((fresh, lo, hi))
    return order


def _bucket_bits(total_bytes: int, target_bucket_bytes: int) -> int:
    """log2 of the bucket count: buckets of about ``target_bucket_bytes`` each."""
    return max(0, math.ceil(math.log2(max(1.0, total_bytes / max(1, target_bucket_bytes)))))


def spilled_bytes() -> int | None:
    """Bytes this Ray node has spilled to disk so far (None when Ray does not say)."""
    try:
        # Ray's private API: a Ray that moved it fails only this call
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address
        reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
        return int(reply.store_stats.spilled_bytes_total)
    except Exception:   # a private API: its absence must not break a release
        return None


@ray.remote
def _key_and_split(batch, buckets: int, bits: int):
    """Map: keys for every row of one batch, rows split by the keys' top ``bits`` bits."""
    ct, _senders = from_arrow(batch)          # sender ids stay behind
    m, width = ct.shape
    keys = _keys(m)
    bucket = (keys[:, 0] >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(m, np.int64)
    order = np.argsort(bucket, kind="stable")
    cuts = np.searchsorted(bucket[order], np.arange(1, buckets))
    rows = np.empty((m, KEY_BYTES + width), np.uint8)
    rows[:, :KEY_BYTES] = keys.astype(">u8").view(np.uint8).reshape(m, KEY_BYTES)
    rows[:, KEY_BYTES:] = ct
    parts = np.split(rows[order], cuts)
    return parts[0] if buckets == 1 else tuple(parts)


@ray.remote
def _sort_bucket(width: int, *parts) -> pa.RecordBatch:
    """Reduce: one bucket's rows in key order, keys dropped: an Arrow batch of reports."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return to_arrow(np.zeros((0, width), np.uint8))
    rows = np.concatenate(parts)
    keys = rows[:, :KEY_BYTES].copy().view(">u8").astype(np.uint64)
    order = _key_order(keys[:, 0], keys[:, 1])
    return to_arrow(np.ascontiguousarray(rows[order, KEY_BYTES:]))


class DistributedShuffle:
    """One round's reports as object refs, sorted on plain Ray tasks (fractional CPUs).

    ``release()`` hands over every sorted bucket at once; ``release(first)`` only the first
    ``first`` and :meth:`more` the rest, a few at a time: a bucket is sorted when its
    consumer asks for it, so the object store holds the map outputs plus a bounded window
    of sorted buckets, never a second sorted copy of the round (which would spill).
    """

    mode = "distributed"

    def __init__(self, min_senders: int, task_cpus: float = 0.25,
                 target_bucket_bytes: int = TARGET_BUCKET_BYTES,
                 max_batch_messages: int = 65536):
        if int(min_senders) < 0:
            raise ValueError(f"min_senders must be >= 0, got {min_senders}")
        if not 0 < float(task_cpus):
            raise ValueError(f"task_cpus must be > 0, got {task_cpus}")
        if int(max_batch_messages) < 1:
            raise ValueError(f"max_batch_messages must be >= 1, got {max_batch_messages}")
        self.min_senders, self.task_cpus = int(min_senders), float(task_cpus)
        self.target_bucket_bytes = int(target_bucket_bytes)
        self.max_batch_messages = int(max_batch_messages)
        self._refs: list = []
        self._sender_ids: list[np.ndarray] = []   # only ever counted, never forwarded
        self._width: int | None = None
        self._messages = self._bytes = self._batches = self._released_batches = 0
        self._released = False
        self._n_senders: int | None = None
        self._pending: list[list] = []   # per bucket not yet sorted: its map outputs
        self.buckets = 0

    def add(self, batch_or_ref) -> int:
        """Take one Arrow batch (``sender`` int64, ``report`` fixed_size_binary) or a ref to one.

        A ref is read here only for its sender ids (zero-copy from the object store);
        its reports stay in the store. A batch passed by value is put into the store.
        """
        if self._released:
            raise ValueError("this round was already released; start a new DistributedShuffle "
                             "(Shuffler.start_round) for the next round")
        is_ref = isinstance(batch_or_ref, ray.ObjectRef)
        batch = ray.get(batch_or_ref) if is_ref else batch_or_ref
        ct, senders = from_arrow(batch)
        if senders is None:
            raise ValueError("this batch has no 'sender' column: client shards must send sender ids "
                             "so the shuffler can count distinct senders (they are dropped before "
                             "the sort)")
        m, width = ct.shape
        if m == 0:
            return 0
        self._width = round_width(self._width, width)
        self._sender_ids.append(np.array(senders, np.int64, copy=True))
        self._refs.append(batch_or_ref if is_ref else ray.put(batch))
        self._messages += m
        self._bytes += m * width
        self._batches += 1
        return m

    @property
    def num_messages(self) -> int:
        return self._messages

    @property
    def num_senders(self) -> int:
        """Distinct sender ids so far (one client may send in many batches: counted once)."""
        if self._n_senders is not None:
            return self._n_senders
        if not self._sender_ids:
            return 0
        ids = np.unique(np.concatenate(self._sender_ids))
        self._sender_ids = [ids]
        return int(ids.size)

    @property
    def released(self) -> bool:
        return self._released

    def _check_floor(self) -> None:
        n = self.num_senders
        if n < self.min_senders:
            raise PrivacyBudgetError(
                f"shuffler refused to release: {n} distinct senders, fewer than the "
                f"{self.min_senders} the privacy target needs (amplification depends on n); "
                "nothing was released. Fix: wait for more clients to report, or lower the target "
                "(larger eps / delta) so that fewer senders suffice")
        self._sender_ids, self._n_senders = [], n   # the ids have done their only job

    def release(self, first: int | None = None) -> list:
        """Check the sender floor, then sort by random keys: refs of report-only batches, in
        key order (all of them, or the first ``first``; :meth:`more` gives the rest).

        Raises :class:`PrivacyBudgetError` (nothing released) below the floor; a second
        call returns ``[]``.
        """
        if self._released:
            return []
        self._check_floor()
        if self._refs:
            self._start_sort()
        self._refs, self._released = [], True
        return self.more(first)

    def more(self, count: int | None = None) -> list:
        """The next ``count`` sorted buckets (all that are left when None); ``[]`` when done.

        Each bucket's reduce task is started here, and its map outputs are dropped from
        this process as soon as the task holds them.
        """
        if not self._released:
            raise ValueError("release() first: it checks the sender floor")
        todo = len(self._pending) if count is None else max(1, int(count))
        out = []
        while self._pending and len(out) < todo:
            parts = self._pending.pop(0)
            out.append(_sort_bucket.options(num_cpus=self.task_cpus).remote(self._width or 0,
                                                                            *parts))
        self._released_batches += len(out)
        return out

    @property
    def remaining(self) -> int:
        """Sorted buckets not handed over yet."""
        return len(self._pending)

    def stats(self) -> dict:
        """What this round's shuffler saw, for the run report (no ids, no order)."""
        return {"messages": self._messages, "senders": self.num_senders, "bytes": self._bytes,
                "batches": self._batches, "released_batches": self._released_batches,
                "buckets": self.buckets, "min_senders": self.min_senders, "mode": self.mode,
                "spilled_bytes": spilled_bytes()}

    def _start_sort(self) -> None:
        """Map every input batch (keys drawn, rows split by bucket); reduces wait for more()."""
        bits = _bucket_bits(self._bytes, self.target_bucket_bytes)
        self.buckets = buckets = 1 << bits
        maps = [_key_and_split.options(num_returns=buckets, num_cpus=self.task_cpus)
                .remote(r, buckets, bits) for r in self._refs]
        if buckets == 1:
            maps = [[m] for m in maps]
        self._pending = [[m[b] for m in maps] for b in range(buckets)]


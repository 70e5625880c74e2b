"""A secure shuffle that outgrows one process: sort by random keys across the cluster.

Every sealed message gets a 128-bit key from the OS CSPRNG (``os.urandom``); sorting
by i.i.d. uniform keys is a uniform random permutation (keys tie with probability
about n^2 / 2^129, and tied keys are redrawn, never broken by arrival order). The
sort is a two-stage distributed sort on Ray tasks:

1. *map*: one task per input batch draws the keys and splits its rows into ``P``
   buckets by the keys' top bits (keys are uniform, so equal key ranges are equal
   expected sizes: no sampling pass is needed);
2. *reduce*: one task per bucket gathers its pieces from every map output and sorts
   them by key. Bucket 0, 1, ..., P-1 in order is the whole multiset in key order.

Batches stay in Ray's object store (and spill to disk when it is full, as Ray
does) rather than in the Shuffler actor's heap; only the 8-byte sender ids are
gathered, to count distinct senders (the floor) -- they are never forwarded.
Tasks ask for a fraction of a CPU so they run beside the protocol's actors. (Ray
Data's sort would do the same job, but each of its tasks reserves a whole CPU,
which a small machine hosting the protocol's actors does not have free.)
"""
from __future__ import annotations

import os

import numpy as np
import ray

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import from_arrow, to_arrow
from shuffler.pool import round_width

KEY_BYTES = 16
TARGET_BUCKET_BYTES = 64 << 20


def _keys(m: int) -> np.ndarray:
    """(m, 2) uint64 keys (high word first) from the OS CSPRNG."""
    return np.frombuffer(os.urandom(KEY_BYTES * m), dtype=">u8").astype(np.uint64).reshape(m, 2)


@ray.remote
def _key_and_split(batch, buckets: int, bits: int):
    """Map: keys for every row of one batch, rows split by the keys' top ``bits`` bits."""
    ct, _senders = from_arrow(batch)          # sender ids stay behind
    m, width = ct.shape
    keys = _keys(m)
    bucket = (keys[:, 0] >> np.uint64(64 - bits)).astype(np.int64) if bits else np.zeros(m, np.int64)
    order = np.argsort(bucket, kind="stable")
    cuts = np.searchsorted(bucket[order], np.arange(1, buckets))
    rows = np.empty((m, 2 * 8 + width), np.uint8)
    rows[:, :16] = keys.astype(">u8").view(np.uint8).reshape(m, 16)
    rows[:, 16:] = ct
    parts = np.split(rows[order], cuts)
    return parts[0] if buckets == 1 else tuple(parts)


@ray.remote
def _sort_bucket(width: int, *parts) -> object:
    """Reduce: one bucket's rows in key order, keys dropped: an Arrow batch of reports."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return to_arrow(np.zeros((0, width), np.uint8))
    rows = np.concatenate(parts)
    keys = rows[:, :16].copy().view(">u8").astype(np.uint64)
    order = np.lexsort((keys[:, 1], keys[:, 0]))
    sk = keys[order]
    tied = np.flatnonzero(np.all(sk[1:] == sk[:-1], axis=1))
    while tied.size:                           # ~n^2/2^129: redraw, never keep arrival order
        idx = np.unique(np.concatenate([order[tied], order[tied + 1]]))
        keys[idx] = _keys(idx.size)
        order = np.lexsort((keys[:, 1], keys[:, 0]))
        sk = keys[order]
        tied = np.flatnonzero(np.all(sk[1:] == sk[:-1], axis=1))
    return to_arrow(np.ascontiguousarray(rows[order, 16:]))


class DistributedShuffle:
    """One round's reports as object refs; ``release`` returns permuted batch refs (report only)."""

    def __init__(self, min_senders: int, task_cpus: float = 0.25,
                 target_bucket_bytes: int = TARGET_BUCKET_BYTES):
        self.min_senders, self.task_cpus = int(min_senders), float(task_cpus)
        self.target_bucket_bytes = int(target_bucket_bytes)
        self._refs: list = []
        self._sender_ids: list[np.ndarray] = []
        self._width: int | None = None
        self._messages = self._bytes = 0
        self._released = False
        self._n_senders: int | None = None
        self.buckets = 0

    def add_ref(self, ref) -> int:
        """Take one batch by reference: its sender ids are read, its reports stay in the store."""
        batch = ray.get(ref)
        ct, senders = from_arrow(batch)
        if senders is None:
            raise ValueError("this batch has no 'sender' column: client shards must send sender ids "
                             "so the shuffler can count distinct senders")
        m, width = ct.shape
        if m == 0:
            return 0
        self._width = round_width(self._width, width)
        self._sender_ids.append(np.array(senders, np.int64, copy=True))
        self._refs.append(ref)
        self._messages += m
        self._bytes += m * width
        return m

    @property
    def num_messages(self) -> int:
        return self._messages

    @property
    def num_senders(self) -> int:
        if not self._sender_ids:
            return 0
        ids = np.unique(np.concatenate(self._sender_ids))
        self._sender_ids = [ids]
        return int(ids.size)

    def release(self) -> list:
        """Check the sender floor, then sort by random keys; refs of permuted batches, in order."""
        if self._released:
            return []
        n = self.num_senders
        if n < self.min_senders:
            raise PrivacyBudgetError(
                f"shuffler refused to release: {n} distinct senders, fewer than the "
                f"{self.min_senders} the privacy target needs (amplification depends on n); "
                "nothing was released. Fix: wait for more clients, or lower the target")
        self._sender_ids, self._n_senders = [], n
        bits = max(0, int(np.ceil(np.log2(max(1.0, self._bytes / self.target_bucket_bytes)))))
        self.buckets = buckets = 1 << bits
        opts = {"num_cpus": self.task_cpus}
        maps = [_key_and_split.options(num_returns=buckets, **opts).remote(r, buckets, bits)
                for r in self._refs]
        if buckets == 1:
            maps = [[m] for m in maps]
        out = [_sort_bucket.options(**opts).remote(self._width or 0, *[m[b] for m in maps])
               for b in range(buckets)]
        self._refs, self._released = [], True
        return out

    def stats(self) -> dict:
        senders = self._n_senders if self._released else self.num_senders
        return {"messages": self._messages, "senders": senders,
                "bytes": self._bytes, "batches": len(self._refs), "buckets": self.buckets,
                "min_senders": self.min_senders, "mode": "distributed"}

"""A secure shuffle that outgrows one process: sort by random keys across the cluster.

Every sealed message gets a 128-bit key from the OS CSPRNG (``os.urandom``, never a
seeded RNG); sorting by i.i.d. uniform keys is a uniformly random permutation. Two
keys tie with probability about n^2 / 2^129 (about 1e-25 at n = 10^7); tied keys
are ordered by fresh ``os.urandom`` keys, never by arrival order. Reports stay in
Ray's object store (which spills to disk when it is full) rather than in the
Shuffler actor's heap; only the 8-byte sender ids are gathered, to count distinct
senders for the floor, and they never leave: the sender column is dropped before
the sort, so no sorted block carries it.

Two engines, one contract (:class:`DistributedShuffle`, :class:`RayDataShuffle`):

* ``"tasks"``: a two-stage sort on plain Ray tasks. *map*: one task per input
  batch draws the keys and splits its rows into ``P`` buckets by the keys' top
  bits (keys are uniform, so equal key ranges have equal expected sizes and no
  sampling pass is needed); *reduce*: one task per bucket sorts its rows by key.
  Tasks ask for a fraction of a CPU, so they run beside the protocol's actors.
* ``"ray_data"``: the same plan expressed in Ray Data: ``map_batches`` attaches the
  keys (and drops senders), ``Dataset.sort`` sorts with fixed key-range boundaries
  (again no sampling pass). Ray Data's sort tasks each reserve a whole CPU (not
  configurable in Ray 2.60), so this engine refuses to start unless one is free.
"""
from __future__ import annotations

import contextlib
import logging
import math
import os
from abc import ABC, abstractmethod
import time

import numpy as np
import pyarrow as pa
import ray

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import from_arrow, to_arrow
from shuffler.pool import round_width

KEY_BYTES = 16
TARGET_BUCKET_BYTES = 64 << 20
ENGINES = ("tasks", "ray_data")


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


def _report_batches(ct: np.ndarray, max_rows: int) -> list[pa.RecordBatch]:
    """Report-only batches of at most ``max_rows`` rows, each with its own buffer."""
    return [to_arrow(ct[a:a + max_rows]) for a in range(0, len(ct), max_rows)] or [to_arrow(ct)]


# --------------------------------------------------------------- shared bookkeeping
class _DistributedRound(ABC):
    """What both engines share: input refs, distinct-sender count, the floor, stats."""

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

    add_ref = add   # the name the Shuffler actor and tests used first

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

    def take_refs(self) -> list:
        """Hand this round's input refs to another shuffle (the in-process pool); this one is done."""
        refs, self._refs, self._sender_ids, self._released = self._refs, [], [], True
        return refs

    def _check_floor(self) -> None:
        n = self.num_senders
        if n < self.min_senders:
            raise PrivacyBudgetError(
                f"shuffler refused to release: {n} distinct senders, fewer than the "
                f"{self.min_senders} the privacy target needs (amplification depends on n); "
                "nothing was released. Fix: wait for more clients to report, or lower the target "
                "(larger eps / delta) so that fewer senders suffice")
        self._sender_ids, self._n_senders = [], n   # the ids have done their only job

    def release(self) -> list:
        """Check the sender floor, then sort by random keys: refs of report-only batches, in order.

        Raises :class:`PrivacyBudgetError` (nothing released) below the floor; a second
        call returns ``[]``.
        """
        if self._released:
            return []
        self._check_floor()
        out = self._sort() if self._refs else []
        self._refs, self._released = [], True
        self._released_batches = len(out)
        return out

    @abstractmethod
    def _sort(self) -> list:
        """The engine's sort by random keys: refs of report-only batches, in key order."""

    def stats(self) -> dict:
        """What this round's shuffler saw, for the run report (no ids, no order)."""
        return {"messages": self._messages, "senders": self.num_senders, "bytes": self._bytes,
                "batches": self._batches, "released_batches": self._released_batches,
                "buckets": self.buckets, "min_senders": self.min_senders, "mode": self.mode,
                "engine": self.engine, "spilled_bytes": spilled_bytes()}


def spilled_bytes() -> int | None:
    """Bytes this Ray node has spilled to disk so far (None when Ray does not say)."""
    try:
        from ray._private.internal_api import get_memory_info_reply, get_state_from_address
        reply = get_memory_info_reply(get_state_from_address(ray.get_runtime_context().gcs_address))
        return int(reply.store_stats.spilled_bytes_total)
    except Exception:   # a private API: its absence must not break a release
        return None


# ------------------------------------------------------------------- engine: tasks
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


class DistributedShuffle(_DistributedRound):
    """One round's reports as object refs, sorted on plain Ray tasks (fractional CPUs)."""

    engine = "tasks"

    def _sort(self) -> list:
        bits = _bucket_bits(self._bytes, self.target_bucket_bytes)
        self.buckets = buckets = 1 << bits
        opts = {"num_cpus": self.task_cpus}
        maps = [_key_and_split.options(num_returns=buckets, **opts).remote(r, buckets, bits)
                for r in self._refs]
        if buckets == 1:
            maps = [[m] for m in maps]
        return [_sort_bucket.options(**opts).remote(self._width or 0, *[m[b] for m in maps])
                for b in range(buckets)]


# ---------------------------------------------------------------- engine: Ray Data
def _attach_keys(table: pa.Table) -> pa.Table:
    """Ray Data map: drop the sender ids, attach a 128-bit OS-CSPRNG key per row (two int64s)."""
    keys = np.frombuffer(os.urandom(KEY_BYTES * table.num_rows), np.int64).reshape(-1, 2)
    return pa.table({"key_hi": keys[:, 0].copy(), "key_lo": keys[:, 1].copy(),
                     "report": table.column("report")})


@ray.remote
def _finish_block(table: pa.Table, pieces: int, max_rows: int):
    """A sorted Ray Data block -> ``pieces`` report-only RecordBatches (keys dropped)."""
    report = table.column("report").combine_chunks()
    ct, _ = from_arrow(pa.RecordBatch.from_arrays([report], names=["report"]))
    hi = table.column("key_hi").to_numpy()
    lo = table.column("key_lo").to_numpy()
    ct = ct[_key_order(hi, lo)]   # already sorted; this only reorders tied keys, freshly
    out = _report_batches(ct, max_rows)
    return out[0] if pieces == 1 else tuple(out)


@contextlib.contextmanager
def quiet_ray_data(max_block_bytes: int):
    """Ray Data settings for one shuffle: no progress bars or stats on the console, output
    order kept, blocks bounded; the process's DataContext is restored afterwards."""
    from ray.data import DataContext
    ctx = DataContext.get_current()
    wanted = {"enable_progress_bars": False, "enable_auto_log_stats": False,
              "target_max_block_size": max_block_bytes}
    previous = {k: getattr(ctx, k) for k in wanted}
    previous_order = ctx.execution_options.preserve_order
    for k, v in wanted.items():
        setattr(ctx, k, v)
    ctx.execution_options.preserve_order = True
    console = [h for h in logging.getLogger("ray.data").handlers
               if not isinstance(h, logging.FileHandler)]
    levels = [h.level for h in console]
    for h in console:   # Ray Data still writes everything to its log file in the session dir
        h.setLevel(logging.ERROR)
    try:
        yield ctx
    finally:
        for k, v in previous.items():
            setattr(ctx, k, v)
        ctx.execution_options.preserve_order = previous_order
        for h, lv in zip(console, levels):
            h.setLevel(lv)


def _wait_for_free_cpu(timeout_s: float) -> float:
    """Free CPUs once one whole CPU is free (tasks that just finished return theirs within
    a moment), or after ``timeout_s``: actors holding CPUs for good would deadlock the sort."""
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources().get("CPU", 0.0)
        if free >= 1.0 or time.monotonic() > deadline:
            return free
        time.sleep(0.2)


class RayDataShuffle(_DistributedRound):
    """One round's reports as object refs, keyed by ``map_batches`` and sorted by ``Dataset.sort``."""

    engine = "ray_data"
    cpu_wait_s = 30.0

    def _sort(self) -> list:
        free = _wait_for_free_cpu(self.cpu_wait_s)
        if free < 1.0:
            raise RuntimeError(
                f"the Ray Data shuffle needs one free CPU (its sort tasks each reserve a whole "
                f"CPU) but the cluster had {free:g} free for {self.cpu_wait_s:g} s; nothing was released. Fix: use the "
                "'tasks' engine, or give the cluster a CPU the protocol's actors do not reserve")
        from ray.data import from_arrow_refs
        # at least 2 partitions: with no boundaries Ray Data would sample keys and make one
        # partition per input block (a P x P exchange; 100 x 100 took 18x longer at 1M)
        bits = max(1, _bucket_bits(self._bytes, self.target_bucket_bytes))
        self.buckets = parts = 1 << bits
        # int64 key_hi splits evenly at these values: equal expected rows per partition
        bounds = [i * (1 << 64) // parts - (1 << 63) for i in range(1, parts)]
        row_bytes = (self._width or 0) + KEY_BYTES
        with quiet_ray_data(max(row_bytes * self.max_batch_messages, 1 << 20)):
            ds = (from_arrow_refs(self._refs)
                  .map_batches(_attach_keys, batch_format="pyarrow", batch_size=None,
                               zero_copy_batch=True, num_cpus=self.task_cpus)
                  .sort(["key_hi", "key_lo"], boundaries=bounds))
            out = []
            for bundle in ds.iter_internal_ref_bundles():
                for entry in bundle.blocks:
                    rows = entry.metadata.num_rows
                    if not rows:
                        continue
                    pieces = -(-rows // self.max_batch_messages)
                    refs = _finish_block.options(num_returns=pieces, num_cpus=self.task_cpus) \
                        .remote(entry.ref, pieces, self.max_batch_messages)
                    out.extend([refs] if pieces == 1 else refs)
        return out


def make_distributed(min_senders: int, engine: str = "tasks", **kwargs) -> _DistributedRound:
    """The distributed shuffle for ``engine`` (``"tasks"`` or ``"ray_data"``)."""
    if engine == "tasks":
        return DistributedShuffle(min_senders, **kwargs)
    if engine == "ray_data":
        return RayDataShuffle(min_senders, **kwargs)
    raise ValueError(f"unknown distributed shuffle engine {engine!r}; use one of {ENGINES}")

"""Where a client shard gets its private records: a small picklable spec it opens when it starts.

A source is a Ray actor's constructor argument, kept by Ray for restarts; the shard
calls :meth:`open` when it starts and again after Ray restarts it, so a restarted
shard holds exactly the records it held before.

* :class:`PreparedShardSource` - the clients ``[lo, hi)`` of the partition the job's
  driver prepared once (:func:`rknn_ray.data.prepared.prepare_data`): only that shard's
  records, which the job session hands over through Ray's object store (``ray.put``;
  the GCS keeps only the reference). The driver holds every private record already;
  a shard now never holds another shard's clients' records, and no shard loads,
  splits or partitions the whole dataset again.
* :class:`SyntheticClientsSource` - one Gaussian-mixture record per client, made
  batch by batch from (seed, client id): ten million clients without ten million
  rows in memory (the scale benchmark).

* :class:`rknn_ray.data.table_source.TableShardSource` - the user's own table: the shard
  reads its own clients' rows where it runs (the driver never loads them).

All open to :class:`ShardRecords`-like objects with ``num_clients`` and
``batches(batch_clients)``, which yields ``(features, labels, client_ids)`` holding
whole clients, in a fixed order (a retry regenerates the same batches).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from rknn_ray.data.partition import sender_order
from rknn_ray.data.synthetic import class_means
from rknn_ray.rng import seeded_generator


@dataclass
class ShardRecords:
    """The private records of one shard, grouped by client (client ids sorted)."""
    features: np.ndarray
    labels: np.ndarray
    client_ids: np.ndarray

    def __post_init__(self):
        ids = np.asarray(self.client_ids)
        if ids.size and not bool(np.all(ids[1:] >= ids[:-1])):      # sorted already: no copy
            order = np.argsort(ids, kind="stable")
            self.features, self.labels = self.features[order], self.labels[order]
            ids = ids[order]
        self.client_ids = ids = np.asarray(ids, np.int64)
        # np.unique(ids, return_index=True) of sorted ids, without its sorted copies (a
        # shard's open peaks here at 1e7 records, issue 46)
        self._start = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]]) if ids.size else \
            np.zeros(0, np.int64)
        self._ids = ids[self._start]

    @property
    def num_clients(self) -> int:
        return int(self._ids.size)

    @property
    def max_records_per_client(self) -> int:
        return int(np.diff(np.append(self._start, self.client_ids.size)).max(initial=0))

    def batches(self, batch_clients: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        ends = np.append(self._start, self.client_ids.size)
        for lo in range(0, self.num_clients, batch_clients):
            hi = min(lo + batch_clients, self.num_clients)
            rows = slice(int(ends[lo]), int(ends[hi]))
            yield self.features[rows], self.labels[rows], self.client_ids[rows]


@dataclass(frozen=True, eq=False)
class PreparedShardSource:
    """The records of clients ``[client_lo, client_hi)``, cut from the driver's prepared
    partition: every record of its clients; the shard keeps at most ``bound`` of each, picked
    (and, under privacy.multi_record=each, made senders) in an order drawn from its own secret
    (:func:`rknn_ray.data.partition.sender_order`). ``owners``: under each, the client each
    record belonged to (the shard's range then covers whole owners)."""
    client_lo: int
    client_hi: int
    features: np.ndarray
    labels: np.ndarray
    client_ids: np.ndarray
    bound: int | None = None
    owners: np.ndarray | None = None

    @classmethod
    def of(cls, data, client_lo: int, client_hi: int) -> "PreparedShardSource":
        """Clients ``[client_lo, client_hi)`` of ``data`` (a PreparedData)."""
        sp = data.splits
        if data.owners is not None:            # each: the owners whose records fill the range
            held = data.held_rows()
            ids = data.client_ids[held]
            mine = np.unique(data.owners[held[(ids >= client_lo) & (ids < client_hi)]])
            rows = np.flatnonzero(np.isin(data.owners, mine))
            return cls(int(client_lo), int(client_hi), sp.private_x[rows], sp.private_y[rows],
                       data.client_ids[rows], int(data.owner_bound), data.owners[rows])
        rows = np.flatnonzero((data.client_ids >= client_lo) & (data.client_ids < client_hi))
        return cls(int(client_lo), int(client_hi), sp.private_x[rows], sp.private_y[rows],
                   data.client_ids[rows], data.max_records_per_client)

    def open(self, order_key: bytes | None = None) -> ShardRecords:
        """The kept records, grouped by client; ``order_key``: from the shard's secret (None:
        a fresh key)."""
        if self.bound is None:                 # hand-built: every record as given
            return ShardRecords(self.features, self.labels, self.client_ids)
        if self.owners is None:
            order = sender_order(self.client_ids, self.bound, order_key)
            return ShardRecords(self.features[order], self.labels[order],
                                self.client_ids[order])
        order = sender_order(self.owners, self.bound, order_key)
        if order.size != self.client_hi - self.client_lo:
            raise ValueError(f"the shard's owners keep {order.size} records for "
                             f"{self.client_hi - self.client_lo} clients")
        return ShardRecords(self.features[order], self.labels[order],
                            np.arange(self.client_lo, self.client_hi, dtype=np.int64))


@dataclass(frozen=True)
class SyntheticClientsSource:
    """Clients ``[client_lo, client_hi)``, one mixture record each, generated on demand.

    Client ``i``'s record depends only on (seed, i's chunk of ``CHUNK`` ids), so any
    batching and any restart give the same records; labels are uniform classes.
    """
    client_lo: int
    client_hi: int
    num_classes: int = 10
    dim: int = 32
    seed: int = 0
    separation: float = 4.0
    CHUNK = 65536

    @property
    def num_clients(self) -> int:
        return self.client_hi - self.client_lo

    max_records_per_client = 1

    def open(self, order_key: bytes | None = None) -> "SyntheticClientsSource":
        return self                         # one record per client: nothing to pick

    def records(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Features and labels of clients ``[lo, hi)`` (any range; chunk-aligned generation)."""
        means = class_means(self.num_classes, self.dim, self.separation, self.seed).astype(np.float32)
        xs, ys = [], []
        for c0 in range(lo // self.CHUNK * self.CHUNK, hi, self.CHUNK):
            x, y = _chunk(self.seed, c0 // self.CHUNK, self.CHUNK, self.num_classes, self.dim)
            a, b = max(lo, c0) - c0, min(hi, c0 + self.CHUNK) - c0
            xs.append(x[a:b] + means[y[a:b]])
            ys.append(y[a:b])
        return np.concatenate(xs), np.concatenate(ys)

    def batches(self, batch_clients: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        for lo in range(self.client_lo, self.client_hi, batch_clients):
            hi = min(lo + batch_clients, self.client_hi)
            x, y = self.records(lo, hi)
            yield x, y, np.arange(lo, hi, dtype=np.int64)


@functools.lru_cache(maxsize=2)
def _chunk(seed: int, index: int, size: int, num_classes: int, dim: int):
    """One chunk of synthetic clients, kept for the next call (8 MB at dim 32): a warm round
    of a small shard, or the next batch of a big one, reads the chunk it just made instead
    of drawing 2 million normals again (read-only: callers copy what they take)."""
    rng = seeded_generator(seed * 1_000_003 + index + 1)
    y = rng.integers(0, num_classes, size)
    x = rng.standard_normal((size, dim), dtype=np.float32)
    x.flags.writeable = y.flags.writeable = False
    return x, y


def dataset_sources(cfg, data: "PreparedData", shards: int | None = None) -> list:
    """One source per client shard: contiguous client-id ranges of the run's partition.

    Each source holds only its shard's records, cut from ``data`` (the partition this
    job prepared once), so no shard loads, splits and partitions the whole dataset
    again, and none holds another shard's records.
    """
    if data.shard_sources is not None:      # the kind deals its own (each shard reads its part)
        return data.shard_sources(cfg, int(shards or cfg.cluster.shards))
    n = data.num_clients
    count = max(1, min(int(shards or cfg.cluster.shards), n))
    cuts = np.linspace(0, n, count + 1).astype(np.int64)
    if data.owners is not None:      # each: cut between owners (an owner's records on one shard)
        held = data.held_rows()
        by_id = np.argsort(data.client_ids[held])
        ids, owners = data.client_ids[held][by_id], data.owners[held][by_id]
        starts = np.append(ids[np.r_[True, owners[1:] != owners[:-1]]], n)   # owners' first ids
        cuts = np.unique(starts[np.searchsorted(starts, cuts)])            # each cut moved up
    return [PreparedShardSource.of(data, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]

"""Reverse k-NN answers of many records, grouped by virtual client.

This is the one data structure every mechanism consumes. A record ``j`` held by
virtual client ``client_ids[j]`` is connected to the ``k`` queries
``neighbors[j]`` and carries the ``r``-hot label ``labels[j]``; it therefore adds
one to each of the ``k * r`` cells ``(q, y)`` of the ``s x |Y|`` BSVS matrix.
Flattened cell index: ``q * num_classes + y``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RecordAnswers:
    neighbors: np.ndarray   # (m, k) int64, distinct query indices per row
    labels: np.ndarray      # (m, r) int64, distinct class indices per row
    client_ids: np.ndarray  # (m,) int64, non-decreasing virtual client ids
    num_queries: int        # s
    num_classes: int        # |Y|

    def __post_init__(self):
        if self.neighbors.ndim != 2 or self.labels.ndim != 2:
            raise ValueError("neighbors must be (m, k) and labels (m, r)")
        m = self.neighbors.shape[0]
        if self.labels.shape[0] != m or self.client_ids.shape != (m,):
            raise ValueError("neighbors, labels and client_ids must have one row per record")
        if m > 1 and np.any(np.diff(self.client_ids) < 0):
            raise ValueError("client_ids must be sorted (records grouped by client)")

    @property
    def num_records(self) -> int:
        return int(self.neighbors.shape[0])

    @property
    def k(self) -> int:
        return int(self.neighbors.shape[1])

    @property
    def r(self) -> int:
        return int(self.labels.shape[1])

    @property
    def num_cells(self) -> int:
        """d = s * |Y|, the length of the flattened BSVS vector."""
        return self.num_queries * self.num_classes

    def flat_cells(self) -> np.ndarray:
        """(m, k*r) flattened cell indices each record adds one to."""
        cells = self.neighbors[:, :, None] * self.num_classes + self.labels[:, None, :]
        return cells.reshape(self.num_records, -1)

    def counts(self) -> np.ndarray:
        """The exact (non-private) BSVS sum: an (s, |Y|) int64 matrix."""
        flat = np.bincount(self.flat_cells().ravel(), minlength=self.num_cells)
        return flat.reshape(self.num_queries, self.num_classes).astype(np.int64)

    def clients(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(unique client ids, first record index of each, records per client)."""
        c = self.client_ids
        if c.size and c[0] == c[-1]:      # one client (sorted ids): np.unique's answer, cheaply
            return c[:1].copy(), np.zeros(1, np.intp), np.full(1, c.size, np.intp)
        ids, start, count = np.unique(c, return_index=True, return_counts=True)
        return ids, start, count

    @property
    def num_clients(self) -> int:
        return int(np.unique(self.client_ids).size)

    def select(self, rows: np.ndarray) -> "RecordAnswers":
        """The answers of a subset of records (rows must keep clients grouped)."""
        return RecordAnswers(self.neighbors[rows], self.labels[rows], self.client_ids[rows],
                             self.num_queries, self.num_classes)

    def one_record_per_client(self, rng: np.random.Generator) -> "RecordAnswers":
        """Keep one uniformly sampled record per client (local model, 'sample' option)."""
        _, start, count = self.clients()
        pick = start + rng.integers(0, count)        # exactly uniform (no float rounding)
        return self.select(pick)

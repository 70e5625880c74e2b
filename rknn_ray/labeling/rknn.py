"""Reverse k-NN: connect every private record to its k nearest queries (faiss).

(Or to the k queries a public connection plan picks: :mod:`.connection`.)

Exact L2 search (IndexFlatL2) in batches so memory stays bounded for millions of
records. The result, with the records' labels and owners, is a RecordAnswers.
"""
from __future__ import annotations

import faiss
import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import DataError


def reverse_knn(record_emb: np.ndarray, query_features: np.ndarray, k: int,
                batch_size: int = 65536) -> np.ndarray:
    """(m, k) int64 indices of the k nearest queries of each record."""
    s = query_features.shape[0]
    if not 1 <= k <= s:
        raise ValueError(f"k = {k} must satisfy 1 <= k <= s = {s}")
    index = faiss.IndexFlatL2(query_features.shape[1])
    index.add(np.ascontiguousarray(query_features, dtype=np.float32))
    out = np.empty((record_emb.shape[0], k), dtype=np.int64)
    for start in range(0, record_emb.shape[0], batch_size):
        chunk = np.ascontiguousarray(record_emb[start:start + batch_size], dtype=np.float32)
        _, idx = index.search(chunk, k)
        out[start:start + chunk.shape[0]] = idx
    return out


def build_answers(record_emb: np.ndarray, labels: np.ndarray, client_ids: np.ndarray,
                  query_features: np.ndarray, k: int, num_classes: int,
                  connection=None) -> RecordAnswers:
    """RecordAnswers for records grouped by client (``client_ids`` sorted). ``connection``:
    which k queries each record votes for (:class:`rknn_ray.labeling.connection.Connection`,
    planned from public data), None for reverse k-NN."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.ndim == 1:
        labels = labels[:, None]
    bad = np.flatnonzero(((labels < 0) | (labels >= num_classes)).any(axis=1))
    if bad.size:      # would silently vote into another query's cells
        raise DataError(f"{bad.size} records have labels outside 0..{num_classes - 1} (first at "
                        f"row {bad[0]}: {labels[bad[0]].tolist()}). Fix: map labels to class indices")
    emb = np.asarray(record_emb)
    if emb.size and not np.isfinite(emb).all():
        rows = np.flatnonzero(~np.isfinite(emb.reshape(len(emb), -1)).all(axis=1))
        raise DataError(f"{rows.size} records have NaN or infinite embeddings (first at row "
                        f"{rows[0]}): faiss would connect them to arbitrary queries. Fix: drop or "
                        "impute those records before embedding")
    neighbors = (reverse_knn(record_emb, query_features, k) if connection is None
                 else connection.neighbors(record_emb, query_features, k))
    return RecordAnswers(neighbors, labels, np.asarray(client_ids, dtype=np.int64),
                         int(query_features.shape[0]), int(num_classes))

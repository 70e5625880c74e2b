"""Query selection: ``s`` k-means centres of the public representation (faiss).

k-means++ seeding (D^2 sampling, vectorized) for each of several restarts, Lloyd
iterations in faiss, the restart with the lowest objective wins. Optionally each
centre is replaced by the real public sample nearest to it, so queries are real
data points. Every public sample belongs to the cluster of its nearest query;
labels propagate along that assignment.
"""
from __future__ import annotations

from dataclasses import dataclass

import faiss
import numpy as np


@dataclass
class QuerySet:
    features: np.ndarray       # (s, D) float32 query positions in representation space
    public_index: np.ndarray   # (s,) int64 nearest public sample of each query
    assignment: np.ndarray     # (N_pub,) int64 query (cluster) of each public sample
    objective: float           # k-means objective of the winning restart

    @property
    def size(self) -> int:
        return int(self.features.shape[0])


def kmeans_pp_init(x: np.ndarray, s: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeds: each next centre drawn with probability ~ D(x)^2."""
    n = x.shape[0]
    centres = np.empty((s, x.shape[1]), dtype=np.float32)
    centres[0] = x[rng.integers(n)]
    d2 = ((x - centres[0]) ** 2).sum(axis=1)
    for i in range(1, s):
        total = d2.sum()
        j = rng.integers(n) if total <= 0 else int(np.searchsorted(np.cumsum(d2), rng.random() * total))
        centres[i] = x[min(j, n - 1)]
        d2 = np.minimum(d2, ((x - centres[i]) ** 2).sum(axis=1))
    return centres


def nearest(index_points: np.ndarray, queries: np.ndarray, k: int = 1):
    """(distances, indices) of the k nearest ``index_points`` for each query row."""
    index = faiss.IndexFlatL2(index_points.shape[1])
    index.add(np.ascontiguousarray(index_points, dtype=np.float32))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


def select_queries(public_emb: np.ndarray, s: int, restarts: int = 3, niter: int = 25,
                   seed: int = 0, use_nearest_public: bool = False) -> QuerySet:
    """Pick ``s`` queries from the public embeddings (see module docstring)."""
    x = np.ascontiguousarray(public_emb, dtype=np.float32)
    if not 1 <= s <= x.shape[0]:
        raise ValueError(f"s = {s} queries need 1 <= s <= {x.shape[0]} public samples")
    rng = np.random.default_rng(seed)
    best = None
    for r in range(max(1, restarts)):
        init = kmeans_pp_init(x, s, rng)
        km = faiss.Kmeans(x.shape[1], s, niter=niter, seed=seed + r, verbose=False,
                          min_points_per_centroid=1, max_points_per_centroid=1 << 30)
        km.train(x, init_centroids=init)
        obj = float(km.obj[-1]) if len(km.obj) else float("inf")
        if best is None or obj < best[1]:
            best = (km.centroids.copy(), obj)
    centroids, obj = best
    _, nearest_pub = nearest(x, centroids, 1)
    nearest_pub = nearest_pub[:, 0].astype(np.int64)
    features = x[nearest_pub] if use_nearest_public else centroids
    _, assign = nearest(features, x, 1)
    return QuerySet(np.ascontiguousarray(features), nearest_pub, assign[:, 0].astype(np.int64), obj)

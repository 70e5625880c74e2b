"""Query selection: ``s`` k-means centres of the public representation (faiss).

k-means++ seeding (D^2 sampling, vectorized) for each of several restarts, Lloyd
iterations in faiss, the restart with the lowest objective wins. Optionally each
centre is replaced by the real public sample nearest to it, so queries are real
data points. Every public sample belongs to the cluster of its nearest query;
labels propagate along that assignment.
"""
from __future__ import annotations

from dataclasses import dataclass

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
    import faiss        # here, not at the top: the config reads this module's choices
    index = faiss.IndexFlatL2(index_points.shape[1])
    index.add(np.ascontiguousarray(index_points, dtype=np.float32))
    return index.search(np.ascontiguousarray(queries, dtype=np.float32), k)


def select_queries(public_emb: np.ndarray, s: int, restarts: int = 3, niter: int = 25,
                   seed: int = 0, use_nearest_public: bool = False) -> QuerySet:
    """Pick ``s`` queries from the public embeddings (see module docstring)."""
    import faiss  # defers faiss: importing queries (configs, reports) stays light
    x = np.ascontiguousarray(public_emb, dtype=np.float32)
    if not 1 <= s <= x.shape[0]:
        raise ValueError(f"s = {s} queries need 1 <= s <= {x.shape[0]} public samples")
    rng = np.random.default_rng(seed)
    best = None
    for r in range(max(1, restarts)):       # faiss's seed is a C int: later rounds' seed + t wrap
        init = kmeans_pp_init(x, s, rng)
        km = faiss.Kmeans(x.shape[1], s, niter=niter, seed=(seed + r) % 2 ** 31, verbose=False,
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


def farthest_public_queries(public_emb: np.ndarray, taken: np.ndarray, s: int,
                            seed: int = 0) -> QuerySet:
    """The next round's queries: ``s`` public samples, each the farthest from all queries so far.

    Greedy farthest-point traversal (Gonzalez) seeded with the queries already
    released (``taken``: their public indices), over public samples only: public
    information, no privacy cost. It spreads new queries into the regions the
    earlier rounds covered worst. (``rounds.query_selection: uncertain``,
    rknn_ray/labeling/adaptive.py, picks where the interim student is least certain instead.)
    """
    x = np.ascontiguousarray(public_emb, dtype=np.float32)
    free = np.ones(x.shape[0], bool)
    free[taken] = False
    if s > int(free.sum()):
        raise ValueError(f"only {int(free.sum())} public samples are not yet queries; "
                         f"cannot pick {s} more (lower queries.s or rounds.count)")
    if taken.size:
        d2, _ = nearest(x[taken], x, 1)
        d2 = d2[:, 0].astype(np.float64)
    else:
        d2 = np.full(x.shape[0], np.inf)
        d2[np.random.default_rng(seed).integers(x.shape[0])] = -1.0
    picks = np.empty(s, np.int64)
    for i in range(s):
        j = int(np.argmax(np.where(free, d2, -np.inf)))
        picks[i], free[j] = j, False
        d2 = np.minimum(d2, ((x - x[j]) ** 2).sum(axis=1))
    _, assign = nearest(x[picks], x, 1)
    return QuerySet(np.ascontiguousarray(x[picks]), picks, assign[:, 0].astype(np.int64), float("nan"))


#: Query selection for rounds after the first: name -> f(public_emb, taken, s, seed) -> QuerySet.
NEXT_ROUND_SELECTORS = {"farthest": farthest_public_queries}
#: Selections that also read the counts released so far (post-processing): rknn_ray/labeling/adaptive.py.
ADAPTIVE_SELECTORS = ("uncertain",)


def union_of_rounds(public_emb: np.ndarray, rounds: list[QuerySet]) -> QuerySet:
    """All rounds' queries as one set: every public sample joins its nearest query of any round."""
    features = np.concatenate([q.features for q in rounds]).astype(np.float32)
    public_index = np.concatenate([q.public_index for q in rounds])
    _, assign = nearest(features, np.ascontiguousarray(public_emb, dtype=np.float32), 1)
    return QuerySet(features, public_index, assign[:, 0].astype(np.int64),
                    float(sum(q.objective for q in rounds)))

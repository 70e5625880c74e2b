"""Private-kNN (Zhu et al. 2020): per-query subsampled kNN votes with Gaussian noise.

For every public query the (trusted, central) server draws a Poisson subsample of
the private records (each independently with probability ``gamma``), takes the
``k`` records of that subsample nearest to the query in the public-fitted
representation, and releases ``argmax_j (votes_j + N(0, sigma^2))``.

Guarantee: record-level (eps, delta), add/remove-one record. Adding or removing a
record changes the vote histogram of a query by at most one vote moved between two
classes (L2 sensitivity sqrt 2), and only if the record was sampled: each query is
a Poisson-subsampled Gaussian mechanism with noise multiplier sigma/sqrt(2) and
rate gamma, ``PoissonSampledDpEvent(gamma, GaussianDpEvent(sigma/sqrt 2))``,
composed over the Q queries with ``dp_accounting``'s RDP accountant.
"""
from __future__ import annotations

import time

import numpy as np

from rknn_ray.baselines.common import (privacy_generator, NEIGHBOUR_ADD_REMOVE, BaselineRow, BaselineSetup,
                                       Costing, baseline_row, calibrate_decreasing, event_cost,
                                       new_ledger,
                                       one_hot, record, student_from_query_counts)
from rknn_ray.baselines.events import private_knn_event


def private_knn_epsilon(gamma: float, sigma: float, num_queries: int, delta: float) -> float:
    """eps at ``delta``: the accountant's RDP cost of the release's event."""
    return event_cost(private_knn_event(gamma, sigma, num_queries), Costing(delta=delta))[0]


def calibrate_sigma(target_eps: float, gamma: float, num_queries: int, delta: float) -> float:
    return calibrate_decreasing(lambda s: private_knn_epsilon(gamma, s, num_queries, delta),
                                target_eps, lo=1e-2, hi=1e5, iters=45)


def subsampled_knn_votes(private_emb: np.ndarray, private_y: np.ndarray, queries: np.ndarray,
                         k: int, gamma: float, num_classes: int,
                         rng: np.random.Generator) -> np.ndarray:
    """(Q, C) vote histograms: per query its own Poisson(gamma) subsample, its k nearest vote."""
    hist = np.zeros((len(queries), num_classes), np.float64)
    x = np.ascontiguousarray(private_emb, dtype=np.float32)
    for i, q in enumerate(np.ascontiguousarray(queries, dtype=np.float32)):
        keep = np.flatnonzero(rng.random(len(x)) < gamma)
        if keep.size == 0:
            continue
        d = ((x[keep] - q) ** 2).sum(axis=1)
        kk = min(k, keep.size)
        near = keep[np.argpartition(d, kk - 1)[:kk]]
        np.add.at(hist[i], private_y[near], 1.0)
    return hist


def run_private_knn(setup: BaselineSetup, target_eps: float, delta: float = 1e-5,
                    gamma: float = 0.15, k: int | None = None, seed: int | None = None,
                    ledger=None) -> BaselineRow:
    """Private-kNN on the run's ``s`` queries at ``target_eps``; ``k`` defaults to
    max(5, 2 % of the expected subsample)."""
    t0 = time.perf_counter()
    seed = setup.cfg.run.seed if seed is None else seed
    m = len(setup.splits.private_y)
    k = int(k or max(5, round(0.02 * gamma * m)))
    Q = setup.queries.size
    sigma = calibrate_sigma(target_eps, gamma, Q, delta)
    ledger = ledger or new_ledger()
    record(ledger, private_knn_event(gamma, sigma, Q), Costing(delta=delta), "central",
           "private_knn", "record", NEIGHBOUR_ADD_REMOVE,
           f"{Q} queries, gamma={gamma}, k={k}, sigma={sigma:.4g}, RDP", k=k)
    rng = privacy_generator(setup, 23, seed)
    hist = subsampled_knn_votes(setup.private_emb, setup.splits.private_y, setup.query_emb, k,
                                gamma, setup.num_classes, rng)
    labels = np.argmax(hist + rng.normal(0.0, sigma, size=hist.shape), axis=1)
    acc, lab_acc, _ = student_from_query_counts(setup, one_hot(labels, setup.num_classes))
    return baseline_row(
        setup, ledger, "private_knn", target_eps, t0, unit="record",
        neighbour=NEIGHBOUR_ADD_REMOVE, accuracy=acc, label_accuracy=lab_acc, rounds=1,
        bytes_per_client=raw_upload_bytes(setup),
        details={"sigma": sigma, "gamma": gamma, "k": k, "queries": Q},
        diagnostics={"noiseless_vote_accuracy":     # NOT PRIVATE: the exact vote histogram
                     float(np.mean(hist.argmax(1) == setup.query_truth))})


def raw_upload_bytes(setup: BaselineSetup) -> float:
    """Central model: a client uploads its records (float32 features + int64 label) in full."""
    per_record = 4 * int(np.prod(setup.data.image_shape)) + 8
    return float(per_record * len(setup.splits.private_y) / max(1, setup.data.num_clients))


"""PATE: teachers on disjoint partitions, noisy-argmax aggregation of their votes.

Teachers: the private records are split into ``T`` disjoint parts (the run's clients
grouped by ``client id mod T``: a record lives in exactly one teacher's part), one
small classifier per part. Each public query gets the teachers' vote histogram
``n(x)``; the aggregator (trusted: central model) releases only the noisy argmax:

* LNMax (Papernot et al. 2017): ``argmax_j n_j + Lap(b)``
* GNMax (Papernot et al. 2018): ``argmax_j n_j + N(0, sigma^2)``

Guarantee: record-level (eps, delta), add/remove-one record. Adding or removing one
record changes at most one teacher, whose vote moves from one class to another:
the histogram moves by +1 in one cell and -1 in another (L1 = 2, L2 = sqrt 2).
Data-independent accounting with ``dp_accounting``'s RDP accountant:

* LNMax: two unit-sensitivity Laplace mechanisms of scale b per query,
  ``SelfComposedDpEvent(LaplaceDpEvent(b), 2Q)`` (also the pure bound 2Q/b; the
  smaller eps is reported);
* GNMax: a Gaussian mechanism with noise multiplier sigma/sqrt(2) per query, RDP
  ``alpha / sigma^2`` per query, ``SelfComposedDpEvent(GaussianDpEvent(sigma/sqrt 2), Q)``.

Option ``data_dependent=True`` (GNMax): the data-dependent RDP bound of Papernot et
al. 2018 (Thm 6 with the GNMax choice of Prop. 10) from the actual vote gaps, kept
in ``details`` for reference. It depends on the private votes, so it is NOT a DP
statement on its own (publishing it needs smooth sensitivity); the ledger and the
table always carry the data-independent guarantee.
"""
from __future__ import annotations

import math
import time

import numpy as np
from scipy.special import erfc

from rknn_ray.baselines.common import (privacy_generator, NEIGHBOUR_ADD_REMOVE, RDP_ORDERS, BaselineRow,
                                       BaselineSetup, baseline_row, calibrate_decreasing,
                                       fit_classifiers,
                                       Costing, event_cost, new_ledger, one_hot, record,
                                       student_from_query_counts, vote_histogram)
from rknn_ray.baselines.events import gnmax_event, lnmax_event  # noqa: F401 (named here before)

AGGREGATORS = ("lnmax", "gnmax")


def pate_costing(aggregator: str, delta: float) -> Costing:
    """LNMax and GNMax are stated at ``delta`` with RDP (LNMax: or its pure 2Q/b if smaller)."""
    if aggregator not in AGGREGATORS:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}")
    return Costing(delta=float(delta), method="rdp")


def pate_event(aggregator: str, noise: float, num_queries: int):
    if aggregator not in AGGREGATORS:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}")
    return (lnmax_event if aggregator == "lnmax" else gnmax_event)(noise, num_queries)


def pate_epsilon(aggregator: str, noise: float, num_queries: int, delta: float) -> tuple[float, float]:
    """Data-independent (eps, delta) of ``num_queries`` answers: the accountant's cost."""
    return event_cost(pate_event(aggregator, noise, num_queries), pate_costing(aggregator, delta))


def calibrate_pate(aggregator: str, target_eps: float, num_queries: int, delta: float) -> float:
    """Smallest noise (Laplace scale / Gaussian sigma) meeting ``target_eps`` at ``delta``."""
    return calibrate_decreasing(lambda x: pate_epsilon(aggregator, x, num_queries, delta)[0],
                                target_eps, lo=1e-2, hi=1e6, iters=50)


def noisy_argmax(hist: np.ndarray, aggregator: str, noise: float,
                 rng: np.random.Generator) -> np.ndarray:
    if aggregator == "lnmax":
        z = rng.laplace(0.0, noise, size=hist.shape)
    else:
        z = rng.normal(0.0, noise, size=hist.shape)
    return np.argmax(hist + z, axis=1)


# ----------------------------------------------------------------------------- data-dependent

def gnmax_q_bound(hist: np.ndarray, sigma: float) -> np.ndarray:
    """Per query: upper bound on Pr[GNMax answer != plurality] (Papernot et al. 2018, Prop. 7)."""
    top = hist.max(axis=1, keepdims=True)
    star = hist.argmax(axis=1)
    gaps = top - hist
    terms = 0.5 * erfc(gaps / (2.0 * sigma))
    terms[np.arange(len(star)), star] = 0.0
    return np.minimum(terms.sum(axis=1), 1.0)


def gnmax_data_dependent_rdp(q: float, sigma: float, order: float) -> float:
    """Data-dependent RDP of one GNMax answer at ``order`` (Thm 6 + Prop. 10); falls back
    to the data-independent ``order / sigma^2`` where the theorem's conditions fail."""
    indep = order / sigma ** 2
    if q <= 0 or q >= 1:
        return indep
    mu2 = sigma * math.sqrt(math.log(1.0 / q))
    mu1 = mu2 + 1.0
    eps1, eps2 = mu1 / sigma ** 2, mu2 / sigma ** 2
    if mu2 <= 1 or mu1 < order:
        return indep
    cond = math.exp((mu2 - 1) * eps2) / ((mu1 / (mu1 - 1)) * (mu2 / (mu2 - 1))) ** mu2
    if q > cond:
        return indep
    inner = (q * math.exp(eps2)) ** ((mu2 - 1) / mu2)
    if inner >= 1:
        return indep
    log_a = math.log(1 - q) - math.log1p(-inner)
    log_b = eps1 - math.log(q) / (mu1 - 1)
    lam = order - 1
    val = np.logaddexp(math.log(1 - q) + lam * log_a, math.log(q) + lam * log_b) / lam
    return float(min(indep, val))


def gnmax_data_dependent_epsilon(hist: np.ndarray, sigma: float, delta: float,
                                 orders=RDP_ORDERS) -> float:
    """Sum the per-query data-dependent RDP and convert (log(1/delta)/(alpha-1)). Reference only."""
    qs = gnmax_q_bound(hist, sigma)
    best = math.inf
    for a in orders:
        total = sum(gnmax_data_dependent_rdp(float(q), sigma, a) for q in qs)
        best = min(best, total + math.log(1.0 / delta) / (a - 1))
    return best


# ----------------------------------------------------------------------------- run

def teacher_votes(setup: BaselineSetup, num_teachers: int, hidden: int = 0,
                  steps: int = 200) -> np.ndarray:
    """(T, s) votes of teachers trained on disjoint partitions of the private records."""
    owner = setup.data.client_ids % num_teachers
    y = setup.splits.private_y
    xs = [setup.private_emb[owner == t] for t in range(num_teachers)]
    ys = [y[owner == t] for t in range(num_teachers)]
    models = fit_classifiers(xs, ys, setup.num_classes, hidden=hidden, steps=steps,
                             seed=setup.cfg.run.seed)
    return models.predict_proba(setup.query_emb).argmax(-1)


def run_pate(setup: BaselineSetup, target_eps: float, delta: float = 1e-5,
             aggregator: str = "gnmax", num_teachers: int = 50, data_dependent: bool = False,
             seed: int | None = None, ledger=None) -> BaselineRow:
    """PATE on the run's ``s`` queries, noise calibrated to ``target_eps`` at ``delta``."""
    if aggregator not in AGGREGATORS:
        raise ValueError(f"aggregator must be one of {AGGREGATORS}")
    t0 = time.perf_counter()
    seed = setup.cfg.run.seed if seed is None else seed
    num_teachers = int(min(num_teachers, setup.data.num_clients))
    votes = teacher_votes(setup, num_teachers)
    hist = vote_histogram(votes, setup.num_classes)
    Q = hist.shape[0]
    noise = calibrate_pate(aggregator, target_eps, Q, delta)
    ledger = ledger or new_ledger()
    record(ledger, pate_event(aggregator, noise, Q), pate_costing(aggregator, delta), "central",
           f"pate_{aggregator}", "record", NEIGHBOUR_ADD_REMOVE,
           f"{Q} queries, {num_teachers} teachers, noise {noise:.4g}, RDP",
           aggregator=aggregator, noise=noise, num_queries=Q, num_teachers=num_teachers)
    labels = noisy_argmax(hist, aggregator, noise, privacy_generator(setup, 17, seed))
    acc, lab_acc, _ = student_from_query_counts(setup, one_hot(labels, setup.num_classes))
    details = {"noise": noise, "num_teachers": num_teachers, "queries": Q}
    # NOT PRIVATE: both read the exact vote histogram
    diagnostics = {"plurality_accuracy": float(np.mean(hist.argmax(1) == setup.query_truth))}
    if data_dependent and aggregator == "gnmax":
        diagnostics["data_dependent_eps_reference_only"] = gnmax_data_dependent_epsilon(
            hist, noise, delta)
    return baseline_row(
        setup, ledger, f"pate_{aggregator}", target_eps, t0, unit="record",
        neighbour=NEIGHBOUR_ADD_REMOVE, accuracy=acc, label_accuracy=lab_acc, rounds=1,
        bytes_per_client=4.0 * Q, details=details,
        diagnostics=diagnostics)

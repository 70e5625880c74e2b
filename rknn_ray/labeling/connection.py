"""Which k queries a record votes for: reverse k-NN or a balanced, record-local rule.

Paper 000 (App. C) scores a query by the summed similarity of the records connected to it,
Score(q) = sum_{(q,x) in E} sim(q, x), and notes that reverse k-NN maximizes the
arithmetic mean of the scores; under domain shift some queries then get very few records,
a small count gap, and noise flips their labels. The balanced rules maximize instead the
minimum score (``balanced_min``) or the harmonic mean (``balanced_harmonic``).

Solving that over the private records would make one record's edges depend on every other
record (replacing one record could move many edges). Here the objective is solved on the
PUBLIC embeddings only, and its solution is kept as one price per query: with
sim(q, x) = exp(-|x - q|^2 / tau), the alpha-fair objective sum_q Score(q)^(1-alpha)/(1-alpha)
(alpha = 0: the arithmetic mean, 2: the harmonic mean, large: the max-min) has marginal gain
w_q sim(q, x) for an edge, w_q = Score(q)^-alpha, i.e. an edge is worth taking when
|x - q|^2 + price_q is small, price_q = -tau log w_q. A damped best-response iteration on
the public samples finds the prices; the iterate with the best public objective is kept
(the first iterate is reverse k-NN, so the plan is never worse than it on public data).

Every record then takes the k queries with the smallest ``|x - q|^2 + price_q``
(:meth:`Connection.neighbors`): its edges are a function of the record itself and of
public data (the public embeddings, the queries, k), never of another record.

Why the sensitivity is still 2kr: each record adds one to exactly k distinct queries x r
labels, k*r cells, whichever rule picks the queries; replacing one record x by x' removes
x's k*r ones and adds x''s k*r ones and changes no other record's edges (they do not read
x), so the count matrix moves by at most 2kr in L1 -- the unit every mechanism is
calibrated for (central noise of scale 2kr/eps; the local and shuffle randomizers take any
kr-hot answer as input, so their per-report guarantee does not depend on how the k queries
were chosen). tests/test_connection.py checks it by brute force for every rule.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

RULES = ("reverse_knn", "balanced_min", "balanced_harmonic")
#: the config's values: a rule, or ``auto`` (:func:`choose_rule`, public information only)
CHOICES = (*RULES, "auto")
#: alpha of the alpha-fair objective each balanced rule optimizes, and the damping of its
#: price iteration (alpha * step ~ 0.2: at alpha * step >= 1 the prices oscillate and no
#: iterate beats reverse k-NN)
ALPHA = {"balanced_harmonic": 2.0, "balanced_min": 8.0}
STEP = {"balanced_harmonic": 0.1, "balanced_min": 0.025}
#: prices are kept within +-MAX_LOG_WEIGHT * tau: no query is made arbitrarily (un)attractive
MAX_LOG_WEIGHT = float(np.log(1e3))


@dataclass(frozen=True)
class Connection:
    """A connection rule ready to ship to the clients: the rule and, for a balanced one, one
    price per query (computed from public data only). Small: ``s`` floats."""
    rule: str = "reverse_knn"
    prices: np.ndarray | None = None            # (s,) float64, None for reverse k-NN
    info: dict = field(default_factory=dict)    # public facts: tau, objective, iterations

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"connection rule {self.rule!r} is not one of {', '.join(RULES)}")
        if (self.prices is None) != (self.rule == "reverse_knn"):
            raise ValueError("reverse_knn has no prices; a balanced rule needs one per query")

    def neighbors(self, record_emb: np.ndarray, query_features: np.ndarray, k: int) -> np.ndarray:
        """(m, k) int64: the k distinct queries of each record, each row from that record and
        the public plan only."""
        from rknn_ray.labeling.rknn import reverse_knn     # faiss: not for validating a config
        if self.prices is None:
            return reverse_knn(record_emb, query_features, k)
        q = np.asarray(query_features, dtype=np.float64)
        if self.prices.shape != (q.shape[0],):
            raise ValueError(f"the plan has {self.prices.shape[0]} prices for {q.shape[0]} "
                             "queries: plan it for this round's queries")
        # |x - q|^2 + p_q = |[x, 0] - [q, sqrt(p_q + c)]|^2 - c: one more coordinate, exact L2 search
        lift = np.sqrt(self.prices - self.prices.min())[:, None]
        aug_q = np.hstack([q, lift]).astype(np.float32)
        x = np.asarray(record_emb, dtype=np.float32)
        aug_x = np.hstack([x, np.zeros((x.shape[0], 1), np.float32)])
        return reverse_knn(aug_x, aug_q, k)

    def digest(self) -> str:
        """A short fingerprint of the prices (report.json: which plan the clients used)."""
        if self.prices is None:
            return "reverse_knn"
        return hashlib.sha256(np.ascontiguousarray(self.prices, "<f8").tobytes()).hexdigest()[:16]

    def describe(self) -> dict:
        out = {"rule": self.rule, "prices_digest": self.digest(), **self.info}
        if self.prices is not None:
            out["price_range"] = [float(self.prices.min()), float(self.prices.max())]
        return out


def degree_profile(neighbors: np.ndarray, num_queries: int) -> dict:
    """min, 10th percentile, median and max of the per-query degree (records per query)."""
    deg = np.bincount(np.asarray(neighbors).ravel(), minlength=num_queries)
    return {"min": int(deg.min()), "p10": float(np.percentile(deg, 10)),
            "median": float(np.median(deg)), "max": int(deg.max())}


def _scores(x: np.ndarray, q: np.ndarray, nbr: np.ndarray, tau: float) -> np.ndarray:
    d2 = ((x[:, None, :] - q[nbr]) ** 2).sum(axis=-1)
    return np.bincount(nbr.ravel(), weights=np.exp(-d2 / tau).ravel(), minlength=q.shape[0])


def _objective(rule: str, score: np.ndarray) -> tuple:
    """Larger is better: (min, harmonic mean) for balanced_min, the harmonic mean else."""
    harmonic = float(score.size / np.sum(1.0 / np.maximum(score, 1e-12)))
    return (float(score.min()), harmonic) if rule == "balanced_min" else (harmonic,)


def plan_connection(rule: str, public_emb: np.ndarray, query_features: np.ndarray, k: int, *,
                    iterations: int = 100, step: float | None = None, tau_scale: float = 1.0,
                    alpha: float | None = None) -> Connection:
    """The connection for ``rule`` from PUBLIC information only: the public embeddings, the
    queries and k (see the module docstring). Deterministic: the same inputs, the same plan."""
    from rknn_ray.labeling.rknn import reverse_knn
    if rule not in RULES:
        raise ValueError(f"connection rule {rule!r} is not one of {', '.join(RULES)}")
    x = np.asarray(public_emb, dtype=np.float64)
    q = np.asarray(query_features, dtype=np.float64)
    s = q.shape[0]
    base = reverse_knn(x, q, k)
    if rule == "reverse_knn":
        return Connection(rule, None, {"public_degree": degree_profile(base, s)})
    d2k = ((x - q[base[:, -1]]) ** 2).sum(axis=1)
    tau = float(np.median(d2k)) * tau_scale
    if not tau > 0:
        tau = float(np.mean(d2k)) * tau_scale or 1.0
    a = ALPHA[rule] if alpha is None else float(alpha)
    step = STEP[rule] if step is None else float(step)
    logw = np.zeros(s)
    best = None
    for it in range(iterations + 1):
        prices = -tau * logw
        nbr = base if it == 0 else Connection(rule, prices).neighbors(x, q, k)
        score = _scores(x, q, nbr, tau)
        obj = _objective(rule, score)
        if best is None or obj > best[0]:
            best = (obj, prices, it, nbr)
        target = -a * np.log(np.maximum(score, 1e-3 * max(score.max(), 1e-300)))
        logw = (1 - step) * logw + step * (target - target.mean())
        logw = np.clip(logw, -MAX_LOG_WEIGHT, MAX_LOG_WEIGHT)
    obj, prices, it, nbr = best
    info = {"tau": tau, "alpha": a, "step": step, "iterations": iterations, "best_iteration": it,
            "public_objective": obj[-1] if rule == "balanced_harmonic" else obj[0],
            "public_objective_reverse_knn": _objective(rule, _scores(x, q, base, tau))[0],
            "public_degree": degree_profile(nbr, s),
            "public_degree_reverse_knn": degree_profile(base, s)}
    return Connection(rule, np.asarray(prices, dtype=np.float64) - float(np.mean(prices)), info)

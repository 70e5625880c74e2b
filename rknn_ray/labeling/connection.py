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

Public prices cannot see a shift between the private and the public data. With
``rknn.reweight: released`` a later round's plan weights each public sample by how many more
private records than public samples its queries drew in the rounds released before
(:func:`release_weights`): a function of released counts only, chosen before the round's
clients answer, like the next round's queries, so the round is still a 2kr-sensitive release
for a fixed plan and the rounds compose in the ledger as adaptive rounds do.
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
#: prices are kept within +-MAX_LOG_WEIGHT * tau: a record never takes a query more than 2 tau
#: farther (squared) than reverse k-NN would. Wider ranges chase the sampling noise of a small
#: public set (a few samples per query): balanced_min then over-fed a few queries on digits
MAX_LOG_WEIGHT = 1.0


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


def _scores(x: np.ndarray, q: np.ndarray, nbr: np.ndarray, tau: float,
            weight: np.ndarray | None = None) -> np.ndarray:
    d2 = ((x[:, None, :] - q[nbr]) ** 2).sum(axis=-1)
    sim = np.exp(-d2 / tau) * (1.0 if weight is None else weight[:, None])
    return np.bincount(nbr.ravel(), weights=sim.ravel(), minlength=q.shape[0])


def _objective(rule: str, score: np.ndarray) -> tuple:
    """Larger is better: (min, harmonic mean) for balanced_min, the harmonic mean else."""
    harmonic = float(score.size / np.sum(1.0 / np.maximum(score, 1e-12)))
    return (float(score.min()), harmonic) if rule == "balanced_min" else (harmonic,)


def plan_connection(rule: str, public_emb: np.ndarray, query_features: np.ndarray, k: int, *,
                    iterations: int = 100, step: float | None = None, tau_scale: float = 1.0,
                    alpha: float | None = None, max_log_weight: float = MAX_LOG_WEIGHT,
                    sample_weight: np.ndarray | None = None) -> Connection:
    """The connection for ``rule`` from PUBLIC information only: the public embeddings, the
    queries and k (see the module docstring). Deterministic: the same inputs, the same plan.
    ``sample_weight``: one weight per public sample, so that the public samples stand for the
    private distribution (:func:`release_weights`: from released counts, post-processing);
    None: every public sample counts once."""
    from rknn_ray.labeling.rknn import reverse_knn     # faiss: not for validating a config
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
    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    if w is not None and (w.shape != (x.shape[0],) or not np.isfinite(w).all() or (w < 0).any()):
        raise ValueError("sample_weight must be one finite, nonnegative weight per public sample")
    a = ALPHA[rule] if alpha is None else float(alpha)
    step = STEP[rule] if step is None else float(step)
    logw = np.zeros(s)
    best = None
    for it in range(iterations + 1):
        prices = -tau * logw
        nbr = base if it == 0 else Connection(rule, prices).neighbors(x, q, k)
        score = _scores(x, q, nbr, tau, w)
        obj = _objective(rule, score)
        if best is None or obj > best[0]:
            best = (obj, prices, it, nbr)
        target = -a * np.log(np.maximum(score, 1e-3 * max(score.max(), 1e-300)))
        logw = (1 - step) * logw + step * (target - target.mean())
        logw = np.clip(logw, -max_log_weight, max_log_weight)
    obj, prices, it, nbr = best
    info = {"tau": tau, "alpha": a, "step": step, "iterations": iterations, "best_iteration": it,
            "public_objective": obj[-1] if rule == "balanced_harmonic" else obj[0],
            "public_objective_reverse_knn": _objective(rule, _scores(x, q, base, tau, w))[0],
            "public_degree": degree_profile(nbr, s),
            "public_degree_reverse_knn": degree_profile(base, s)}
    if w is not None:
        info["weighted"] = {"min": float(w.min()), "median": float(np.median(w)),
                            "max": float(w.max())}
    return Connection(rule, np.asarray(prices, dtype=np.float64) - float(np.mean(prices)), info)


def release_weights(public_emb: np.ndarray, query_features: np.ndarray, released: np.ndarray,
                    k: int, r: int, num_private: int, noise_std: float,
                    connection: Connection | None = None) -> np.ndarray:
    """One weight per public sample from a round's RELEASED counts (post-processing of a DP
    release, no further privacy cost): how many more (or fewer) private records than public
    samples its query drew, per public sample, so a later round's plan balances the private
    degrees the release showed instead of the public ones (domain shift).

    ``released``: (s, |Y|) noisy counts of ``query_features`` under ``connection`` (the plan
    that round's clients used; None: reverse k-NN). A query's ratio is (released degree + c) /
    (expected degree + c), c = 2 noise std of the degree: queries whose release is mostly noise
    keep a weight near 1. Each public sample gets the mean ratio of the queries it connects to."""
    from rknn_ray.labeling.rknn import reverse_knn     # faiss: not for validating a config
    conn = connection or Connection()
    nbr = (reverse_knn(public_emb, query_features, k) if conn.prices is None
           else conn.neighbors(public_emb, query_features, k))
    s = np.asarray(query_features).shape[0]
    public_deg = np.bincount(nbr.ravel(), minlength=s).astype(np.float64)
    expected = public_deg * num_private / max(1, len(public_emb))
    degree = np.asarray(released, dtype=np.float64).sum(axis=1) / r
    c = 2.0 * noise_std * np.sqrt(np.asarray(released).shape[1]) / r
    ratio = (np.maximum(degree, 0.0) + c) / (expected + c)
    return ratio[nbr].mean(axis=1)


#: auto: a query is at risk when its expected vote count is below AT_RISK_Z noise std. A
#: balanced rule is chosen only when reverse k-NN leaves at least AT_RISK_FLOOR of the public
#: samples (whose labels come from those queries) at risk and the rule halves that share:
#: balancing costs label purity, and a looser rule chose them on digits where they lost
#: label accuracy (docs/running.md)
AT_RISK_Z, AT_RISK_FLOOR = 2.0, 0.25
#: a moved edge (one reverse k-NN would not make) counts as half a vote: it comes from another
#: query's cluster and agrees with the query's label less often
MOVED_DISCOUNT = 0.5


def choose_rule(public_emb: np.ndarray, query_features: np.ndarray, assignment: np.ndarray,
                k: int, num_private: int, noise_std: float,
                floor: float = AT_RISK_FLOOR) -> tuple[str, dict]:
    """``rknn.connection: auto`` from public information only: each rule's public degrees
    scaled to ``num_private`` records, against ``noise_std`` (one count's, from public
    parameters), weighted by how many public samples take their label from each query
    (``assignment``: a public sample's query). Returns (rule, {rule, reason, ...})."""
    x = np.asarray(public_emb)
    s = np.asarray(query_features).shape[0]
    scale = num_private / max(1, len(x))
    cluster = np.bincount(np.asarray(assignment), minlength=s) / max(1, len(x))
    risk, profiles, base = {}, {}, None
    for name in RULES:
        nbr = plan_connection(name, x, query_features, k).neighbors(x, query_features, k)
        base = nbr if base is None else base            # RULES[0]: reverse k-NN
        deg = np.bincount(nbr.ravel(), minlength=s) * scale
        moved = ~(nbr[:, :, None] == base[:, None, :]).any(axis=2)   # edges reverse k-NN lacks
        signal = deg - MOVED_DISCOUNT * scale * np.bincount(nbr[moved], minlength=s)
        risk[name] = float(cluster[signal < AT_RISK_Z * noise_std].sum())
        profiles[name] = {"min": float(deg.min()), "p10": float(np.percentile(deg, 10)),
                          "median": float(np.median(deg))}
    best = min(RULES[1:], key=lambda r: (risk[r], -RULES.index(r)))   # ties: harmonic
    chosen = (best if risk["reverse_knn"] >= floor
              and risk[best] <= risk["reverse_knn"] / 2 else "reverse_knn")
    reason = (f"public samples labelled by queries whose expected vote count (public degree x "
              f"{scale:.3g} private records per public sample, moved edges at "
              f"{MOVED_DISCOUNT:g}) is below {AT_RISK_Z:g} noise std ({AT_RISK_Z * noise_std:.3g}): "
              + ", ".join(f"{r} {risk[r]:.0%}" for r in RULES)
              + (f"; reverse_knn leaves at least {floor:.0%} and {chosen} halves it"
                 if chosen != "reverse_knn" else
                 f"; a balanced rule needs reverse_knn at >= {floor:.0%} and to halve "
                 "it: reverse_knn"))
    return chosen, {"rule": chosen, "reason": reason, "noise_std": float(noise_std),
                    "at_risk": risk, "expected_degree": profiles}

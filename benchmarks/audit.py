"""Empirical privacy audit of shuffled randomizers, and simulated labeling error.

Audit: run a shuffled randomizer on two neighbouring datasets many times, apply a
threshold test, and turn the observed rejection rates into a *certified* lower bound
on eps with Clopper-Pearson intervals (Jagielski et al. 2020 / Nasr et al. 2021 style):

    eps_lb = log((P0_lo(S) - delta) / P1_hi(S)),

which holds with confidence 1 - alpha.  It must lie below every claimed upper bound;
if it does not, the bound (or the implementation) is wrong -- the output flags it.
The threshold is chosen on the first half of the trials, certified on the second.

Two audits:

* :func:`audit_mechanism` -- the project's *real* randomizers (``build("shuffle" |
  "local", "rr" | "collision", ...)``), their byte reports decoded with their own
  helpers.  Neighbouring datasets: n one-record clients all holding the common
  record (query 0, class 0) except client 0, which holds the common record (D1)
  or the differing one (query 0, class 1) (D0).  With k = r = 1 each report's
  likelihood ratio R_diff(y)/R_common(y) is e^{eps0} if it "hits" the differing
  cell but not the common one ("+"), e^{-eps0} for the reverse ("-"), else 1 (RR:
  the two bits; Collision: z equals that cell's hash under the report's own seed).
  The shuffled multiset's likelihood ratio is therefore (1/n) sum_j ratio(y_j):
  the test thresholds T = (#+)(e^eps0 - 1) - (#-)(1 - e^-eps0), which is the
  Neyman-Pearson optimal statistic.  The exact eps of this pair (what infinitely
  many trials could approach) is computed from the trinomial law of (#+, #-) and
  reported next to it, with the audit's power ``eps_lb_expected`` (what this many
  trials certify when the counts equal their means).
  Cost saving: per trial the n-1 common clients are shared by D0 and D1 (each
  rejection rate is still an exact binomial proportion; the two intervals are
  combined by a union bound, which needs no independence).
* :func:`audit_binary_rr` -- the fast reference: binary randomized response,
  whose shuffled multiset is its count of ones, simulated by binomials (the
  canonical eps0-LDP randomizer and the worst case of the lower bound).

Labeling error: :func:`simulate_labeling_error` runs a real mechanism's
``randomize`` + ``estimate`` on a small BSVS instance and reports the per-bucket
sup-norm error next to the mechanism's own (eta, beta) bound ``error_bound``.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import optimize, special, stats

from rknn_ray.errors import ConfigError
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms.collision import CollisionMechanism, collision_rates, decode_reports
from rknn_ray.mechanisms.randomized_response import RandomizedResponse

COMMON_CELL, DIFF_CELL = 0, 1          # flat cells of (query 0, class 0) and (query 0, class 1)
CHUNK_REPORTS = 1 << 20                 # client reports randomized per call


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval for a binomial proportion."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def _eps_lb(k0: int, k1: int, m: int, delta: float, alpha: float) -> float:
    p0_lo, _ = clopper_pearson(k0, m, alpha / 2)
    _, p1_hi = clopper_pearson(k1, m, alpha / 2)
    return math.log((p0_lo - delta) / p1_hi) if p0_lo > delta and p1_hi > 0 else -math.inf


def max_certifiable_eps(trials: int, delta: float, alpha: float = 0.05) -> float:
    """Largest eps_lb ``trials`` trials can certify (all D0 rejected, no D1): the power ceiling."""
    m = trials - trials // 2
    return max(0.0, _eps_lb(m, 0, m, delta, alpha))


def threshold_test(s0: np.ndarray, s1: np.ndarray, delta: float,
                   alpha: float = 0.05) -> tuple[float, int, int, int, float]:
    """Reject "D1" when the statistic >= t; (t, k0, k1, m, eps_lb) on the held-out half.

    t maximises the Clopper-Pearson lower bound on the first half (a point estimate
    would pick noisy extreme tails); the bound is certified on the second half only.
    """
    half = min(s0.size, s1.size) // 2
    a0, a1 = np.sort(s0[:half]), np.sort(s1[:half])
    cands = np.unique(np.quantile(a0, np.linspace(0.3, 0.9999, 80), method="lower"))
    best_t, best_v = float(cands[0]), -math.inf
    for t in cands:
        k0 = half - int(np.searchsorted(a0, t, side="left"))
        k1 = half - int(np.searchsorted(a1, t, side="left"))
        v = _eps_lb(k0, k1, half, delta, alpha)
        if v > best_v:
            best_t, best_v = float(t), v
    b0, b1 = s0[half:], s1[half:]
    m = min(b0.size, b1.size)
    k0, k1 = int(np.sum(b0[:m] >= best_t)), int(np.sum(b1[:m] >= best_t))
    return best_t, k0, k1, m, max(0.0, _eps_lb(k0, k1, m, delta, alpha))


@dataclass
class AuditResult:
    n: int
    eps0: float
    delta: float
    trials: int
    threshold: float
    p0_hat: float
    p1_hat: float
    eps_lower_empirical: float
    claimed_upper: dict
    red_flags: list
    confidence: float
    mechanism: str = "binary_rr"
    model: str = "local"
    statistic: str = "count of 0-reports"
    eps_pair_exact: float | None = None   # exact eps of the audited pair (infinite trials)
    eps_lb_expected: float | None = None  # power: eps_lb at the mean counts, best threshold
    eps_lb_max: float | None = None       # ceiling the trial count allows (all vs none)
    seconds: float = 0.0
    notes: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _flags(eps_lb: float, claimed_upper: dict) -> list:
    return [name for name, ub in claimed_upper.items() if ub is not None and eps_lb > ub]


# ----------------------------------------------------------- reference: binary RR

def binary_rr_shuffled_zero_counts(first_bit: int, n: int, eps0: float, trials: int,
                                   rng: np.random.Generator) -> np.ndarray:
    """Count of 0-reports in the shuffled output of n binary-RR users (others hold 1)."""
    keep = math.exp(eps0) / (math.exp(eps0) + 1.0)
    flip = 1.0 - keep
    others = rng.binomial(n - 1, flip, size=trials)          # others hold 1: report 0 w.p. flip
    p_first_zero = keep if first_bit == 0 else flip
    return others + (rng.random(trials) < p_first_zero)


def audit_binary_rr(n: int, eps0: float, delta: float, claimed_upper: dict,
                    trials: int = 1_000_000, alpha: float = 0.05,
                    rng: np.random.Generator | None = None,
                    pair_eps: float | None = None) -> AuditResult:
    """Empirical lower bound on the shuffled eps of binary RR vs claimed upper bounds.

    Neighbours: user 1 holds 0 vs 1, the other n-1 hold 1; the test rejects when the
    count of zeros is large (the likelihood ratio is monotone in it). ``pair_eps``:
    the exact eps of this pair (the ``lower_bound`` bound) if known, else computed.
    """
    rng = rng or np.random.default_rng()
    t0 = time.perf_counter()
    c0 = binary_rr_shuffled_zero_counts(0, n, eps0, trials, rng)
    c1 = binary_rr_shuffled_zero_counts(1, n, eps0, trials, rng)
    t, k0, k1, m, eps_lb = threshold_test(c0, c1, delta, alpha)
    T, P0, P1 = binary_rr_pair_law(n, eps0)
    if pair_eps is None:
        pair_eps = law_eps(P0, P1, delta, eps0 + 1.0)
    return AuditResult(n, eps0, delta, trials, t, k0 / m, k1 / m, eps_lb, dict(claimed_upper),
                       _flags(eps_lb, claimed_upper), 1 - alpha, eps_pair_exact=pair_eps,
                       eps_lb_expected=expected_certified_eps(T, P0, P1, trials, delta, alpha),
                       eps_lb_max=max_certifiable_eps(trials, delta, alpha),
                       seconds=time.perf_counter() - t0)


# ----------------------------------------------------------- real randomizers

def _check_auditable(mech) -> None:
    p = mech.params
    if not isinstance(mech, (RandomizedResponse, CollisionMechanism)):
        raise ConfigError("audit.mechanism", f"no report decoder for {type(mech).__name__}",
                          "audit a randomized-response or Collision mechanism")
    if p.k != 1 or p.r != 1 or p.num_classes < 2:
        raise ConfigError("audit.mechanism", f"the audit pair needs k = r = 1 and |Y| >= 2, "
                          f"got k={p.k}, r={p.r}, |Y|={p.num_classes}",
                          "build the mechanism with k=1, r=1 (e.g. s=2, |Y|=2)")


def pair_report_classes(mech, payloads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(plus, minus) per report: hits the differing cell only / the common cell only.

    RR: the report's bits of the two cells (``np.unpackbits``); Collision: z against
    the two cells' hashes under the report's own seed (``decode_reports`` +
    ``oracle.hits``).
    """
    if isinstance(mech, CollisionMechanism):
        seeds, (z,) = decode_reports(payloads, [mech.oracle.z_bytes])
        hits = mech.oracle.hits(seeds, z)
    else:
        hits = np.unpackbits(payloads, axis=1, count=mech.params.num_cells).astype(bool)
    hd, hc = hits[:, DIFF_CELL], hits[:, COMMON_CELL]
    return hd & ~hc, hc & ~hd


def shuffled_pair_statistics(mech, n: int, trials: int,
                             rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Optimal-test statistic T of each trial's shuffled reports under D0 and D1.

    Runs ``mech.randomize`` on trials * (n + 1) one-record clients, in chunks.
    """
    _check_auditable(mech)
    p = mech.params
    e = math.exp(mech.local_eps)
    wp, wm = e - 1.0, 1.0 - 1.0 / e
    per = n + 1
    step = max(1, CHUNK_REPORTS // per)
    s0, s1 = np.empty(trials), np.empty(trials)
    for a in range(0, trials, step):
        b = min(trials, a + step)
        t = b - a
        labels = np.zeros((t, per), dtype=np.int64)
        labels[:, n] = DIFF_CELL
        answers = RecordAnswers(np.zeros((t * per, 1), dtype=np.int64), labels.reshape(-1, 1),
                                np.arange(t * per, dtype=np.int64), p.num_queries, p.num_classes)
        plus, minus = pair_report_classes(mech, mech.randomize(answers, rng).payloads)
        plus, minus = plus.reshape(t, per), minus.reshape(t, per)
        cp, cm = plus[:, :n - 1].sum(axis=1), minus[:, :n - 1].sum(axis=1)   # shared others
        s0[a:b] = (cp + plus[:, n]) * wp - (cm + minus[:, n]) * wm          # client 0 differs
        s1[a:b] = (cp + plus[:, n - 1]) * wp - (cm + minus[:, n - 1]) * wm  # client 0 common
    return s0, s1


def pair_class_probabilities(mech) -> tuple[tuple[float, float], tuple[float, float]]:
    """Exact (P[+], P[-]) of one report from the common and from the differing record.

    Collision: with an ideal hash, the two cells collide w.p. 1/l (then neither class);
    pi is the sampler's exact hit probability (e^eps/Omega rounded toward privacy).
    """
    _check_auditable(mech)
    eps = mech.local_eps
    if isinstance(mech, CollisionMechanism):
        l = mech.l
        pi, _ = collision_rates(eps, l, 1)
        lo, hi = (1 - 1 / l) * (1 - pi) / (l - 1), (1 - 1 / l) * pi
    else:
        q = mech.flip_probability
        lo, hi = q * q, (1 - q) ** 2
    return (lo, hi), (hi, lo)


def _trinomial_logpmf(m: int, i: np.ndarray, j: np.ndarray, a: float, b: float) -> np.ndarray:
    rest = m - i - j
    ok = (i >= 0) & (j >= 0) & (rest >= 0)
    ii, jj, rr = np.where(ok, i, 0), np.where(ok, j, 0), np.where(ok, rest, 0)
    log_rest = math.log1p(-a - b) if a + b < 1 else -math.inf
    out = (special.gammaln(m + 1) - special.gammaln(ii + 1) - special.gammaln(jj + 1)
           - special.gammaln(rr + 1) + ii * math.log(a) + jj * math.log(b)
           + (rr * log_rest if log_rest > -math.inf else np.where(rr > 0, -np.inf, 0.0)))
    return np.where(ok, out, -np.inf)


def pair_law(n: int, common: tuple[float, float], diff: tuple[float, float],
             eps0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact law of (#+, #-) over n reports under D0 and D1: (T, P0, P1), flattened.

    T is the test statistic of :func:`shuffled_pair_statistics` for each (#+, #-).
    Covers a window holding all but ~1e-15 of the mass.
    """
    a, b = common
    a0, b0 = diff

    def window(p):
        lo = int(stats.binom.ppf(1e-16, n, p))
        return max(0, lo - 1), int(stats.binom.isf(1e-16, n, p)) + 1

    (il, ih), (jl, jh) = window(a), window(b)
    i = np.arange(il, ih + 1)[:, None]
    j = np.arange(jl, jh + 1)[None, :]
    P1 = np.exp(_trinomial_logpmf(n, i, j, a, b))
    M = lambda di, dj: np.exp(_trinomial_logpmf(n - 1, i - di, j - dj, a, b))  # noqa: E731
    P0 = a0 * M(1, 0) + b0 * M(0, 1) + (1 - a0 - b0) * M(0, 0)
    e = math.exp(eps0)
    T = np.broadcast_to(i * (e - 1.0) - j * (1.0 - 1.0 / e), P1.shape)
    return T.ravel(), P0.ravel(), P1.ravel()


def binary_rr_pair_law(n: int, eps0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(count of 0-reports, P0, P1) of the :func:`audit_binary_rr` pair, exactly."""
    flip = 1.0 / (math.exp(eps0) + 1.0)
    lo = max(0, int(stats.binom.ppf(1e-16, n - 1, flip)))
    c = np.arange(lo, int(stats.binom.isf(1e-16, n - 1, flip)) + 2)
    B_same, B_prev = stats.binom.pmf(c, n - 1, flip), stats.binom.pmf(c - 1, n - 1, flip)
    return (c.astype(float), (1 - flip) * B_prev + flip * B_same,
            flip * B_prev + (1 - flip) * B_same)


def law_eps(P0: np.ndarray, P1: np.ndarray, delta: float, eps_max: float) -> float:
    """eps(delta) of a pair of laws on one space (hockey-stick, both directions)."""
    def d(eps):
        ee = math.exp(eps)
        return max(float(np.maximum(P0 - ee * P1, 0).sum()),
                   float(np.maximum(P1 - ee * P0, 0).sum())) - delta

    if d(0.0) <= 0:
        return 0.0
    return float(optimize.brentq(d, 0.0, eps_max, xtol=1e-10))


def exact_pair_eps(n: int, common: tuple[float, float], diff: tuple[float, float],
                   delta: float, eps_max: float) -> float:
    """Exact eps(delta) of the pair: (#+, #-) of n reports, client 0 differing or not.

    (#+, #-) is sufficient (it determines the likelihood ratio), so this is the eps of
    the full shuffled multisets.
    """
    _, P0, P1 = pair_law(n, common, diff, 1.0)
    return law_eps(P0, P1, delta, eps_max)


def expected_certified_eps(T: np.ndarray, P0: np.ndarray, P1: np.ndarray, trials: int,
                           delta: float, alpha: float = 0.05) -> float:
    """The audit's power: eps_lb certified when every held-out count equals its mean,
    for the best threshold on the exact law (statistic T, laws P0 / P1)."""
    m = trials - trials // 2
    order = np.argsort(-T, kind="stable")
    t0, t1 = np.cumsum(P0[order]), np.cumsum(P1[order])        # P[T >= T_(k)]
    levels = np.unique(np.searchsorted(t1, np.geomspace(0.1 / m, 1.0, 300)))
    levels = levels[levels < T.size]
    best = 0.0
    for k in levels:
        k0, k1 = int(round(m * min(1.0, t0[k]))), int(round(m * min(1.0, t1[k])))
        best = max(best, _eps_lb(k0, k1, m, delta, alpha))
    return best


def audit_from_statistics(mech, n: int, s0: np.ndarray, s1: np.ndarray, delta: float,
                          claimed_upper: dict, alpha: float = 0.05,
                          seconds: float = 0.0) -> AuditResult:
    """Certify eps_lb from statistics of :func:`shuffled_pair_statistics` at one delta.

    (The randomizer does not depend on delta, so one run serves every delta.)
    """
    t0 = time.perf_counter()
    t, k0, k1, m, eps_lb = threshold_test(s0, s1, delta, alpha)
    eps0 = float(mech.local_eps)
    T, P0, P1 = pair_law(n, *pair_class_probabilities(mech), eps0)
    pair = law_eps(P0, P1, delta, eps0 + 1.0)
    flags = _flags(eps_lb, claimed_upper)
    flags += [f"{name} (exact pair eps)" for name, ub in claimed_upper.items()
              if ub is not None and pair > ub * (1 + 1e-9)]
    notes = ["Collision pair eps assumes an ideal hash (collision prob 1/l)"] \
        if hasattr(mech, "oracle") else []
    return AuditResult(n, eps0, delta, int(s0.size), t, k0 / m, k1 / m, eps_lb,
                       dict(claimed_upper), flags, 1 - alpha, mechanism=mech.name,
                       model=mech.model, statistic="likelihood ratio of (#+, #-) reports",
                       eps_pair_exact=pair,
                       eps_lb_expected=expected_certified_eps(T, P0, P1, int(s0.size), delta,
                                                              alpha),
                       eps_lb_max=max_certifiable_eps(int(s0.size), delta, alpha),
                       seconds=seconds + time.perf_counter() - t0, notes=notes)


def audit_mechanism(mech, n: int, delta: float, claimed_upper: dict, trials: int = 20_000,
                    alpha: float = 0.05, rng: np.random.Generator | None = None) -> AuditResult:
    """Audit a real RR / Collision mechanism (k = r = 1) shuffled among n clients.

    ``claimed_upper``: bound name -> central eps claimed at this eps0, n, delta. Red
    flags: a claim below the certified eps_lb, or below the pair's exact eps.
    """
    if n < 2 or trials < 4:
        raise ConfigError("audit", f"need n >= 2 clients and trials >= 4, got n={n}, "
                          f"trials={trials}", "raise n or trials")
    rng = rng or np.random.default_rng()
    t0 = time.perf_counter()
    s0, s1 = shuffled_pair_statistics(mech, n, trials, rng)
    return audit_from_statistics(mech, n, s0, s1, delta, claimed_upper, alpha,
                                 seconds=time.perf_counter() - t0)


# ----------------------------------------------------------- BSVS labeling error

def bsvs_answers(n: int, num_queries: int, num_classes: int,
                 shares: tuple = (0.3, 0.2)) -> RecordAnswers:
    """n one-record clients (k = r = 1) on a small BSVS instance.

    Query t gets n/s records; its classes t, t+1, ... (mod |Y|) hold ``shares`` of them
    (majority 30%, runner-up 20% by default: a margin of 10% of n/s, so the label can
    flip at small n) and the rest are spread evenly over the remaining classes.
    """
    if len(shares) >= num_classes or sum(shares) > 1:
        raise ConfigError("bsvs.shares", f"shares {shares} do not fit {num_classes} classes",
                          "give fewer than |Y| shares summing to <= 1")
    q = np.arange(n, dtype=np.int64) % num_queries
    per = np.bincount(q, minlength=num_queries)
    pos = np.arange(n, dtype=np.int64) // num_queries           # rank within its query
    edges = np.floor(np.cumsum(shares)[None, :] * per[:, None]).astype(np.int64)  # (s, m)
    rank = (pos[:, None] >= edges[q]).sum(axis=1)               # index of its share, or m
    rest = num_classes - len(shares)
    offset = np.where(rank < len(shares), rank,
                      len(shares) + (pos - edges[q, -1]) % rest)
    y = (q + offset) % num_classes
    order = np.argsort(q, kind="stable")
    return RecordAnswers(q[order, None], y[order, None], np.arange(n, dtype=np.int64),
                         num_queries, num_classes)


def simulate_labeling_error(mech, answers: RecordAnswers, trials: int,
                            rng: np.random.Generator, beta: float = 0.05) -> dict:
    """Run ``mech.randomize`` + ``mech.estimate`` ``trials`` times on ``answers``.

    Returns the theory (``eta_theory`` = ``mech.error_bound(beta, n)``, the paper's
    theorem; ``eta_bernstein``, the rigorous Bernstein bound), the simulated
    per-bucket sup-norm error (mean and (1-beta)-quantile), the number of (trial,
    bucket) pairs with sup error >= eta (each bound promises a fraction <= beta), and
    the argmax label error rate.
    """
    n = answers.num_clients
    truth = answers.counts().astype(float)
    top = np.argmax(truth, axis=1)
    sup, flips = [], []
    for _ in range(trials):
        batch = mech.randomize(answers, rng)
        est = mech.estimate(batch.payloads, len(batch), rng)
        sup.append(np.abs(est - truth).max(axis=1))
        flips.append(np.argmax(est, axis=1) != top)
    sup, flips = np.concatenate(sup), np.concatenate(flips)
    eta = float(mech.error_bound(beta, n))
    eta_b = float(mech.error_bound(beta, n, method="bernstein"))
    exceed = int(np.sum(sup >= eta))
    return {"mechanism": mech.name, "eps0": float(mech.local_eps), "n": n, "beta": beta,
            "trials": trials, "buckets": int(sup.size),
            "eta_theory": eta, "eta_over_n": eta / n,
            "eta_bernstein": eta_b, "exceed_bernstein_count": int(np.sum(sup >= eta_b)),
            "sup_err_mean": float(sup.mean()),
            "sup_err_q": float(np.quantile(sup, 1 - beta)),
            "exceed_count": exceed, "exceed_rate": exceed / sup.size,
            "label_error_sim": float(flips.mean())}

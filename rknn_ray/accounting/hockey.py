"""Exact hockey-stick divergences of the shuffle reductions, in bounded work.

Every numerical bound in this package reduces the shuffled output to a pair of
distributions over counts and evaluates

    delta(eps) = sum_x max(0, P0(x) - e^eps P1(x))

*exactly* (no Monte Carlo), with the tail it skips added back on the safe side.

The reduction ("blanket" pair).  User 1 holds x0 or x1; each of the other n-1 users
independently lands in bucket "0" w.p. r, "1" w.p. r, elsewhere w.p. 1-2r.  User 1
lands in "0" / "1" / "*" with probabilities (p a, a, g) under x0 and (a, p a, g)
under x1 (p = e^eps0).  The adversary sees a = #"0" and m = #"0" + #"1".

* Hiding Among the Clones (FMT 2021, Thm 3.2): a = 1/(p+1), g = 0, 2r = e^-eps0.
* Variation-ratio (Wang et al., VLDB 2024), generic eps0-LDP: a = 1/(p+1), g = 0,
  r = 1/(p+1).
* ``merged`` mechanism-specific pairs (g > 0, user 1's "*" counted like a blanket
  message): used here only as a *lower* bound, see :mod:`rknn_ray.accounting.bounds`.

Closed form per m (derived in the module's tests by brute force): with B_j(t) the
Bin(j, 1/2) survival P[X >= t], W1 = P[Bin(n-1, 2r) = m-1], W0 = P[Bin(n-1,2r) = m],
the positive part of P0 - e^eps P1 at fixed m is a tail a >= a0(m) (the likelihood
ratio is increasing in a), so

    D(m) = W1 [ (p a - e^eps a) pmf_{m-1}(a0-1) + a (p+1)(1-e^eps) B_{m-1}(a0) ]
           + (1 - e^eps) g W0 B_m(a0).

Work is bounded: m runs over a window of Bin(n-1, 2r) holding all but ``tail``
of its mass (about 2 * 9 sigma wide), so n = 1e8 costs ~1e5 vectorised terms; the
binomials along it come from :mod:`rknn_ray.accounting.binom_fast` (a threshold path
walked by exact recurrences), with their error bounds added on the safe side.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# scipy is imported in the functions that use it: an opener or a client shard unpickles
# mechanisms that refer to this module and never calls them (an eager import would cost
# each such process seconds of CPU before its first report)

from rknn_ray.accounting.binom_fast import binom_logpmf, half_pmf_path, half_sf_path, pmf_rtol

# Mass of Bin(n-1, 2r) left outside the summation window. The skipped terms are
# bounded by this mass and added to every *upper* bound (safe side).
TAIL_MASS = 1e-18
# Absolute float slack per evaluated term (double rounding on values <= 1), added on the
# safe side as well; the fast path adds its own pmf / tail error bounds on top
# (binom_fast), the scipy reference path only this (scipy's binomial loses ~2e-15 m
# relative, so that path is exact to 1e-9 only for n up to ~3e4).
FLOAT_SLACK_PER_TERM = 1e-16
# Smallest delta the numerical bounds accept: below it the slack above dominates.
MIN_DELTA = 1e-13


@dataclass(frozen=True)
class BlanketPair:
    """The reduced pair: user-1 weights (p*a, a, g) vs (a, p*a, g); blanket r; n users."""
    p: float      # e^eps0
    a: float      # weight of the "other" informative bucket
    g: float      # weight of the non-informative bucket "*" (0 for generic eps0-LDP)
    r: float      # probability that one other user lands in bucket "0" (and in "1")
    n: int

    def __post_init__(self):
        if not (self.p > 1.0):
            raise ValueError("p = e^eps0 must be > 1 (eps0 > 0)")
        if not (0.0 < self.r <= 0.5):
            raise ValueError(f"blanket probability r={self.r} must be in (0, 1/2]")
        tot = (self.p + 1.0) * self.a + self.g
        if not (self.a > 0 and self.g >= 0 and abs(tot - 1.0) < 1e-9):
            raise ValueError("user-1 weights (p a, a, g) must be a distribution")
        if self.n < 1:
            raise ValueError("n must be >= 1")


def _window(n_others: int, q: float, tail: float, exact_out: bool = True) -> tuple[int, int, float]:
    """[lo, hi] holding all but ``tail`` mass of Bin(n_others, q); returns the mass left out.

    Bernstein's inequality P[|X - mu| >= t] <= 2 exp(-t^2 / (2 (var + t/3))) sizes the
    window: t solves 2 exp(.) = tail, so each side outside [mu - t, mu + t] (a superset
    of what [lo, hi] leaves out) holds <= tail / 2; that bound, for the sides actually
    cut, is the returned mass unless
    ``exact_out`` asks scipy's binomial CDF for the exact value (the reference path).
    """
    if n_others == 0:
        return 0, 0, 0.0
    mu, var = n_others * q, n_others * q * (1.0 - q)
    L = math.log(2.0 / tail)
    t = L / 3.0 + math.sqrt((L / 3.0) ** 2 + 2.0 * var * L)
    lo = int(max(0, math.floor(mu - t) - 1))
    hi = int(min(n_others, math.ceil(mu + t) + 1))
    if not exact_out:
        # one-sided Bernstein: each side left out holds <= tail / 2
        return lo, hi, 0.5 * tail * ((lo > 0) + (hi < n_others))
    from scipy import stats  # defers scipy
    out = float(stats.binom.cdf(lo - 1, n_others, q) + stats.binom.sf(hi, n_others, q))
    return lo, hi, out


class PairDelta:
    """delta(eps) of one :class:`BlanketPair`, with precomputed binomial weights.

    ``delta(eps)`` returns (estimate, err_up, err_down): the true value lies in
    [estimate - err_down, estimate + err_up]. Dropped window terms are nonnegative,
    so only the float slack counts downwards; the skipped mass counts upwards.

    ``method="fast"`` (default): Loader pmfs and recurrence tails
    (:mod:`rknn_ray.accounting.binom_fast`) with their error bounds added to both
    errors. ``method="scipy"``: scipy.stats' binomial per call, the reference path
    the fast one is tested against.
    """

    def __init__(self, pair: BlanketPair, tail: float = TAIL_MASS, method: str = "fast"):
        if method not in ("fast", "scipy"):
            raise ValueError(f"method must be 'fast' or 'scipy', got {method!r}")
        self.pair, self.method = pair, method
        n1 = pair.n - 1
        q = min(1.0, 2.0 * pair.r)
        lo, hi, out = _window(n1, q, tail, exact_out=method == "scipy")
        # m = total in {0,1} including user 1: W1 needs m-1 in [lo, hi], W0 needs m.
        m = np.arange(max(lo, 1), hi + 2, dtype=np.int64)
        self.m = m
        if n1 > 0 and q < 1.0:
            if method == "scipy":
                from scipy import stats  # defers scipy
                lp1, lp0 = stats.binom.logpmf(m - 1, n1, q), stats.binom.logpmf(m, n1, q)
            else:
                lp1, lp0 = binom_logpmf(m - 1, n1, q), binom_logpmf(m, n1, q)
            self.w1, self.w0 = np.exp(lp1), np.exp(lp0)
        else:
            self.w1 = (m - 1 == min(n1, n1 * q)).astype(float)
            self.w0 = (m == min(n1, n1 * q)).astype(float)
        # W0/W1 in closed form (stable where both underflow): (n-m)/m * q/(1-q)
        with np.errstate(divide="ignore", invalid="ignore"):
            self.w0_over_w1 = np.where(q < 1.0, (pair.n - m) / m * q / max(1e-300, 1 - q), 0.0)
        self.skipped = out
        self.slack = FLOAT_SLACK_PER_TERM * (4 * m.size + 16)
        # relative error of the fast weights (Loader pmf, |m - mean| <= window)
        self.w_rtol = 0.0 if method == "scipy" else pmf_rtol(max(abs(m[0] - n1 * q), abs(m[-1] - n1 * q)) + 1)

    def delta(self, eps: float) -> tuple[float, float, float]:
        P, m = self.pair, self.m
        ee = math.exp(eps)
        a, p, g = P.a, P.p, P.g
        # threshold: positive part iff a_idx > a_star (likelihood ratio increasing in a_idx)
        c1 = a * (p * ee - 1.0) * m + (ee - 1.0) * g * self.w0_over_w1 * m / 2.0
        a_star = c1 / (a * (p - 1.0) * (1.0 + ee))
        a0 = np.floor(a_star).astype(np.int64) + 1
        a0 = np.clip(a0, 0, m + 1)
        if self.method == "scipy":
            from scipy import stats  # defers scipy
            pmf = stats.binom.pmf(a0 - 1, m - 1, 0.5)
            sf_m1 = stats.binom.sf(a0 - 1, m - 1, 0.5)       # P[Bin(m-1) >= a0]
            sf_m = stats.binom.sf(a0 - 1, m, 0.5) if g > 0 else None
            err1 = err0 = pmf_rel = 0.0
        else:
            pmf, pmf_rel = half_pmf_path(m - 1, a0 - 1)
            sf_m1, err1 = half_sf_path(m - 1, a0, pmf_below=pmf, pmf_rel=pmf_rel)
            sf_m, err0 = half_sf_path(m, a0) if g > 0 else (None, 0.0)
        A = (p - ee) * a * self.w1 * pmf
        B = a * (p + 1.0) * (1.0 - ee) * self.w1 * sf_m1
        term = A + B
        if g > 0:
            C = (1.0 - ee) * g * self.w0 * sf_m
            term = term + C
        est = float(np.sum(np.maximum(term, 0.0)))
        slack = self.slack
        if self.method == "fast":
            # every term moves by at most: relative pmf/weight errors on |A|, |B|, |C|,
            # plus the tails' absolute errors times their coefficients (max(0, .) is
            # 1-Lipschitz, the weights sum to <= 1)
            rel = self.w_rtol + pmf_rel
            mag = np.abs(A) + np.abs(B) + (np.abs(C) if g > 0 else 0.0)
            slack += (2.0 * rel * float(np.sum(mag))
                      + a * (p + 1.0) * abs(1.0 - ee) * err1 + abs(1.0 - ee) * g * err0)
        return est, self.skipped + slack, slack


def eps_for_delta(pd: PairDelta, delta: float, eps_hi: float, upper: bool,
                  tol_eps: float = 1e-7, rtol: float = 1e-6) -> float:
    """Bisection on the monotone map eps -> delta(eps), erring on the requested side.

    ``upper=True``: the smallest eps (to min(tol_eps, rtol * eps), rounded up) with
    estimate + err <= delta, i.e. a certified upper bound on the true eps.
    ``upper=False``: the largest eps with estimate - err > delta (a certified lower
    bound); 0.0 if none.
    """
    from scipy import optimize  # defers scipy
    def exceeds(e: float) -> bool:
        est, up, down = pd.delta(e)
        return (est + up > delta) if upper else (est - down > delta)

    lo, hi = 0.0, float(eps_hi)
    if not exceeds(0.0):
        return 0.0
    if exceeds(hi):              # upper: cannot certify below eps_hi (trivial bound)
        return hi
    # delta(eps) is continuous and decreasing: Brent's method finds the crossing in
    # ~10 evaluations; the final bracket is then checked so the answer errs safe.
    def f(e: float) -> float:
        est, up, down = pd.delta(e)
        return (est + up if upper else est - down) - delta

    root = optimize.brentq(f, lo, hi, xtol=1e-13, rtol=rtol * 1e-2)
    step = max(1e-13, min(tol_eps, rtol * root))
    if upper:
        e = min(hi, root + step)
        while exceeds(e) and e < hi:
            step *= 4
            e = min(hi, root + step)
        return e
    e = max(0.0, root - step)
    while not exceeds(e) and e > 0.0:
        step *= 4
        e = max(0.0, root - step)
    return e

"""Privacy amplification by shuffling: upper bounds, a lower bound, and their inverses.

Each bound maps (eps0, n, delta) -- n users each applying an eps0-LDP randomizer,
outputs shuffled -- to a central eps with (eps, delta)-DP, and back:
``local_eps0(target_eps, n, delta)`` is the largest eps0 the bound certifies.

Bounds (``BOUNDS``), from loosest to tightest:

* ``fmt_closed_form`` -- Feldman, McMillan, Talwar, "Hiding Among the Clones"
  (FOCS 2021), exactly as paper 000 ("Shuffle Private Mechanisms") states it:
  eps = log(1 + (8 sqrt(e^eps0 log(4/delta)) / sqrt(n) + 8 e^eps0 / n) (e^eps0-1)/(e^eps0+1)),
  valid when eps0 <= log(n / (16 log(2/delta))).  ``fmt_closed_form_final`` is the
  final version's refined constant (the factor (1 - e^-eps0)/(1 + e^-(eps0+eps1)),
  eps1 = log(1 + 8 sqrt(.)/sqrt(n) + 8 e^eps0/n)); it is slightly larger.
* ``clones_numerical`` -- the same paper's numerical bound: the exact hockey-stick
  divergence of the clone pair (user 1 vs n-1 users who are clones w.p. e^-eps0),
  computed exactly here (:mod:`rknn_ray.accounting.hockey`), not by the interval
  stepping of the authors' script, whose upper branch reuses one endpoint.
* ``variation_ratio`` -- Wang et al., "Unified, Simplified, and Tightened Privacy
  Amplification in the Shuffle Model" (VLDB 2024), generic eps0-LDP parameters
  (p, beta, q) = (e^eps0, (e^eps0-1)/(e^eps0+1), e^eps0): blanket probability
  r = 1/(e^eps0+1) per side instead of e^-eps0/2.
* ``lower_bound`` -- what an optimal attacker provably achieves against one concrete
  eps0-LDP randomizer (binary randomized response, the other n-1 users holding the
  same value as user 1's alternative): its exact eps.  No upper bound for generic
  eps0-LDP can be below it.

Order (theorems; tested on a grid): lower_bound <= variation_ratio <= clones_numerical
<= fmt_closed_form_final.  variation_ratio <= clones_numerical because 1/(p+1) >=
1/(2p): more blanket is a post-processing of less.  clones_numerical <= FMT closed
form because the closed form bounds the same divergence.  Paper 000's constant is not
guaranteed (the final version corrected it upward), so the test checks numerical
<= paper-000 form only where it holds, and says so.

Mechanism-specific (``variation_ratio_bound``): see :class:`VariationRatioBound`.

Numerical tolerance: every numerical eps is rounded to the safe side -- an upper
bound is the smallest eps whose delta(eps) *plus* the skipped tail mass (<= 1e-18),
float slack and the binomials' error bounds (:mod:`rknn_ray.accounting.binom_fast`)
is <= delta, to relative precision 1e-6 of eps; a lower bound uses delta(eps) minus
the float slack and error bounds.  delta must be >= 1e-13.

Mechanism lower bounds (``MechanismLowerBound``, ``VariationRatioBound.lower``): exact
divergences of shuffled k-RR / Collision (c = 1) for named neighbouring pairs
(:mod:`rknn_ray.accounting.shuffled_rr`); the generic one is ``lower_bound``.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

import numpy as np

# scipy is imported in the functions that use it: an opener or a client shard unpickles
# mechanisms that refer to this module and never calls them (an eager import would cost
# each such process seconds of CPU before its first report)

from rknn_ray.accounting.binom_fast import binom_logpmf, pmf_rtol
from rknn_ray.accounting.hockey import (MIN_DELTA, BlanketPair, PairDelta, FLOAT_SLACK_PER_TERM,
                                        TAIL_MASS, _window, eps_for_delta)
from rknn_ray.accounting.calibration import guided_edge
from rknn_ray.accounting.shuffle_pld import blanket_pair_chunks
from rknn_ray.accounting.shuffled_rr import (collision_pair, collision_third_value_pairs, exp_lo,
                                             krr_pair)
from rknn_ray.errors import ConfigError

EPS0_MAX = 30.0   # beyond this e^eps0 overflows the useful range of every bound


def _check(eps0: float | None, n: int, delta: float, numerical: bool = True) -> None:
    if eps0 is not None and not (math.isfinite(eps0) and 0.0 < eps0 <= EPS0_MAX):
        raise ConfigError("eps0", f"local eps0={eps0} is out of range",
                          f"use a finite eps0 in (0, {EPS0_MAX}]")
    if int(n) != n or n < 1:
        raise ConfigError("n", f"n={n} must be a positive integer (distinct senders)",
                          "pass the number of distinct clients actually shuffled")
    lo = MIN_DELTA if numerical else 0.0
    if not (lo < delta < 1.0):
        raise ConfigError("delta", f"delta={delta} is out of range",
                          f"use {lo:g} < delta < 1 (e.g. 1/n^1.1)")


class AmplificationBound(ABC):
    """A bound eps0 -> central eps; ``kind`` is 'upper' or 'lower'."""
    name = "abstract"
    kind = "upper"
    citation = ""

    @abstractmethod
    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        """Central eps at ``delta`` for n shuffled eps0-LDP reports."""

    def eps0_max(self, n: int, delta: float) -> float:
        """Largest eps0 the bound accepts (validity region)."""
        return EPS0_MAX

    def local_eps0(self, target_eps: float, n: int, delta: float,
                   rtol: float = 1e-6, guess: float | None = None) -> float:
        """Largest eps0 with central_eps(eps0) <= target_eps (rounded down: safe).

        A bracketing search on a monotone map; the returned eps0 itself satisfies the
        predicate. ``guess``: an eps0 near the answer (a calibration of a close bound): the
        search starts in a bracket of +-0.1% around it when that brackets the edge (only the
        cost changes, never what is granted). Raises ConfigError if no eps0 in the bound's
        range does.
        """
        if not (math.isfinite(target_eps) and target_eps > 0):
            raise ConfigError("target_eps", f"target eps={target_eps} must be > 0 and finite",
                              "pass a positive central eps")
        _check(None, n, delta, numerical=self.numerical)
        hi = self.eps0_max(n, delta)
        if hi <= 0:
            raise ConfigError("n", f"n={n} is too small for {self.name} at delta={delta}",
                              "increase n or use the 'clones_numerical' bound")
        target_log, memo = math.log(target_eps), {}

        def score(e: float) -> float:
            """log(central eps / target): <= 0 where eps0 = e is granted (memoized: the ends
            are checked here and again by the search)."""
            if e not in memo:
                memo[e] = math.log(max(self.central_eps(e, n, delta), 1e-300)) - target_log
            return memo[e]

        ok = lambda e: score(e) <= 0  # noqa: E731
        if guess is not None and 0 < guess < hi:
            a, b = max(guess * (1 - 1e-3), 1e-9), min(guess * (1 + 1e-3), hi)
            if ok(a) and not ok(b):
                return guided_edge(score, a, b, tol=rtol, relative=True)
        lo = min(target_eps, hi) if self.kind == "upper" and self.numerical else 0.0
        if lo > 0 and not ok(lo):
            lo = 0.0
        if ok(hi):
            return hi
        if lo == 0.0:
            # find any certified point by halving down from the top
            e = hi
            while e > 1e-9 and not ok(e):
                e /= 2
            if not ok(e):
                raise ConfigError("target_eps", f"{self.name} certifies no eps0 > 0 for "
                                  f"eps={target_eps}, n={n}, delta={delta}",
                                  "raise the target eps or delta, or increase n")
            lo, hi = e, min(hi, 2 * e)
        # guided by the score, smooth in eps0: about half the bound evaluations bisection
        # takes (the returned eps0 is one it evaluated and accepted)
        return guided_edge(score, lo, hi, tol=rtol, relative=True)

    numerical = True

    def describe(self) -> dict:
        return {"bound": self.name, "kind": self.kind, "citation": self.citation}

    def dominating_pair(self, eps0: float, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(log_p, log_q) over a common finite support: a pair of which the shuffled
        output on any neighbouring datasets is a post-processing, so composable over
        rounds as a PLD (:mod:`rknn_ray.accounting.shuffle_pld`); mass left out of the
        support is charged at the infinite loss there. Not every bound has one."""
        raise NotImplementedError(f"the {self.name} bound names no dominating pair")

    @property
    def has_pair(self) -> bool:
        """Whether :meth:`dominating_pair` is implemented (a round composes as its PLD)."""
        return type(self).dominating_pair is not AmplificationBound.dominating_pair


# --------------------------------------------------------------------- closed forms

class FMTClosedForm(AmplificationBound):
    """FMT closed form as paper 000 states it (or the final paper's constant)."""
    numerical = False

    def __init__(self, final: bool = False):
        self.final = final
        self.name = "fmt_closed_form_final" if final else "fmt_closed_form"
        self.citation = ("Feldman, McMillan, Talwar, Hiding Among the Clones, FOCS 2021, "
                         + ("Thm 3.1 (final version constant)" if final
                            else "Thm 3.1 as stated in paper 000"))

    def eps0_max(self, n: int, delta: float) -> float:
        v = n / (16.0 * math.log(2.0 / delta))
        return math.log(v) if v > 0 else -math.inf

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        _check(eps0, n, delta, numerical=False)
        limit = self.eps0_max(n, delta)
        if eps0 > limit:
            need = math.ceil(16.0 * math.log(2.0 / delta) * math.exp(eps0))
            raise ConfigError("eps0", f"the FMT closed form needs eps0 <= log(n / (16 log(2/delta)))"
                              f" = {limit:.4g}, got eps0={eps0:g} (n={n}, delta={delta:g})",
                              f"use n >= {need}, a smaller eps0, or the 'clones_numerical' bound")
        e = math.exp(eps0)
        s = 8.0 * math.sqrt(e * math.log(4.0 / delta)) / math.sqrt(n) + 8.0 * e / n
        if self.final:
            eps1 = math.log1p(s)
            factor = -math.expm1(-eps0) / (1.0 + math.exp(-eps0 - eps1))
        else:
            factor = (e - 1.0) / (e + 1.0)
        return math.log1p(s * factor)


# ----------------------------------------------------------------- numerical bounds

def _pair_delta(p: float, a: float, g: float, r: float, n: int, scale: float = 1.0):
    pd = PairDelta(BlanketPair(p, a, g, r, n))
    if scale == 1.0:
        return pd
    return _Scaled(pd, scale)


class _Scaled:
    """delta of a pair whose user-1 informative mass is ``scale`` (< 1) of a full pair."""

    def __init__(self, pd, scale):
        self.pd, self.scale = pd, scale

    def delta(self, eps):
        est, up, down = self.pd.delta(eps)
        return self.scale * est, self.scale * up, self.scale * down


class _BlanketPairBound(AmplificationBound):
    """A bound that is the divergence of one g = 0 blanket pair, blanket r(eps0): its pair
    dominates a round (the shuffled output is a post-processing of it), so rounds compose
    as its PLD."""

    def blanket(self, eps0: float) -> float:
        raise NotImplementedError

    def dominating_pair_chunks(self, eps0: float, n: int):
        """The pair in chunks of (log_p, log_q, loss, relative error) (shuffle_pld)."""
        _check(eps0, n, 0.5)
        p = math.exp(eps0)
        return blanket_pair_chunks(p, 1.0 / (p + 1.0), self.blanket(eps0), int(n))

    def dominating_pair(self, eps0: float, n: int) -> tuple[np.ndarray, np.ndarray]:
        parts = list(self.dominating_pair_chunks(eps0, n))
        return np.concatenate([c[0] for c in parts]), np.concatenate([c[1] for c in parts])


class ClonesNumerical(_BlanketPairBound):
    """FMT numerical bound: exact divergence of the clone pair (clone prob e^-eps0)."""
    name = "clones_numerical"
    citation = "Feldman, McMillan, Talwar, Hiding Among the Clones, FOCS 2021, Thm 3.2 / Sec. 5"

    def blanket(self, eps0: float) -> float:
        return math.exp(-eps0) / 2.0

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        _check(eps0, n, delta)
        p = math.exp(eps0)
        pd = _pair_delta(p, 1.0 / (p + 1.0), 0.0, math.exp(-eps0) / 2.0, n)
        return eps_for_delta(pd, delta, eps0, upper=True)


class VariationRatioBound(_BlanketPairBound):
    """Variation-ratio bound (Wang et al., VLDB 2024) for a named randomizer.

    Parameters (p, beta, q): p = e^eps0 bounds P0/P1, beta = TV(P0, P1), q = e^eps0
    bounds P0 / R(x) for every other input x. With a = beta/(p-1):
    P_b = p a Q_b + a Q_(1-b) + (1-(p+1)a) Q*, and each other user emits a Q0 / Q1
    sample w.p. r = p a / q each.

    * generic eps0-LDP: beta = (p-1)/(p+1) -> a = r = 1/(p+1), no "*" part; the pair
      is exact and this is the bound.
    * k-RR (k options): beta = (p-1)/(p+k-1); Collision (c cells, Bloom length l):
      beta = min(c, l-c)(p-1)/(c p + l - c).  These have a "*" part of mass
      g = 1-(p+1)a.  Wang et al.'s numerical procedure counts user 1's "*" output as
      one more blanket message ("merged"); exhaustive enumeration of shuffled k-RR
      (n = 3, 4; tests/test_accounting_bounds.py) shows that value is *below* the true
      delta, so it is not an upper bound. We keep the sound form: the "*" outcome is
      revealed to the adversary (it carries no information about b and cancels), giving
      delta = (p+1) a * delta_generic_pair(r = a), and report
      min(generic, that).  The merged value is a valid *lower* bound for k-RR (k >= 3;
      the others holding a third value, the two counts are a post-processing of the
      shuffled histogram) and is reported as ``lower``.
    """
    name = "variation_ratio"
    citation = ("Wang et al., Unified, Simplified, and Tightened Privacy Amplification in the "
                "Shuffle Model, VLDB 2024 (variation-ratio reduction)")

    def __init__(self, mechanism: str = "generic", **params):
        if mechanism not in ("generic", "krr", "collision"):
            raise ConfigError("mechanism", f"unknown mechanism {mechanism!r}",
                              "use 'generic', 'krr' (k=...) or 'collision' (c=..., l=...)")
        self.mechanism, self.params = mechanism, dict(params)
        if mechanism == "krr":
            k = params.get("k")
            if k is None or int(k) != k or k < 2:
                raise ConfigError("k", f"k-RR needs an integer k >= 2, got {k!r}",
                                  "pass k=<number of options>")
        if mechanism == "collision":
            c, l = params.get("c"), params.get("l")
            if c is None or l is None or c < 1 or l <= c:
                raise ConfigError("collision", f"Collision needs integers 1 <= c < l, got c={c}, l={l}",
                                  "pass c=k*r and l=<Bloom filter length>")
        if mechanism != "generic":
            self.name = f"variation_ratio_{mechanism}"

    def blanket(self, eps0: float) -> float:
        return 1.0 / (math.exp(eps0) + 1.0)

    def dominating_pair_chunks(self, eps0: float, n: int):
        """The generic pair (r = 1/(p+1)); a mechanism-specific bound names none (its
        value is the smaller of two pairs' divergences, not one pair's)."""
        if self.mechanism != "generic":
            raise NotImplementedError(f"the {self.name} bound names no dominating pair")
        return super().dominating_pair_chunks(eps0, n)

    @property
    def has_pair(self) -> bool:
        return self.mechanism == "generic"

    def informative_mass(self, eps0: float) -> float:
        """a = beta / (p - 1) for this mechanism."""
        p = math.exp(eps0)
        if self.mechanism == "generic":
            return 1.0 / (p + 1.0)
        if self.mechanism == "krr":
            return 1.0 / (p + self.params["k"] - 1.0)
        c, l = self.params["c"], self.params["l"]
        return min(c, l - c) / (c * p + l - c)

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        _check(eps0, n, delta)
        p = math.exp(eps0)
        generic = eps_for_delta(_pair_delta(p, 1 / (p + 1), 0.0, 1 / (p + 1), n), delta, eps0, True)
        if self.mechanism == "generic":
            return generic
        a = self.informative_mass(eps0)
        scale = (p + 1.0) * a
        if scale >= 1.0 - 1e-12:
            return generic
        specific = eps_for_delta(_pair_delta(p, 1 / (p + 1), 0.0, a, n, scale), delta, eps0, True)
        return min(generic, specific)

    def lower(self, eps0: float, n: int, delta: float) -> float | None:
        """A certified lower bound for this mechanism (None where none is implemented).

        k-RR: the larger of two explicit pairs, user 1 holding 0 vs 1 and the others
        (a) all holding 1: exact divergence of the shuffled histogram
        (:mod:`rknn_ray.accounting.shuffled_rr`); (b) all holding a third value (k >= 3):
        the divergence of the counts of 0 and 1 (the "merged" pair, a post-processing).
        Collision with c = 1: pair (a) on the hashed cells, and (b) counted on the reports
        that single out 0 or 1 (:func:`~rknn_ray.accounting.shuffled_rr.collision_third_value_pairs`).
        Generic: binary RR.
        """
        _check(eps0, n, delta)
        if self.mechanism == "generic":
            return RRLowerBound().central_eps(eps0, n, delta)
        if self.mechanism == "collision":
            if self.params["c"] != 1:
                return None
            l = self.params["l"]
            return max(eps_for_delta(pd, delta, eps0, upper=False)
                       for pd in [collision_pair(eps0, n, l)] + collision_third_value_pairs(eps0, n, l))
        k = self.params["k"]
        best = eps_for_delta(krr_pair(eps0, n, k), delta, eps0, upper=False)
        if k >= 3 and n >= 2:
            p = exp_lo(eps0)        # at most e^eps0 (a lower bound's side)
            a = 1.0 / (p + k - 1.0)
            pd = _pair_delta(p, a, 1.0 - (p + 1.0) * a, a, n)
            best = max(best, eps_for_delta(pd, delta, eps0, upper=False))
        return best


# ---------------------------------------------------------------------- lower bound

class _RRCountDelta:
    """Exact delta of shuffled binary RR, n-1 others all holding user 1's alternative.

    The count of "0" reports is I + Bin(n-1, 1/(p+1)), I ~ Bern(p/(p+1)) vs
    Bern(1/(p+1)); an optimal attacker thresholds it (likelihood ratio monotone).
    """

    def __init__(self, p: float, n: int, tail: float = TAIL_MASS, method: str = "fast"):
        q = 1.0 / (p + 1.0)
        self.pi0, self.pi1 = p / (p + 1.0), 1.0 / (p + 1.0)
        lo, hi, _ = _window(n - 1, q, tail, exact_out=False)
        k = np.arange(lo, hi + 2, dtype=np.int64)
        if n > 1:
            if method == "scipy":
                from scipy import stats  # defers scipy: the slow exactness path only
                lp_prev, lp_same = stats.binom.logpmf(k - 1, n - 1, q), stats.binom.logpmf(k, n - 1, q)
            else:
                lp_prev, lp_same = binom_logpmf(k - 1, n - 1, q), binom_logpmf(k, n - 1, q)
            self.b_prev, self.b_same = np.exp(lp_prev), np.exp(lp_same)
        else:
            self.b_prev, self.b_same = (k == 1).astype(float), (k == 0).astype(float)
        self.slack = FLOAT_SLACK_PER_TERM * (4 * k.size + 16)
        # relative error of the fast weights: moves each positive term by <= rel (P0 + e^eps P1)
        self.rel = 0.0 if method == "scipy" else pmf_rtol(max(abs(lo - (n - 1) * q), hi + 1 - (n - 1) * q))

    def delta(self, eps):
        ee = math.exp(eps)
        P0 = self.pi0 * self.b_prev + (1 - self.pi0) * self.b_same
        P1 = self.pi1 * self.b_prev + (1 - self.pi1) * self.b_same
        best, err = 0.0, 0.0
        for X, Y in ((P0, P1), (P1, P0)):
            diff = X - ee * Y
            pos = diff > 0
            d = float(np.sum(diff[pos]))
            if d >= best:
                best = d
                err = self.rel * float(np.sum(X[pos]) + ee * np.sum(Y[pos]))
        return best, self.slack + err, self.slack + err


class RRLowerBound(AmplificationBound):
    """Lower bound: the exact eps of one eps0-LDP randomizer (binary RR) when shuffled."""
    name = "lower_bound"
    kind = "lower"
    citation = ("exact hockey-stick of shuffled binary randomized response, worst-case "
                "neighbouring pair (cf. FMT 2021 Sec. 5 lower bounds; Wang et al. 2024)")

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        _check(eps0, n, delta)
        # binary RR at a ratio at most e^eps0 (exp_lo): a post-processing of RR at eps0
        return eps_for_delta(_RRCountDelta(exp_lo(eps0), n), delta, eps0, upper=False)


class MechanismLowerBound(AmplificationBound):
    """The lower bound of one randomizer (:meth:`VariationRatioBound.lower`) as a bound object."""
    name = "lower_bound"
    kind = "lower"

    def __init__(self, vr: VariationRatioBound):
        self.vr = vr
        if vr.mechanism == "krr":
            k = vr.params["k"]
            self.citation = (f"exact divergence of shuffled {k}-RR: user 1 holds 0 vs 1, the others "
                             "all hold 1" + (" (or all hold 2: counts of 0 and 1), the larger"
                                             if k >= 3 else ""))
        elif vr.mechanism == "collision" and vr.params["c"] == 1:
            self.citation = ("exact divergences of shuffled Collision (c=1): user 1 holds v vs v', "
                             "the others all hold v' (or all a third value: counts of the reports "
                             "that single out v or v'), the larger")
        else:
            self.citation = ("binary randomized response (a generic eps0-LDP randomizer), not "
                             f"{vr.mechanism}-specific: no {vr.mechanism} pair is implemented")

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        v = self.vr.lower(eps0, n, delta)
        return RRLowerBound().central_eps(eps0, n, delta) if v is None else v


BOUNDS: dict[str, AmplificationBound] = {
    "fmt_closed_form": FMTClosedForm(final=False),
    "fmt_closed_form_final": FMTClosedForm(final=True),
    "clones_numerical": ClonesNumerical(),
    "variation_ratio": VariationRatioBound("generic"),
    "lower_bound": RRLowerBound(),
}


def variation_ratio_bound(mechanism: str = "generic", **params) -> VariationRatioBound:
    """The variation-ratio bound for ``mechanism``: 'generic', 'krr' (k=), 'collision' (c=, l=)."""
    return VariationRatioBound(mechanism, **params)

"""The fast binomial machinery of the shuffle bounds against exact integers and the scipy path."""
import math
from fractions import Fraction

import numpy as np
import pytest

from rknn_ray.accounting import BOUNDS, variation_ratio_bound
from rknn_ray.accounting.binom_fast import (binom_logpmf, half_pmf_path, half_sf_path,
                                            half_sf_sum)
from rknn_ray.accounting.bounds import _RRCountDelta
from rknn_ray.accounting.hockey import BlanketPair, PairDelta, eps_for_delta


def _exact_half_pmf(m, k):
    return float(Fraction(math.comb(m, k), 2 ** m)) if 0 <= k <= m else 0.0


def _exact_half_sf(m, t):
    t = max(t, 0)
    return float(Fraction(sum(math.comb(m, j) for j in range(t, m + 1)), 2 ** m)) if t <= m else 0.0


@pytest.mark.parametrize("n,p", [(1, 0.3), (7, 0.5), (40, 0.1), (2000, 0.238), (50000, 0.5)])
def test_loader_logpmf_matches_exact_integers(n, p):
    P = Fraction(p)
    for k in sorted({0, 1, n // 3, int(n * p), int(n * p + 3 * math.sqrt(n * p)), n - 1, n}):
        if not 0 <= k <= n:
            continue
        exact = Fraction(math.comb(n, k)) * P ** k * (1 - P) ** (n - k)
        got = math.exp(binom_logpmf(np.array([k]), n, p)[0])
        if exact > Fraction(1, 10**300):
            assert got == pytest.approx(float(exact), rel=1e-12), (n, k)


def test_recurrence_paths_match_exact_integers():
    """Threshold paths as the hockey-stick builds them (t ~ alpha m, steps of 0 or 1),
    with a small block so the cumulative product / sum runs across many steps."""
    m = np.arange(2500, 2700, dtype=np.int64)
    for alpha, shift in ((0.5, 0), (0.55, 2), (0.62, 1)):
        t = (alpha * m).astype(np.int64) + shift
        sf, err = half_sf_path(m, t)
        pmf, rel = half_pmf_path(m, t - 1, block=16)
        for i in range(0, m.size, 37):
            ex = _exact_half_sf(int(m[i]), int(t[i]))
            assert abs(sf[i] - ex) <= err and sf[i] == pytest.approx(ex, rel=1e-11)
            exp_ = _exact_half_pmf(int(m[i]), int(t[i]) - 1)
            assert pmf[i] == pytest.approx(exp_, rel=max(rel, 1e-13))
        s, e = half_sf_sum(int(m[0]), int(t[0]))
        assert abs(s - _exact_half_sf(int(m[0]), int(t[0]))) <= e


PAIRS = {
    "generic": lambda p: (1 / (p + 1), 0.0, 1 / (p + 1)),
    "clones": lambda p: (1 / (p + 1), 0.0, 1 / (2 * p)),
    "merged_krr10": lambda p: (1 / (p + 9), 8 / (p + 9), 1 / (p + 9)),
}


class _Estimate:
    """delta(eps) without error terms: the eps it solves for measures the computation alone."""

    def __init__(self, pd):
        self.pd = pd

    def delta(self, eps):
        return self.pd.delta(eps)[0], 0.0, 0.0


# n up to 30000: scipy's bdtrc / logpmf are accurate there (~2e-15 m relative, m <= 1e4),
# so the scipy path is a 1e-9 reference; beyond it the fast path is the more accurate one
# (test_recurrence_paths_match_exact_integers, and 25-digit checks in binom_fast's doc).
@pytest.mark.parametrize("n", [1, 2, 9, 1000, 30000])
@pytest.mark.parametrize("eps0", [0.5, 2.0, 6.0])
def test_fast_pair_delta_agrees_with_scipy_path(n, eps0):
    """delta(eps) and the eps it gives agree with scipy.stats' path to 1e-9 (relative);
    the certified eps differs only by the fast path's own error terms (< 1e-6 relative)."""
    p = math.exp(eps0)
    for name, make in PAIRS.items():
        a, g, r = make(p)
        fast = PairDelta(BlanketPair(p, a, g, r, n))
        slow = PairDelta(BlanketPair(p, a, g, r, n), method="scipy")
        for eps in (0.0, 0.01, 0.1, 0.5, 1.0):
            f, s = fast.delta(eps)[0], slow.delta(eps)[0]
            assert f == pytest.approx(s, rel=1e-9, abs=1e-15), (name, eps, f, s)
        for delta in (1e-6, 1e-8):
            ef = eps_for_delta(_Estimate(fast), delta, eps0, upper=True)
            es = eps_for_delta(_Estimate(slow), delta, eps0, upper=True)
            assert ef == pytest.approx(es, rel=1e-9, abs=1e-12), (name, delta, ef, es)
            cf = eps_for_delta(fast, delta, eps0, upper=True)
            cs = eps_for_delta(slow, delta, eps0, upper=True)
            assert cf >= ef and cf == pytest.approx(cs, rel=1e-6), (name, delta, cf, cs)


@pytest.mark.parametrize("n", [1, 6, 1000, 30000])
def test_fast_rr_lower_bound_agrees_with_scipy_path(n):
    for eps0 in (0.5, 2.0, 6.0):
        p = math.exp(eps0)
        fast, slow = _RRCountDelta(p, n), _RRCountDelta(p, n, method="scipy")
        for eps in (0.0, 0.05, 0.5):
            assert fast.delta(eps)[0] == pytest.approx(slow.delta(eps)[0], rel=1e-9, abs=1e-15)
        ef = eps_for_delta(_Estimate(fast), 1e-8, eps0, upper=False)
        es = eps_for_delta(_Estimate(slow), 1e-8, eps0, upper=False)
        assert ef == pytest.approx(es, rel=1e-9, abs=1e-12)
        assert eps_for_delta(fast, 1e-8, eps0, upper=False) <= ef


def test_bounds_at_1e9_are_finite_and_ordered():
    n, e0, d = 10**9, 2.0, 1e-8
    lo = BOUNDS["lower_bound"].central_eps(e0, n, d)
    vr = BOUNDS["variation_ratio"].central_eps(e0, n, d)
    cl = BOUNDS["clones_numerical"].central_eps(e0, n, d)
    krr = variation_ratio_bound("krr", k=10).central_eps(e0, n, d)
    assert 0 < lo <= krr <= vr <= cl < 1e-3

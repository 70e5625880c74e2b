"""Shuffle amplification bounds: published numbers, exact small cases, order, inverses."""
import itertools
import math
from collections import defaultdict

import numpy as np
import pytest

from rknn_ray.accounting import BOUNDS, amplified_local_eps, variation_ratio_bound
from rknn_ray.accounting.hockey import BlanketPair, PairDelta
from rknn_ray.errors import ConfigError


# ---------------------------------------------------------------- published numbers

def test_fmt_closed_form_as_paper_000_states_it():
    assert BOUNDS["fmt_closed_form"].central_eps(4.0, 10**5, 1e-6) == pytest.approx(0.5346, abs=1e-4)


def test_fmt_closed_form_final_constant():
    assert BOUNDS["fmt_closed_form_final"].central_eps(4.0, 10**5, 1e-6) == pytest.approx(0.538, abs=5e-4)


def test_clones_numerical_between_published_lower_and_sound_upper():
    eps = BOUNDS["clones_numerical"].central_eps(4.0, 10**5, 1e-6)
    assert 0.1675 <= eps <= 0.175


def test_closed_form_validity_condition_is_enforced_with_a_fix():
    # log(1000 / (16 log(2e6))) = 1.38 < 2
    with pytest.raises(ConfigError, match=r"log\(n / \(16 log\(2/delta\)\)\).*Fix: use n >="):
        BOUNDS["fmt_closed_form"].central_eps(2.0, 1000, 1e-6)


# ------------------------------------------------------------- exact small cases

def _pair_brute(n, p, a, g, r, eps):
    """Enumerate the blanket pair (counts of '0' and '1') directly."""
    def B(x, y):
        if x < 0 or y < 0 or x + y > n - 1:
            return 0.0
        return (math.comb(n - 1, x) * math.comb(n - 1 - x, y) * r ** (x + y)
                * (1 - 2 * r) ** (n - 1 - x - y))
    tot = 0.0
    for x in range(n + 1):
        for y in range(n + 1 - x):
            P0 = p * a * B(x - 1, y) + a * B(x, y - 1) + g * B(x, y)
            P1 = a * B(x - 1, y) + p * a * B(x, y - 1) + g * B(x, y)
            tot += max(0.0, P0 - math.exp(eps) * P1)
    return tot


@pytest.mark.parametrize("p", [1.5, math.e, 20.0])
@pytest.mark.parametrize("n", [1, 2, 5, 9])
def test_hockey_core_matches_enumeration(p, n):
    for a, g, r in [(1 / (p + 1), 0, 1 / (p + 1)), (1 / (p + 1), 0, 1 / (2 * p)),
                    (1 / (p + 4), 3 / (p + 4), 1 / (p + 4))]:
        pd = PairDelta(BlanketPair(p, a, g, r, n))
        for eps in (0.0, 0.1, 0.5, 1.0):
            assert pd.delta(eps)[0] == pytest.approx(_pair_brute(n, p, a, g, r, eps), abs=1e-14)


def _krr(x, k, p):
    v = np.full(k, 1.0 / (p + k - 1))
    v[x] = p / (p + k - 1)
    return v


def _shuffled(dists):
    """Exact distribution of the multiset of independent reports."""
    d = {(): 1.0}
    for P in dists:
        nd = defaultdict(float)
        for ms, pr in d.items():
            for y, py in enumerate(P):
                nd[tuple(sorted(ms + (y,)))] += pr * py
        d = nd
    return d


def _hs(P, Q, eps):
    return sum(max(0.0, P.get(k, 0.0) - math.exp(eps) * Q.get(k, 0.0)) for k in set(P) | set(Q))


def _exact_krr_delta(k, p, n, eps):
    worst = 0.0
    for others in itertools.product(range(min(k, 3)), repeat=n - 1):
        P0 = _shuffled([_krr(0, k, p)] + [_krr(x, k, p) for x in others])
        P1 = _shuffled([_krr(1, k, p)] + [_krr(x, k, p) for x in others])
        worst = max(worst, _hs(P0, P1, eps), _hs(P1, P0, eps))
    return worst


@pytest.mark.parametrize("k", [2, 3, 4])
def test_variation_ratio_upper_bounds_exact_shuffled_krr(k):
    """Our k-RR pair (generic, and '*' revealed) dominates exhaustive enumeration."""
    for eps0, n in [(0.5, 3), (1.5, 3), (1.5, 4), (3.0, 4)]:
        p = math.exp(eps0)
        a = 1 / (p + k - 1)
        generic = PairDelta(BlanketPair(p, 1 / (p + 1), 0, 1 / (p + 1), n))
        specific = PairDelta(BlanketPair(p, 1 / (p + 1), 0, a, n))
        for eps in (0.05, 0.2, 0.5, 1.0):
            exact = _exact_krr_delta(k, p, n, eps)
            assert generic.delta(eps)[0] >= exact - 1e-12
            assert (p + 1) * a * specific.delta(eps)[0] >= exact - 1e-12


def test_merged_variation_ratio_evaluation_is_not_an_upper_bound():
    """Counting user 1's non-informative output as a blanket message (as the published
    numerical procedure does for beta < (p-1)/(p+1)) underestimates delta: k=3, n=3."""
    p, k, n, eps = math.exp(1.5), 3, 3, 1.0
    a = 1 / (p + k - 1)
    merged = PairDelta(BlanketPair(p, a, (k - 2) * a, a, n)).delta(eps)[0]
    exact = _exact_krr_delta(k, p, n, eps)
    assert merged < exact - 1e-3          # 0.1317 < 0.1373
    # ... while it *is* a valid lower bound for the others-hold-a-third-value dataset
    P0 = _shuffled([_krr(0, k, p)] + [_krr(2, k, p)] * (n - 1))
    P1 = _shuffled([_krr(1, k, p)] + [_krr(2, k, p)] * (n - 1))
    assert merged <= max(_hs(P0, P1, eps), _hs(P1, P0, eps)) + 1e-12


def test_lower_bound_is_exact_for_shuffled_binary_rr():
    """lower_bound's delta equals enumeration of shuffled binary RR (others hold 1)."""
    from rknn_ray.accounting.bounds import _RRCountDelta
    p, n = math.exp(1.0), 6
    P0 = _shuffled([_krr(0, 2, p)] + [_krr(1, 2, p)] * (n - 1))
    P1 = _shuffled([_krr(1, 2, p)] + [_krr(1, 2, p)] * (n - 1))
    for eps in (0.0, 0.3, 0.7):
        assert _RRCountDelta(p, n).delta(eps)[0] == pytest.approx(
            max(_hs(P0, P1, eps), _hs(P1, P0, eps)), abs=1e-14)


# ----------------------------------------------------------------- order, monotone

GRID = [(n, e0, d) for n in (10**3, 10**4, 10**5, 10**6) for e0 in (0.5, 1, 2, 4, 6)
        for d in (1e-6, 1e-8)]


def test_order_lower_vr_clones_closed_on_grid():
    """lower <= variation_ratio <= clones_numerical <= closed form (final constant):
    theorems (see bounds.py). numerical <= paper-000 closed form is not guaranteed by
    a theorem (000's constant is the smaller, superseded one) but holds on this grid."""
    checked_closed = 0
    for n, e0, d in GRID:
        lo = BOUNDS["lower_bound"].central_eps(e0, n, d)
        vr = BOUNDS["variation_ratio"].central_eps(e0, n, d)
        cl = BOUNDS["clones_numerical"].central_eps(e0, n, d)
        assert 0 <= lo <= vr <= cl <= e0, (n, e0, d, lo, vr, cl)
        try:
            cf = BOUNDS["fmt_closed_form_final"].central_eps(e0, n, d)
            cf000 = BOUNDS["fmt_closed_form"].central_eps(e0, n, d)
        except ConfigError:
            continue
        checked_closed += 1
        assert cl <= cf and cl <= cf000
    assert checked_closed >= 15


def test_monotone_in_eps0_and_n():
    for name in ("lower_bound", "variation_ratio", "clones_numerical"):
        b = BOUNDS[name]
        vals = [b.central_eps(e, 10**4, 1e-6) for e in (0.25, 0.5, 1, 2, 3, 4, 5)]
        assert all(x <= y + 1e-9 for x, y in zip(vals, vals[1:])), (name, vals)
        by_n = [b.central_eps(2.0, n, 1e-6) for n in (10**2, 10**3, 10**4, 10**5)]
        assert all(x >= y - 1e-9 for x, y in zip(by_n, by_n[1:])), (name, by_n)


@pytest.mark.parametrize("name", ["fmt_closed_form", "clones_numerical", "variation_ratio"])
@pytest.mark.parametrize("n,e0", [(10**4, 1.0), (10**5, 4.0)])
def test_inverse_round_trip(name, n, e0):
    b = BOUNDS[name]
    eps = b.central_eps(e0, n, 1e-6)
    back = b.local_eps0(eps, n, 1e-6)
    assert back == pytest.approx(e0, rel=1e-4)
    assert b.central_eps(back, n, 1e-6) <= eps      # safe side
    assert amplified_local_eps(eps, 1e-6, n, bound=name) == pytest.approx(back)


def test_inverse_errors_are_clear_and_never_nan():
    with pytest.raises(ConfigError, match="target eps"):
        amplified_local_eps(0.0, 1e-6, 1000)
    with pytest.raises(ConfigError, match="delta"):
        amplified_local_eps(1.0, 1.5, 1000)
    with pytest.raises(ConfigError, match="n="):
        amplified_local_eps(1.0, 1e-6, 0)
    with pytest.raises(ConfigError, match="too small"):
        BOUNDS["fmt_closed_form"].local_eps0(1.0, 50, 1e-6)
    with pytest.raises(ConfigError, match="lower bound"):
        amplified_local_eps(1.0, 1e-6, 1000, bound="lower_bound")
    # n = 1: no amplification (only delta's slack), but a valid answer, not NaN
    assert 0.5 <= amplified_local_eps(0.5, 1e-6, 1) <= 0.501


def test_n_1e8_is_finite():
    v = BOUNDS["clones_numerical"].central_eps(4.0, 10**8, 1e-8)
    assert 0 < v < 0.01 and math.isfinite(v)


def test_mechanism_specific_variation_ratio():
    generic = BOUNDS["variation_ratio"].central_eps(2.0, 10**5, 1e-6)
    for mech, params in (("krr", {"k": 10}), ("collision", {"c": 1, "l": 100}),
                         ("collision", {"c": 10, "l": 565})):
        b = variation_ratio_bound(mech, **params)
        assert b.central_eps(2.0, 10**5, 1e-6) <= generic + 1e-12
    krr = variation_ratio_bound("krr", k=10)
    assert krr.lower(2.0, 10**5, 1e-6) <= krr.central_eps(2.0, 10**5, 1e-6)
    # the sound (revealed-"*") form is never looser than generic, and the k-RR lower
    # bound shows how much room is left for a tighter sound analysis
    e0 = amplified_local_eps(0.5, 1e-6, 10**5, bound="variation_ratio", mechanism="krr", k=10)
    assert e0 >= BOUNDS["variation_ratio"].local_eps0(0.5, 10**5, 1e-6) * (1 - 1e-4)
    with pytest.raises(ConfigError, match="k-RR needs"):
        variation_ratio_bound("krr")

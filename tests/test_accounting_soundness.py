"""Soundness of the shuffle bounds against brute force: shuffled k-RR enumerated exactly.

Every upper bound must dominate the exact hockey-stick divergence of shuffled k-RR for
explicit neighbouring pairs (n <= 30, the full distribution of the output histogram),
and its own randomizer's lower bound; bounds move the right way in n and eps0.
"""
import itertools
import math

import pytest

from rknn_ray.accounting import BOUNDS, variation_ratio_bound
from rknn_ray.accounting.bounds import MechanismLowerBound
from rknn_ray.errors import ConfigError


def _histograms(inputs, k, p):
    """Exact law of the shuffled output (a histogram over k values) of k-RR on ``inputs``."""
    lo, hi = 1.0 / (p + k - 1), p / (p + k - 1)
    dist = {(0,) * k: 1.0}
    for x in inputs:
        nxt = {}
        for h, pr in dist.items():
            for y in range(k):
                g = list(h)
                g[y] += 1
                g = tuple(g)
                nxt[g] = nxt.get(g, 0.0) + pr * (hi if y == x else lo)
        dist = nxt
    return dist


def _divergence(P, Q, eps):
    """max of the two hockey-stick divergences at eps."""
    e = math.exp(eps)
    keys = set(P) | set(Q)
    return max(sum(max(0.0, P.get(h, 0.0) - e * Q.get(h, 0.0)) for h in keys),
               sum(max(0.0, Q.get(h, 0.0) - e * P.get(h, 0.0)) for h in keys))


def _others(k, n):
    """Datasets for the n-1 other users: all on user 1's alternative, all on a third
    value, all on user 1's own value, and a mix."""
    m = n - 1
    out = [[1] * m, [0] * m, [i % k for i in range(m)]]
    if k >= 3:
        out += [[2] * m, [1 + (i % 2) for i in range(m)]]
    return out


def _upper_bounds(k):
    names = ("variation_ratio", "clones_numerical", "fmt_closed_form_final", "fmt_closed_form")
    return [BOUNDS[n] for n in names] + [variation_ratio_bound("krr", k=k)]


CASES = [(2, 30, 1.0, 1e-3), (2, 20, 2.0, 1e-4), (3, 25, 1.0, 1e-3), (3, 12, 3.0, 1e-2),
         (4, 14, 0.5, 1e-4), (10, 6, 2.0, 1e-2)]


@pytest.mark.parametrize("k,n,eps0,delta", CASES)
def test_upper_bounds_dominate_brute_force_shuffled_krr(k, n, eps0, delta):
    """At each bound's eps, the exact divergence of every enumerated pair is <= delta."""
    p = math.exp(eps0)
    pairs = []
    for others in _others(k, n):
        P0 = _histograms([0] + others, k, p)
        P1 = _histograms([1] + others, k, p)
        assert sum(P0.values()) == pytest.approx(1.0, abs=1e-12)
        pairs.append((P0, P1))
    checked = 0
    for b in _upper_bounds(k):
        try:
            eps = b.central_eps(eps0, n, delta)
        except ConfigError:          # the closed forms' validity region excludes small n
            continue
        checked += 1
        for P0, P1 in pairs:
            assert _divergence(P0, P1, eps) <= delta + 1e-13, (b.name, eps)
    assert checked >= 3


@pytest.mark.parametrize("k,n,eps0,delta", CASES)
def test_krr_lower_bound_is_certified_by_brute_force(k, n, eps0, delta):
    """The k-RR lower bound's eps is really needed: its named pairs exceed delta just below it."""
    p = math.exp(eps0)
    lower = MechanismLowerBound(variation_ratio_bound("krr", k=k)).central_eps(eps0, n, delta)
    assert lower > 0
    worst = max(_divergence(_histograms([0] + o, k, p), _histograms([1] + o, k, p), lower)
                for o in ([[1] * (n - 1)] + ([[2] * (n - 1)] if k >= 3 else [])))
    assert worst >= delta - 1e-13


MECHS = [("krr", {"k": 2}), ("krr", {"k": 3}), ("krr", {"k": 10}),
         ("collision", {"c": 1, "l": 4}), ("collision", {"c": 1, "l": 20})]


@pytest.mark.parametrize("mech,params", MECHS)
def test_every_upper_bound_dominates_its_own_lower_bound(mech, params):
    vr = variation_ratio_bound(mech, **params)
    lower = MechanismLowerBound(vr)
    uppers = [vr, BOUNDS["variation_ratio"], BOUNDS["clones_numerical"], BOUNDS["fmt_closed_form_final"]]
    for n in (30, 1000, 10**5):
        for eps0 in (0.5, 2.0, 4.0):
            for delta in (1e-6, 1e-8):
                lo = lower.central_eps(eps0, n, delta)
                for b in uppers:
                    try:
                        up = b.central_eps(eps0, n, delta)
                    except ConfigError:
                        continue
                    assert lo <= up, (mech, params, b.name, n, eps0, delta, lo, up)


@pytest.mark.parametrize("mech,params", [("generic", {})] + MECHS[1:4:2])
def test_bounds_monotone_in_n_and_eps0(mech, params):
    vr = variation_ratio_bound(mech, **params)
    bounds = [vr, MechanismLowerBound(vr), BOUNDS["clones_numerical"]]
    for b in bounds:
        by_n = [b.central_eps(2.0, n, 1e-8) for n in (10, 100, 10**3, 10**4, 10**5, 10**6)]
        assert all(x >= y - 1e-12 for x, y in zip(by_n, by_n[1:])), (b.name, by_n)
        by_e0 = [b.central_eps(e0, 10**4, 1e-6) for e0 in (0.25, 0.5, 1, 2, 4, 6)]
        assert all(x <= y + 1e-12 for x, y in zip(by_e0, by_e0[1:])), (b.name, by_e0)


@pytest.mark.parametrize("k", [2, 3, 5])
def test_shuffled_krr_pair_delta_is_exact(k):
    """The sufficient-statistic sum equals enumeration of the whole shuffled histogram."""
    from rknn_ray.accounting.shuffled_rr import krr_pair
    for n, eps0 in ((1, 1.0), (2, 0.5), (7, 2.0), (12, 1.0)):
        p = math.exp(eps0)
        P0 = _histograms([0] + [1] * (n - 1), k, p)
        P1 = _histograms([1] * n, k, p)
        pd = krr_pair(eps0, n, k)
        for eps in (0.0, 0.2, 0.7, 1.5):
            assert pd.delta(eps)[0] == pytest.approx(_divergence(P0, P1, eps), abs=1e-13)

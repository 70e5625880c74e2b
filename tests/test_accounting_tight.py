"""The tight (blanket) bound: sound against brute force over *all* datasets of the other
users, at least its own lower bound, monotone, fast == exact path, and its dominating pair."""
import itertools
import math

import numpy as np
import pytest

from rknn_ray.accounting import get_bound
from rknn_ray.accounting.bounds import _pair_delta
from rknn_ray.accounting.tight import BlanketDelta, TightBound, blanket_params
from rknn_ray.errors import ConfigError

from tests.test_accounting_soundness import _divergence, _histograms


def _worst_krr(k, n, eps0, eps):
    """max over every dataset of users 2..n (multisets over k values) of the exact
    divergence of shuffled k-RR, user 1 holding 0 vs 1."""
    p = math.exp(eps0)
    best = 0.0
    for others in itertools.combinations_with_replacement(range(k), n - 1):
        P = _histograms((0,) + others, k, p)
        Q = _histograms((1,) + others, k, p)
        best = max(best, _divergence(P, Q, eps))
    return best


def _upper_delta(mech, eps0, n, eps, method="exact", **kw):
    p, px, pr, pc = blanket_params(mech, eps0, **kw)
    est, up, _ = BlanketDelta(p, n, px, pr, pc, method=method).delta(eps)
    return est + up


@pytest.mark.parametrize("k,n,eps0", [(3, 9, 1.0), (3, 7, 3.0), (4, 6, 2.0), (2, 12, 1.0)])
def test_tight_dominates_brute_force_over_all_datasets(k, n, eps0):
    for eps in (0.05, 0.3, 0.8 * eps0):
        worst = _worst_krr(k, n, eps0, eps)
        for method in ("exact", "fast"):
            up = _upper_delta("krr", eps0, n, eps, method=method, k=k)
            assert up >= worst - 1e-12, (method, eps, up, worst)
    # and the eps it certifies is never below the brute-force eps at that delta
    b = get_bound("tight", mechanism="krr", k=k)
    e = b.central_eps(eps0, n, 1e-3)
    assert _worst_krr(k, n, eps0, e) <= 1e-3 + 1e-12


def _collision_histograms(inputs, l, p):
    """Exact law of shuffled Collision (c = 1) with a fully random hash H: [3] -> [l]
    drawn per report; a report is (H, y), y l-RR on H(x)."""
    hashes = list(itertools.product(range(l), repeat=3))
    outs = [(h, y) for h in range(len(hashes)) for y in range(l)]
    a = 1.0 / (p + l - 1)
    dist = {(): 1.0}
    for x in inputs:
        nxt = {}
        for hist, pr in dist.items():
            for hi, H in enumerate(hashes):
                for y in range(l):
                    q = pr / len(hashes) * (p * a if y == H[x] else a)
                    key = tuple(sorted(hist + ((hi, y),)))
                    nxt[key] = nxt.get(key, 0.0) + q
        dist = nxt
    return dist


@pytest.mark.parametrize("n,eps0", [(3, 1.0), (4, 2.0)])
def test_tight_collision_dominates_brute_force(n, eps0):
    l = 2
    p = math.exp(eps0)
    for eps in (0.05, 0.3, 0.8 * eps0):
        worst = 0.0
        for others in itertools.combinations_with_replacement(range(3), n - 1):
            P = _collision_histograms((0,) + others, l, p)
            Q = _collision_histograms((1,) + others, l, p)
            worst = max(worst, _divergence(P, Q, eps))
        assert _upper_delta("collision", eps0, n, eps, l=l) >= worst - 1e-12, (eps, worst)


def _match_law(x, m, l, p):
    """{(z = H(w) for w < m): prob} of one Collision (c = 1) report of a sender holding
    value x, the hash fully random: the likelihood of a report under every value in the
    data set depends on these match bits only, and they are independent, the sender's
    own one with prob. p / (p + l - 1), every other one with 1/l."""
    own = p / (p + l - 1)
    law = {}
    for bits in itertools.product((0, 1), repeat=m):
        q = 1.0
        for w, b in enumerate(bits):
            t = own if w == x else 1.0 / l
            q *= t if b else 1.0 - t
        law[bits] = q
    return law


def _match_histograms(senders, m, l, p):
    """Exact law of the multiset of the n reports' match bits."""
    dist, laws = {(): 1.0}, {}
    for x in senders:
        nxt = {}
        for h, pr in dist.items():
            for bits, q in laws.setdefault(x, _match_law(x, m, l, p)).items():
                key = tuple(sorted(h + (bits,)))
                nxt[key] = nxt.get(key, 0.0) + pr * q
        dist = nxt
    return dist


@pytest.mark.parametrize("n,l,eps0", [(5, 3, 1.0), (4, 4, 0.5), (4, 2, 2.0)])
def test_tight_collision_dominates_data_sets_with_several_third_values(n, l, eps0):
    # the others may hold v (0), v' (1) and up to two further values (2, 3), in any mix:
    # the blanket bound holds whatever they hold (mixed data sets are the worst case at
    # some eps here, e.g. n = 6, l = 4: three on v and two on one third value)
    p = math.exp(eps0)
    epss = (0.1 * eps0, 0.4 * eps0, 0.7 * eps0)
    worst = [0.0] * len(epss)
    for others in itertools.combinations_with_replacement(range(4), n - 1):
        if 3 in others and 2 not in others:
            continue                            # the same as with 2: values are symmetric
        m = 4 if 3 in others else 3
        P = _match_histograms((0,) + others, m, l, p)
        Q = _match_histograms((1,) + others, m, l, p)
        worst = [max(w, _divergence(P, Q, eps)) for w, eps in zip(worst, epss)]
    for w, eps in zip(worst, epss):
        assert w > 0.0
        assert _upper_delta("collision", eps0, n, eps, l=l) >= w - 1e-12, (eps, w)


@pytest.mark.parametrize("n", [50, 3000])
@pytest.mark.parametrize("eps0", [1.0, 4.0])
def test_generic_tight_is_the_variation_ratio_pair(n, eps0):
    p = math.exp(eps0)
    bd = BlanketDelta(p, n, 1.0 / (p + 1.0))
    pd = _pair_delta(p, 1.0 / (p + 1.0), 0.0, 1.0 / (p + 1.0), n)
    for eps in (0.02, 0.1, 0.5):
        a, b = bd.delta(eps)[0], pd.delta(eps)[0]
        assert a == pytest.approx(b, rel=1e-7, abs=1e-15)


@pytest.mark.parametrize("mech,kw,n,eps0", [("krr", {"k": 10}, 2000, 2.0), ("krr", {"k": 4}, 800, 4.0),
                                            ("collision", {"l": 10}, 500, 1.0)])
def test_fast_path_rounds_up_the_exact_path_and_stays_close(mech, kw, n, eps0):
    for eps in (0.05, 0.15, 0.3):
        exact = _upper_delta(mech, eps0, n, eps, **kw)
        fast = _upper_delta(mech, eps0, n, eps, method="fast", **kw)
        if exact > 1e-12:
            assert exact - 1e-13 <= fast <= 1.1 * exact + 1e-13, (eps, exact, fast)


GRID = [(n, e0) for n in (1000, 100000) for e0 in (0.5, 2.0, 6.0)]


@pytest.mark.parametrize("mech,kw", [("krr", {"k": 10}), ("collision", {"l": 10}), ("generic", {})])
def test_tight_is_above_its_lower_bound_and_below_the_generic_bounds(mech, kw):
    b = get_bound("tight", mechanism=mech, **kw)
    for n, e0 in GRID:
        up, lo = b.central_eps(e0, n, 1e-6), b.lower(e0, n, 1e-6)
        assert lo <= up, (n, e0, lo, up)
        assert up <= get_bound("clones_numerical").central_eps(e0, n, 1e-6) * (1 + 1e-6)


@pytest.mark.parametrize("mech,kw", [("krr", {"k": 10}), ("collision", {"l": 10})])
def test_tight_monotone_in_n_and_eps0(mech, kw):
    b = get_bound("tight", mechanism=mech, **kw)
    by_n = [b.central_eps(2.0, n, 1e-8) for n in (1000, 10**5, 10**6, 10**8)]
    assert all(x > y for x, y in zip(by_n, by_n[1:])), by_n
    by_e0 = [b.central_eps(e0, 3000, 1e-8) for e0 in (0.5, 1.0, 2.0, 4.0, 6.0)]
    assert all(x < y for x, y in zip(by_e0, by_e0[1:])), by_e0


def test_krr_gap_is_within_five_percent():
    b = get_bound("tight", mechanism="krr", k=10)
    for n, e0 in ((10**4, 1.0), (10**6, 2.0), (10**8, 4.0)):
        up, lo = b.central_eps(e0, n, 1e-8), b.lower(e0, n, 1e-8)
        assert up / lo <= 1.05, (n, e0, up, lo)


@pytest.mark.parametrize("mech,kw", [("krr", {"k": 10}), ("generic", {}), ("collision", {"l": 4})])
def test_dominating_pair_dominates_the_bound(mech, kw):
    b = get_bound("tight", mechanism=mech, **kw)
    n, e0 = (150 if mech == "collision" else 400), 2.0
    lp, lq = b.dominating_pair(e0, n)
    P, Q = np.exp(lp), np.exp(lq)
    assert lp.shape == lq.shape
    assert P.sum() == pytest.approx(1.0, abs=1e-9) and Q.sum() == pytest.approx(1.0, abs=1e-9)
    for d in (1e-3, 1e-6):
        e = b.central_eps(e0, n, d)
        ee = math.exp(e)
        assert np.sum(np.maximum(P - ee * Q, 0)) >= 0.99 * d
        assert np.sum(np.maximum(Q - ee * P, 0)) >= 0.99 * d
        # and it is a bound: the pair's delta at eps is >= the blanket sum at eps
        exact = _upper_delta(mech, e0, n, e, **kw) - 1e-12
        assert np.sum(np.maximum(P - ee * Q, 0)) >= exact * (1 - 1e-9)


def test_registered_and_validated():
    assert get_bound("tight").name == "tight"
    assert get_bound("tight", mechanism="krr", k=10).name == "tight_krr"
    assert get_bound("tight", mechanism="collision", l=8).name == "tight_collision"
    with pytest.raises(ConfigError):
        get_bound("tight", mechanism="krr")
    with pytest.raises(ConfigError):
        get_bound("tight", mechanism="collision", l=8, c=2)
    with pytest.raises(ConfigError):
        get_bound("tight", mechanism="krr", k=10, l=3)
    assert isinstance(get_bound("tight", mechanism="krr", k=3), TightBound)

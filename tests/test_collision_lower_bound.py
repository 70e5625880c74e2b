"""Collision's own lower bound, others all holding a third value: the report categories
match the hashed view enumerated exactly, the count pairs are exact, and they sit
between the full view's divergence and the tight upper bound."""
import itertools
import math

import pytest

from rknn_ray.accounting import get_bound
from rknn_ray.accounting.shuffled_rr import CollisionThirdValueDelta, collision_third_value_pairs
from rknn_ray.mechanisms.collision import collision_l

from tests.test_accounting_soundness import _divergence
from tests.test_accounting_tight import _collision_histograms, _upper_delta


def _category_laws(l, p):
    """{(z = H(v), z = H(v'), z = H(v'')): prob} for a report of a user holding v, v', v''
    (indices 0, 1, 2), hashes of the three values i.i.d. uniform on [l] (enumerated)."""
    a = 1.0 / (p + l - 1)
    laws = [{}, {}, {}]
    for H in itertools.product(range(l), repeat=3):
        for z in range(l):
            cat = tuple(int(z == h) for h in H)
            for x in range(3):
                q = (p * a if z == H[x] else a) / l ** 3
                laws[x][cat] = laws[x].get(cat, 0.0) + q
    return laws


def _shuffled_counts(first, other, n):
    """Exact law of the category counts of n shuffled reports: one from ``first``, n-1
    from ``other`` (dicts category -> prob)."""
    cats = sorted(set(first) | set(other))
    idx = {c: i for i, c in enumerate(cats)}
    dist = {}
    for c, q in first.items():
        key = [0] * len(cats)
        key[idx[c]] += 1
        dist[tuple(key)] = dist.get(tuple(key), 0.0) + q
    for _ in range(n - 1):
        nxt = {}
        for h, pr in dist.items():
            for c, q in other.items():
                g = list(h)
                g[idx[c]] += 1
                g = tuple(g)
                nxt[g] = nxt.get(g, 0.0) + pr * q
        dist = nxt
    return dist


def _coarsen(law, groups):
    """Merge categories: ``groups`` maps a category to its group name (default 'rest')."""
    out = {}
    for c, q in law.items():
        g = groups.get(c, "rest")
        out[g] = out.get(g, 0.0) + q
    return out


A, B, C, D = (1, 0, 0), (0, 1, 0), (1, 0, 1), (0, 1, 1)
COARSENINGS = ({A: "A", B: "B"}, {A: "A", C: "A", B: "B", D: "B"})   # the order of the pairs


def _check_documented_laws(l, p, laws):
    """The A, B, C, D probabilities of collision_third_value_pairs' docstring; every other
    category has the same law under v and v'."""
    a, kap = 1.0 / (p + l - 1), 1.0 / l
    u, w = (1 - kap) ** 2 * a, kap * (1 - kap) * a
    vx, vy, vo = laws
    for cat, (qx, qy, qo) in {A: (p * u, u, u), B: (u, p * u, u),
                              C: (p * w, w, p * w), D: (w, p * w, p * w)}.items():
        assert (vx[cat], vy[cat], vo[cat]) == pytest.approx((qx, qy, qo), rel=1e-12)
    for cat in set(vx) - {A, B, C, D}:
        assert vx[cat] == pytest.approx(vy[cat], rel=1e-12)


@pytest.mark.parametrize("l,n,eps0", [(3, 3, 1.0), (2, 4, 2.0)])
def test_categories_are_sufficient_and_the_bound_sits_between(l, n, eps0):
    """The counts of the 8 categories carry the whole hashed view (same divergence); the
    two count pairs are below it; the tight upper bound is above it."""
    p = math.exp(eps0)
    full_x = _collision_histograms((0,) + (2,) * (n - 1), l, p)
    full_y = _collision_histograms((1,) + (2,) * (n - 1), l, p)
    vx, vy, vo = _category_laws(l, p)
    cx, cy = _shuffled_counts(vx, vo, n), _shuffled_counts(vy, vo, n)
    pairs = collision_third_value_pairs(eps0, n, l)
    for eps in (0.05, 0.3, 0.8 * eps0):
        full = _divergence(full_x, full_y, eps)
        assert _divergence(cx, cy, eps) == pytest.approx(full, rel=1e-9, abs=1e-14)
        for pd in pairs:
            est, _, down = pd.delta(eps)
            assert est - down <= full + 1e-12, (eps, est, full)
        assert _upper_delta("collision", eps0, n, eps, l=l) >= full - 1e-12


@pytest.mark.parametrize("l,n,eps0", [(2, 10, 1.0), (3, 12, 0.5), (4, 9, 1.0), (8, 10, 2.0),
                                      (12, 8, 4.0)])
def test_count_pairs_are_the_exact_coarsened_divergences(l, n, eps0):
    """Each pair's delta is the exact divergence of the shuffled counts of its coarsening
    (brute-force multinomials over the enumerated category laws, which are the documented
    ones)."""
    p = math.exp(eps0)
    vx, vy, vo = _category_laws(l, p)
    _check_documented_laws(l, p, (vx, vy, vo))
    for groups, pd in zip(COARSENINGS, collision_third_value_pairs(eps0, n, l)):
        gx, gy, go = (_coarsen(v, groups) for v in (vx, vy, vo))
        cx, cy = _shuffled_counts(gx, go, n), _shuffled_counts(gy, go, n)
        for eps in (0.05, 0.3, 0.8 * eps0):
            exact = _divergence(cx, cy, eps)
            est, up, down = pd.delta(eps)
            assert est - down - 1e-12 <= exact <= est + up + 1e-12, (groups, eps, est, exact)
            assert est == pytest.approx(exact, rel=1e-7, abs=1e-13)


@pytest.mark.parametrize("l,n,eps0", [(3, 10, 0.5), (4, 9, 1.0), (8, 8, 2.0), (2, 6, 1.0)])
def test_four_counts_are_the_exact_divergence(l, n, eps0):
    """The A, B, C, D counts (rest merged): brute-force multinomials == the closed form,
    and at least each two-count pair."""
    p = math.exp(eps0)
    vx, vy, vo = _category_laws(l, p)
    groups = {A: "A", B: "B", C: "C", D: "D"}
    gx, gy, go = (_coarsen(v, groups) for v in (vx, vy, vo))
    cx, cy = _shuffled_counts(gx, go, n), _shuffled_counts(gy, go, n)
    four = CollisionThirdValueDelta(eps0, n, l)
    for eps in (0.05, 0.3, 0.8 * eps0):
        exact = _divergence(cx, cy, eps)
        est, up, down = four.delta(eps)
        assert est - down - 1e-12 <= exact <= est + up + 1e-12, (eps, est, exact)
        assert est == pytest.approx(exact, rel=1e-9, abs=1e-13)
        assert all(pd.delta(eps)[0] <= est + 1e-12 for pd in collision_third_value_pairs(eps0, n, l))


def test_four_counts_close_the_small_l_gap():
    """n = 1000, l = 3 and 4: the four counts leave <= 1.09 / 1.11 (the count pairs alone
    1.11 / 1.17), and stay below the tight bound."""
    for e0, cap in ((0.5, 1.09), (1.0, 1.11)):
        b = get_bound("tight", mechanism="collision", l=collision_l(e0, 1), c=1)
        up, lo = b.central_eps(e0, 1000, 1e-6), b.lower(e0, 1000, 1e-6)
        assert lo <= up <= cap * lo, (e0, lo, up)


@pytest.mark.parametrize("delta", [1e-6, 1e-8])
def test_collision_gap_with_the_l_the_project_picks(delta):
    """Sound (lower <= tight) and, at eps0 >= 2 (l >= 8), within 10% / at eps0 >= 4 within
    5% (the others-hold-v' pair alone left 1.3-1.46)."""
    for e0 in (2.0, 4.0, 6.0):
        b = get_bound("tight", mechanism="collision", l=collision_l(e0, 1), c=1)
        for n in (10**3, 10**5):
            up, lo = b.central_eps(e0, n, delta), b.lower(e0, n, delta)
            assert lo <= up <= lo * (1.05 if e0 >= 4 else 1.10), (e0, n, lo, up)


@pytest.mark.parametrize("n,eps0,l", [(1000, 0.5, 3), (4000, 1.0, 4)])
def test_small_n_tail_table_agrees_with_the_incomplete_beta_path(monkeypatch, n, eps0, l):
    """The tight bound's small-n sums read Bin(m, 1/2) tails from one band table: the
    same delta as one incomplete beta per cell, within both error bars."""
    from rknn_ray.accounting import tight
    from rknn_ray.accounting.tight import BlanketDelta, blanket_params
    args = blanket_params("collision", eps0, l=l)
    p, rest = args[0], args[1:]
    table = BlanketDelta(p, n, *rest)
    for eps in (0.01, 0.03, 0.08):
        monkeypatch.setattr(tight, "TABLE_MAX", 0)
        ref = BlanketDelta(p, n, *rest).delta(eps)
        monkeypatch.undo()
        got = table.delta(eps)
        assert abs(got[0] - ref[0]) <= got[1] + ref[1], (eps, got, ref)
        assert got[0] + got[1] >= ref[0] - ref[2]
    assert table.__dict__["_half_tab"][2] is not None       # the table was used


def test_large_n_skips_the_tail_table_without_allocating_it():
    from rknn_ray.accounting.tight import BlanketDelta, blanket_params
    p, px, pr, pc = blanket_params("collision", 0.5, l=3)
    bd = BlanketDelta(p, 10**8, px, pr, pc)
    assert bd.delta(2e-4)[0] > 0 and bd._half_table(10**6, 10**6) is None

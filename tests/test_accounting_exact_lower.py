"""Exact explicit-data-set lower bounds (issue 50, item 1): per-bit RR (kr = 1), user 1 hot on
h vs h', the others all hot on a third cell h''.

Checked against brute force: the real mechanism on d = 3 cells, the exact hockey-stick
divergence of the shuffled output's histogram (8 report patterns) by dynamic programming over
the users, at n <= 6.  The certified value must sit below it (rounding, buckets and error
bounds only lower it) and converge to it on a fine grid.
"""
import itertools
import math
from collections import defaultdict

import pytest

from rknn_ray.accounting.exact_lower import (BitRRThirdCellDelta, CollisionThirdValueExactDelta,
                                             KRRThirdValueExactDelta, bitrr_flip_probability_hi)
from rknn_ray.accounting.shuffled_rr import bitrr_flip_probability, bitrr_pairs
from rknn_ray.accounting.tight import tight_bound


def brute_delta(q: float, n: int, eps: float) -> float:
    """Exact delta of shuffled per-bit RR on 3 cells: user 1 hot on cell 0 vs 1, n - 1 on 2."""
    pats = list(itertools.product((0, 1), repeat=3))

    def law(h):
        return [math.prod((1 - q) if (y[c] == 1) == (c == h) else q for c in range(3))
                for y in pats]

    def add(dist, lw):
        out = defaultdict(float)
        for h, pr in dist.items():
            for j in range(8):
                hh = list(h)
                hh[j] += 1
                out[tuple(hh)] += pr * lw[j]
        return out

    base = {(0,) * 8: 1.0}
    for _ in range(n - 1):
        base = add(base, law(2))
    P, Q = add(base, law(0)), add(base, law(1))
    ee = math.exp(eps)
    return sum(max(P[h] - ee * Q.get(h, 0.0), 0.0) for h in P)


@pytest.mark.parametrize("eps0,n,eps", [(1.0, 3, 0.2), (2.0, 5, 0.5), (4.0, 6, 1.0),
                                        (2.0, 6, 0.05), (0.5, 4, 0.1), (2.0, 2, 0.3)])
def test_third_cell_delta_matches_brute_force_from_below(eps0, n, eps):
    pd = BitRRThirdCellDelta(eps0, n, grid=1 << 12, width=1)
    est, up, down = pd.delta(eps)
    exact = brute_delta(pd.q, n, eps)
    assert up == 0.0 and 0.0 < down < 1e-9 * max(est, 1e-300) + 1e-15
    assert est - down <= exact
    assert est - down >= 0.999 * exact              # the grid's rounding only, and small
    coarse = BitRRThirdCellDelta(eps0, n, grid=2, width=1).delta(eps)
    assert coarse[0] - coarse[2] <= est - down      # a coarser grid rounds more


@pytest.mark.parametrize("eps0,n,epss", [(2.0, 3000, (0.05, 0.15)), (1.0, 2000, (0.02, 0.05))])
def test_buckets_of_m_only_lower_the_value(eps0, n, epss):
    """Bucketing the count of reports with bit h'' = 1 (shifted by the pointwise coupling bound)
    gives at most the per-count sum, and not much less."""
    per_count = BitRRThirdCellDelta(eps0, n, grid=2, width=1)
    for eps in epss:
        ref = per_count.delta(eps)[0]
        for w, keep in ((3, 0.85), (8, 0.5)):
            v = BitRRThirdCellDelta(eps0, n, grid=2, width=w).delta(eps)[0]
            assert v <= ref * (1 + 1e-12)
            assert v >= keep * ref


def test_exact_third_cell_beats_the_count_pairs_and_tightens_the_gap():
    """At n = 1e4, eps0 = 2, delta = 1e-8: the whole output's divergence certifies 2.5% more
    eps than the best count pair; tight / lower goes from 1.18 to <= 1.16."""
    eps0, n, delta = 2.0, 10_000, 1e-8
    from rknn_ray.accounting.hockey import eps_for_delta
    old = max(eps_for_delta(pd, delta, eps0, upper=False) for pd in bitrr_pairs(eps0, n, 20))
    b = tight_bound("bitrr", kr=1, d=20)
    new, up = b.lower(eps0, n, delta), b.central_eps(eps0, n, delta)
    assert new >= 1.02 * old
    assert new <= up and up / new <= 1.16


def test_flip_probability_for_the_lower_bound_is_at_least_the_samplers():
    """More noise than the sampler's is a post-processing of its reports: a lower bound."""
    from rknn_ray.mechanisms.randomized_response import rr_flip_probability
    for eps0 in (0.1, 1.0, 2.0, 4.0, 8.0):
        assert bitrr_flip_probability_hi(eps0) >= rr_flip_probability(eps0, 1, 1)
        assert bitrr_flip_probability_hi(eps0) > bitrr_flip_probability(eps0)
        assert bitrr_flip_probability_hi(eps0) <= 1.0 / (math.exp(eps0 / 2) + 1.0) * (1 + 1e-12)


def _hist_delta(A, Ap, O, n, eps):
    """Exact delta of the histogram of n reports over len(O) categories: user 1 with law A
    (P) or Ap (Q), the other n - 1 with law O."""
    def add(dist, lw):
        out = defaultdict(float)
        for h, pr in dist.items():
            for j, w in enumerate(lw):
                if w:
                    out[tuple(sorted(h + (j,)))] += pr * w
        return out

    base = {(): 1.0}
    for _ in range(n - 1):
        base = add(base, O)
    P, Q = add(base, A), add(base, Ap)
    ee = math.exp(eps)
    return sum(max(P[h] - ee * Q.get(h, 0.0), 0.0) for h in P)


@pytest.mark.parametrize("eps0,n,l,eps", [(1.0, 3, 3, 0.1), (2.0, 3, 3, 0.3), (2.0, 2, 4, 0.2)])
def test_collision_third_value_matches_brute_force_over_every_hash(eps0, n, l, eps):
    """Each report (its own hash triple (H(v), H(v'), H(v'')) uniform on [l]^3, its cell z):
    l^4 categories, enumerated; user 1 on v vs v', the others on v''."""
    pd = CollisionThirdValueExactDelta(eps0, n, l, grid=1 << 12, width=1)
    p, cats = pd.p, list(itertools.product(range(l), repeat=4))
    a = 1.0 / (p + l - 1.0)
    A, Ap, O = ([(p * a if c[3] == c[w] else a) / l ** 3 for c in cats] for w in (0, 1, 2))
    exact = _hist_delta(A, Ap, O, n, eps)
    est, _, down = pd.delta(eps)
    assert exact * 0.999 <= est - down <= exact
    # and the tight Collision bound sits above it
    up = tight_bound("collision", l=l, c=1).pair_delta(eps0, n).delta(eps)
    assert up[0] + up[1] >= exact


@pytest.mark.parametrize("eps0,n,k,eps", [(1.0, 4, 3, 0.2), (2.0, 5, 4, 0.3), (3.0, 6, 5, 0.5)])
def test_krr_third_value_matches_brute_force(eps0, n, k, eps):
    p = math.exp(eps0)
    a = 1.0 / (p + k - 1.0)
    A, Ap, O = ([p * a if y == x else a for y in range(k)] for x in (0, 1, 2))
    exact = _hist_delta(A, Ap, O, n, eps)
    est, _, down = KRRThirdValueExactDelta(eps0, n, k, grid=1 << 8, width=1).delta(eps)
    assert exact * 0.995 <= est - down <= exact


@pytest.mark.parametrize("l,eps0,n", [(4, 1.0, 10_000), (8, 2.0, 20_000)])
def test_collision_lower_bound_rises_and_stays_below_tight(l, eps0, n):
    """The whole output's divergence certifies more eps than the count pairs (1.165 -> 1.10
    tight / lower at l = 4, eps0 = 1, n = 1e4), never above the tight bound."""
    from rknn_ray.accounting.hockey import eps_for_delta
    from rknn_ray.accounting.shuffled_rr import collision_pair, collision_third_value_pairs
    delta = 1e-8
    old = max(eps_for_delta(pd, delta, eps0, upper=False)
              for pd in [collision_pair(eps0, n, l)] + collision_third_value_pairs(eps0, n, l))
    b = tight_bound("collision", l=l, c=1)
    new, up = b.lower(eps0, n, delta), b.central_eps(eps0, n, delta)
    assert old < new <= up

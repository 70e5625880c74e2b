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

from rknn_ray.accounting.exact_lower import (BitRRThirdCellDelta, bitrr_flip_probability_hi)
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

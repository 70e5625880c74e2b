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


# ---------------------------------------------------------------- parameters of the lower bounds
# A lower bound holds for the sampler only if its mechanism is a post-processing of the
# sampler's: a flip probability at least the sampler's, a ratio at most the sampler's.

def _sampler_bitrr_ratio(eps0):
    from fractions import Fraction
    from rknn_ray.mechanisms.randomized_response import rr_flip_probability
    q = Fraction(rr_flip_probability(eps0, 1, 1))
    return ((1 - q) / q) ** 2


def _sampler_collision_ratio(eps0, l):
    from fractions import Fraction
    from rknn_ray.mechanisms.collision import collision_member_threshold
    pi = Fraction(collision_member_threshold(eps0, l, 1), 1 << 53)
    return pi * (l - 1) / (1 - pi)


@pytest.mark.parametrize("eps0", [0.1, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0])
def test_bitrr_count_pairs_use_at_most_the_samplers_ratio(eps0):
    """bitrr_pairs used a flip probability 1e-15 *below* the sampler's (a ratio ~3e-15 above
    it): the unsafe direction for a lower bound. Every pair's p must be at most the sampler's
    ((1 - q_s)/q_s)^2, exactly; the third-cell sum's q at least q_s."""
    from fractions import Fraction
    from rknn_ray.mechanisms.randomized_response import rr_flip_probability
    ratio = _sampler_bitrr_ratio(eps0)
    pairs = bitrr_pairs(eps0, 100, 20)
    ps = [pairs[0].p] + [pd.pair.p for pd in pairs[1:]]
    assert all(Fraction(p) <= ratio for p in ps), [float(Fraction(p) / ratio - 1) for p in ps]
    third = BitRRThirdCellDelta(eps0, 10)
    assert Fraction(third.q) >= Fraction(rr_flip_probability(eps0, 1, 1))
    assert third.r_z == 0 and third.r_hit == 0          # q and 1 - q exact


@pytest.mark.parametrize("eps0,l", [(0.5, 3), (1.0, 4), (2.0, 8), (2.0, 2), (4.0, 56), (6.0, 404),
                                    (10.0, 2), (12.0, 2), (1.0, 10_000), (0.05, 2)])
def test_collision_lower_bounds_use_at_most_the_samplers_ratio(eps0, l):
    """The count pairs used e^eps0 (above the sampler's ratio: it rounds its keep probability
    down), and the exact third-value sum e^eps0 (1 - 1e-12), which is above it where the keep
    probability is near 1 (l = 2, eps0 >= 10)."""
    from fractions import Fraction
    from rknn_ray.accounting.shuffled_rr import (CollisionThirdValueDelta, collision_pair,
                                                 collision_ratio_lo)
    ratio = _sampler_collision_ratio(eps0, l)
    assert Fraction(collision_ratio_lo(eps0, l)) <= ratio
    assert Fraction(collision_pair(eps0, 50, l).p) <= ratio
    assert Fraction(CollisionThirdValueExactDelta(eps0, 10, l).p) <= ratio
    assert Fraction(CollisionThirdValueDelta(eps0, 10, l).p) <= ratio
    # and not needlessly far below it
    assert collision_ratio_lo(eps0, l) >= float(ratio) * (1 - 1e-9)


@pytest.mark.parametrize("eps0", [0.01, 0.3, 1.0, 2.0, math.log(13.0), 6.0, 20.0])
def test_krr_lower_bounds_use_a_ratio_at_most_e_eps0(eps0):
    """k-RR's lower bounds are for k-RR at eps0 (exact arithmetic): their ratio must not exceed
    e^eps0 (math.exp may round up). exp_lower is a lower bound of e^eps0 within 2^-150."""
    from fractions import Fraction
    from rknn_ray.accounting.shuffled_rr import exp_lo, krr_pair
    from rknn_ray.mechanisms.exact import exp_lower
    lo = exp_lower(Fraction(eps0))
    assert Fraction(exp_lo(eps0)) < lo
    assert Fraction(krr_pair(eps0, 50, 4).p) < lo
    assert Fraction(KRRThirdValueExactDelta(eps0, 10, 4).p) < lo


@pytest.mark.parametrize("eps0,n,eps", [(2.0, 6, 0.05), (1.0, 5, 0.2), (4.0, 6, 1.0), (2.0, 6, 0.5)])
def test_bucketed_third_cell_sum_stays_below_brute_force(eps0, n, eps):
    """Buckets of M (the averaged coupling's shifts, raised to levels) against the histogram's
    exact divergence: never above it."""
    exact = brute_delta(BitRRThirdCellDelta(eps0, n).q, n, eps)
    for w in (2, 3, n + 1):
        est, _, down = BitRRThirdCellDelta(eps0, n, grid=1 << 12, width=w).delta(eps)
        assert est - down <= exact


@pytest.mark.parametrize("eps0,n,l,epss", [(2.0, 2000, 8, (0.1, 0.2)), (0.5, 3000, 3, (0.04, 0.08))])
def test_collision_buckets_only_lower_the_value(eps0, n, l, epss):
    """Collision's exact sum with wide buckets of M (up to two sd) is at most the per-count sum,
    and close to it at the default width."""
    per_count = CollisionThirdValueExactDelta(eps0, n, l, width=1)
    default = CollisionThirdValueExactDelta(eps0, n, l)
    sd = math.sqrt(n * per_count.q_z * (1 - per_count.q_z))
    for eps in epss:
        ref = per_count.delta(eps)[0]
        for w in (max(2, int(sd / 4)), int(2 * sd)):
            v = CollisionThirdValueExactDelta(eps0, n, l, width=w).delta(eps)[0]
            assert v <= ref * (1 + 1e-12) and v >= 0.5 * ref
        assert default.delta(eps)[0] >= 0.97 * ref

"""The tight bound's dominating pair buckets finer where the pair stays small (issue 50):
composed over rounds it sits within 0.2% of the one-bucket-per-count pair, and it still
dominates the bound (pessimistic rounding kept)."""
import math

import pytest

from rknn_ray.accounting.shuffle_pld import composed_eps, pld_from_pair
from rknn_ray.accounting.tight import PAIR_BUCKETS, tight_bound


def _composed(bound, eps0, n, rounds, delta, **kw):
    lp, lq = bound.dominating_pair(eps0, n, **kw)
    pld = pld_from_pair(lp, lq)
    return [composed_eps(pld, r, delta) for r in rounds]


def test_default_buckets_compose_within_0p2_percent_of_one_bucket_per_count():
    b = tight_bound("krr", k=4)
    eps0, n, delta = math.log(13), 300, 1e-6
    fine = _composed(b, eps0, n, (4, 16), delta)
    ref = _composed(b, eps0, n, (4, 16), delta, max_buckets=10**6)   # one bucket per count
    coarse = _composed(b, eps0, n, (4, 16), delta, max_buckets=8)   # the old default
    for f, r, c in zip(fine, ref, coarse):
        assert r <= f * (1 + 1e-9) <= r * 1.002
        assert f < c                                                  # finer pays


def test_default_buckets_are_finer_than_the_old_eight_and_the_pair_dominates():
    b = tight_bound("krr", k=4)
    eps0, n = math.log(13), 300
    lp, lq = b.dominating_pair(eps0, n)
    assert len(lp) > len(b.dominating_pair(eps0, n, max_buckets=PAIR_BUCKETS[-1])[0])
    pld = pld_from_pair(lp, lq)
    for delta in (1e-4, 1e-7):
        assert pld.get_epsilon_for_delta(delta) >= b.central_eps(eps0, n, delta) * (1 - 1e-9)

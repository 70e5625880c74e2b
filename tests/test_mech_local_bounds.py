"""Theorem 1 / Theorem 2 and the rigorous bounds, against measured sup-norm errors."""
import math

import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.bounds import (bernstein_bound, laplace_sum_bound, sup_error,
                                        theorem1_bound, theorem2_bound)

BETA = 0.05


def population(rng, n, s, Y, k, r):
    nb = np.argsort(rng.random((n, s)), axis=1)[:, :k]
    lb = np.argsort(rng.random((n, Y)), axis=1)[:, :r]
    return RecordAnswers(nb, lb, np.arange(n), s, Y)


def exceed_rate(mech, ans, bound, trials, rng):
    """Fraction of (trial, bucket) pairs whose sup error over |Y| cells reaches ``bound``."""
    truth = ans.counts()
    errs = np.concatenate([sup_error(mech.estimate(mech.randomize(ans, rng).payloads,
                                                   ans.num_clients), truth)
                           for _ in range(trials)])
    return float((errs >= bound).mean()), errs


def test_theorem_formulas_by_hand():
    e = math.exp(1.0 / 4)                                   # eps=1, k=2, r=1
    want = (e + 1) / (e - 1) * math.sqrt(3 * 100 * math.log(10 / 0.1) / (e + 1))
    assert theorem1_bound(1.0, 2, 1, 10, 100, 0.1) == pytest.approx(want)
    # Theorem 2's factor with the paper's real-valued l, as printed in its proof.
    eps, c = 0.7, 4
    E = math.exp(eps)
    factor = (c * E + 2 * c - 1) * (2 * c * E + c - 1) / (c * (E * E - 1) - (E - 1))
    l = 2 * c - 1 + c * E
    printed = theorem2_bound(eps, 2, 2, 10, 100, 0.1, variant="printed")
    assert printed == pytest.approx(factor * math.sqrt(2 * 100 * math.log(100) / l))
    assert theorem2_bound(eps, 2, 2, 10, 100, 0.1) == pytest.approx(l * printed)
    # Bernstein solves its own equation.
    t = bernstein_bound(50, 2.0, 3.0, 10, 0.1)
    assert 20 * math.exp(-t * t / (2 * (50 * 2.0 + 3.0 * t / 3))) == pytest.approx(0.1)


def test_laplace_sum_bound_is_valid_and_near_gaussian_for_large_n():
    b = 4.0
    t1 = laplace_sum_bound(1, 1, BETA, b, discrete=False)
    assert b * math.log(1 / BETA) <= t1 <= 2 * b * math.log(1 / BETA)   # exact: b log(1/beta)
    gauss = math.sqrt(2 * (2 * 1000 * b * b) * math.log(2 / BETA))
    for discrete in (False, True):
        assert 0.99 * gauss < laplace_sum_bound(1000, 1, BETA, b, discrete) < 1.01 * gauss


def test_rr_theorem1_and_bernstein_hold():
    rng = np.random.default_rng(10)
    ans = population(rng, 2000, 40, 10, 2, 1)
    m = build("local", "rr", MechanismParams(40, 10, 2, eps=1.0, r=1))
    t1, tb = m.error_bound(BETA, 2000), m.error_bound(BETA, 2000, method="bernstein")
    rate, errs = exceed_rate(m, ans, min(t1, tb), 8, rng)
    assert rate <= BETA
    assert errs.max() > 0.3 * min(t1, tb)                   # the bounds are not vacuous


def test_collision_theorem2_variants_and_bernstein():
    rng = np.random.default_rng(11)
    n, s, Y = 2000, 40, 10
    ans = population(rng, n, s, Y, 2, 1)
    m = build("local", "collision", MechanismParams(s, Y, 2, eps=1.0, r=1))
    solved, printed = m.error_bound(BETA, n), m.error_bound(BETA, n, method="printed")
    bern = m.error_bound(BETA, n, method="bernstein")
    assert printed < bern < solved
    rate_printed, errs = exceed_rate(m, ans, printed, 8, rng)
    assert rate_printed <= BETA                             # fine at eps = O(1), spread-out data
    assert (errs >= bern).mean() <= BETA and errs.max() < solved


def test_printed_theorem2_fails_on_full_buckets_at_large_eps():
    """At large eps occupied cells have variance ~ p l / 1 times an empty one's: the
    printed bound (tuned to empty cells) is exceeded; Bernstein still holds."""
    rng = np.random.default_rng(12)
    n, s, Y = 500, 4, 10
    ans = RecordAnswers(np.tile([0, 1], (n, 1)), np.zeros((n, 1), dtype=np.int64),
                        np.arange(n), s, Y)
    m = build("local", "collision", MechanismParams(s, Y, 2, eps=5.0, r=1))
    rate_printed, errs = exceed_rate(m, ans, m.error_bound(BETA, n, method="printed"), 25, rng)
    assert rate_printed > 0.2
    assert (errs >= m.error_bound(BETA, n, method="bernstein")).mean() <= BETA


@pytest.mark.parametrize("name", ["separation", "concatenation", "laplace"])
def test_other_bounds_hold(name):
    rng = np.random.default_rng(13)
    n, s, Y = 1000, 12, 6
    ans = population(rng, n, s, Y, 2, 1)
    m = build("local", name, MechanismParams(s, Y, 2, eps=2.0, r=1))
    bound = m.error_bound(BETA, n)
    rate, errs = exceed_rate(m, ans, bound, 10, rng)
    assert rate <= BETA and errs.max() > 0.2 * bound
    with pytest.raises(ValueError, match="method|bound"):
        m.error_bound(BETA, n, method="theorem-9")

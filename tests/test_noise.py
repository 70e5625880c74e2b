"""Discrete Laplace (the exact sampler of the central release): support, mean, variance,
pmf and the DP ratio; the paper's continuous Laplace."""
import math

import numpy as np
import pytest

from rknn_ray.mechanisms.exact import discrete_laplace as exact_discrete_laplace
from rknn_ray.mechanisms.noise import (continuous_laplace, discrete_laplace_pmf,
                                       discrete_laplace_variance)
from rknn_ray.rng import seeded_generator


def discrete_laplace(scale, n, rng):
    return exact_discrete_laplace(rng, scale, (n,))


@pytest.mark.parametrize("scale", [0.7, 2.0, 10.0])
def test_moments_match_theory(scale):
    n = 40000
    x = discrete_laplace(scale, n, seeded_generator(1))
    assert x.dtype == np.int64
    var = discrete_laplace_variance(scale)
    # mean: 6 standard errors; variance: relative tolerance from its own sampling error
    assert abs(x.mean()) < 6 * math.sqrt(var / n)
    kurt_se = var * math.sqrt(2.0 / n) * 3  # generous for a heavy-ish tail
    assert abs(x.var() - var) < 6 * kurt_se


def test_pmf_matches_empirical_frequencies():
    scale, n = 1.5, 60000
    x = discrete_laplace(scale, n, seeded_generator(2))
    for v in range(-4, 5):
        p = discrete_laplace_pmf(v, scale)
        freq = np.mean(x == v)
        assert abs(freq - p) < 6 * math.sqrt(p * (1 - p) / n), v


def test_central_release_without_generator_draws_fresh_integer_noise():
    """rng None (run.rng secure): each release keys its own ChaCha20 from the OS CSPRNG."""
    from rknn_ray.mechanisms import MechanismParams, build

    mech = build("central", "laplace", MechanismParams(100, 10, 1, eps=1.0))
    zero = np.zeros((100, 10), np.int64)
    a, b = mech.add_noise(zero, None), mech.add_noise(zero, None)
    assert a.dtype == np.int64 and a.shape == (100, 10)
    assert not np.array_equal(a, b)
    var = discrete_laplace_variance(2.0)                    # scale 2kr/eps = 2
    both = np.concatenate([a.ravel(), b.ravel()])
    assert abs(both.mean()) < 6 * math.sqrt(var / both.size)


def test_pmf_ratio_is_eps_for_sensitivity():
    eps, sens = 0.8, 4
    scale = sens / eps
    xs = np.arange(-200, 201)
    ratio = discrete_laplace_pmf(xs, scale) / discrete_laplace_pmf(xs + sens, scale)
    assert ratio.max() <= math.exp(eps) * (1 + 1e-12)
    assert ratio.max() == pytest.approx(math.exp(eps))


def test_bad_scale_rejected():
    with pytest.raises(ValueError, match="scale"):
        discrete_laplace(0.0, 3, seeded_generator(0))
    with pytest.raises(ValueError, match="scale"):
        continuous_laplace(-1.0, 3, seeded_generator(0))


def test_exact_for_non_dyadic_float_scale():
    # 2 / 0.1 is not exactly 20 in binary; the sampler must still run exactly.
    x = discrete_laplace(2 / 0.1, 5000, seeded_generator(3))
    assert abs(x.var() - discrete_laplace_variance(20.0)) < 0.15 * discrete_laplace_variance(20.0)

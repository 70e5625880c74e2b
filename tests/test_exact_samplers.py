"""Exact integer samplers and the ChaCha20 randomness they run on.

The samplers are checked against their closed-form pmfs (scipy) on large samples
with exact binomial tests per cell (alpha 1e-6), and the generator against an independent ChaCha20
(the ``cryptography`` package's keystream).
"""
import math
from fractions import Fraction

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy import stats

from rknn_ray.mechanisms import exact
from rknn_ray.rng import chacha_generator, derived_generator, secure_generator

N = 200_000


def assert_pmf(draws: np.ndarray, pmf, support: range, alpha: float = 1e-6):
    """Every listed cell, and the mass outside them, passes an exact binomial test at alpha.

    Exact rather than a normal approximation: for rare cells (expected count below 1)
    the sigma rule flags a count of 2 as a 13-sigma event when it happens ~1% of runs.
    """
    draws = np.asarray(draws)
    n, inside = draws.size, 0.0
    for x in support:
        p = float(pmf(x))
        count = int((draws == x).sum())
        assert stats.binomtest(count, n, p).pvalue >= alpha, (x, count, n * p)
        inside += p
    outside = int(((draws < support.start) | (draws >= support.stop)).sum())
    assert stats.binomtest(outside, n, min(max(1.0 - inside, 0.0), 1.0)).pvalue >= alpha, (
        "tail", outside, n * (1.0 - inside))


def test_generator_is_the_chacha20_keystream_of_the_cryptography_package():
    key = bytes(range(32))
    ours = chacha_generator(key).bit_generator.random_raw(32)
    stream = Cipher(algorithms.ChaCha20(key, bytes(16)), None).encryptor().update(bytes(256))
    assert np.array_equal(ours, np.frombuffer(stream, "<u8"))


def test_derived_generators_repeat_per_labels_and_differ_across_them():
    secret = b"s" * 32
    a = derived_generator(secret, "job", 0, 3).integers(0, 2**62, 8)
    b = derived_generator(secret, "job", 0, 3).integers(0, 2**62, 8)
    c = derived_generator(secret, "job", 1, 3).integers(0, 2**62, 8)
    d = derived_generator(b"t" * 32, "job", 0, 3).integers(0, 2**62, 8)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c) and not np.array_equal(a, d)
    assert type(derived_generator(secret).bit_generator).__name__ == "ChaCha"
    assert type(secure_generator().bit_generator).__name__ == "ChaCha"


def test_rounding_always_goes_towards_more_noise():
    for g in (1 / 3, 0.1 / 6, 2.0, 1e-9):
        r = exact.noisier_rate(g)
        assert r <= Fraction(g) and Fraction(g) - r < Fraction(1, 2**40)
    for lam in (0.0, 1 / 3, 7.25, 1e-7):
        m = exact.noisier_mean(lam)
        assert m >= Fraction(lam) and m - Fraction(lam) < Fraction(1, 2**40)
    with pytest.raises(ValueError, match="raise eps"):
        exact.noisier_rate(1e-15)


@pytest.mark.parametrize("g", [Fraction(1, 3), Fraction(5, 2), exact.noisier_rate(0.37)])
def test_bernoulli_exp_has_probability_exp_minus_g(g):
    draws = exact.bernoulli_exp(secure_generator(), g, N)
    p = math.exp(-float(g))
    assert abs(draws.mean() - p) <= 5 * math.sqrt(p * (1 - p) / N)


@pytest.mark.parametrize("g", [Fraction(1, 3), Fraction(7, 4), exact.noisier_rate(1 / 6)])
def test_geometric_matches_its_pmf(g):
    q = math.exp(-float(g))
    draws = exact.geometric(secure_generator(), g, N)
    assert draws.min() >= 0
    assert_pmf(draws, lambda x: (1 - q) * q ** x, range(0, 12))


def test_discrete_laplace_matches_its_pmf_and_is_symmetric():
    scale = 2.5
    q = math.exp(-float(exact.noisier_rate(1 / scale)))
    draws = exact.discrete_laplace(secure_generator(), scale, (N,))
    assert_pmf(draws, lambda x: (1 - q) / (1 + q) * q ** abs(x), range(-8, 9))
    var = 2 * q / (1 - q) ** 2
    assert abs(draws.var() - var) < 0.05 * var


@pytest.mark.parametrize("r,g", [(Fraction(1, 7), Fraction(1, 5)),
                                 (Fraction(1, 1000), exact.noisier_rate(0.05)),
                                 (Fraction(17, 7), Fraction(1, 2)), (Fraction(2), Fraction(1))])
def test_negative_binomial_matches_its_pmf(r, g):
    q = math.exp(-float(g))
    ref = stats.nbinom(float(r), 1 - q)            # failures before r successes, P(fail) = q
    draws = exact.negative_binomial(secure_generator(), r, g, N)
    assert_pmf(draws, ref.pmf, range(0, 10))
    assert abs(draws.mean() - ref.mean()) < 5 * math.sqrt(ref.var() / N) + 1e-9


@pytest.mark.parametrize("lam", [Fraction(0), Fraction(1, 10), Fraction(1, 2), Fraction(37, 10),
                                 exact.noisier_mean(12.345)])
def test_poisson_matches_its_pmf(lam):
    draws = exact.poisson(secure_generator(), lam, N)
    if lam == 0:
        assert not draws.any()
        return
    ref = stats.poisson(float(lam))
    assert_pmf(draws, ref.pmf, range(0, int(float(lam) * 2) + 3))


def test_shares_of_negative_binomial_add_up_to_a_geometric():
    """n shares NB(1/n) sum to NB(1) = geometric: the multi-message protocol's identity."""
    rng, g, n = secure_generator(), Fraction(1, 4), 8
    total = sum(exact.negative_binomial(rng, Fraction(1, n), g, N // 4) for _ in range(n))
    q = math.exp(-0.25)
    assert_pmf(total, lambda x: (1 - q) * q ** x, range(0, 10))


def test_the_same_generator_state_gives_the_same_noise():
    """Retries re-create reports: a sampler is a function of the generator's stream."""
    key = b"k" * 32
    a = exact.negative_binomial(chacha_generator(key), Fraction(1, 9), Fraction(1, 3), 1000)
    b = exact.negative_binomial(chacha_generator(key), Fraction(1, 9), Fraction(1, 3), 1000)
    assert np.array_equal(a, b)

"""Exact integer noise (discrete Laplace) and the continuous Laplace of the paper.

The discrete Laplace distribution with scale ``b`` has P[X = x] proportional to
exp(-|x| / b) on the integers. Added to integer counts with L1 sensitivity
``Delta``, scale ``b = Delta / eps`` gives eps-DP (Canonne, Kamath, Steinke 2020,
"The Discrete Gaussian for Differential Privacy", Prop. / Alg. 2).

Sampling is exact: only integer arithmetic on rationals and uniform integers, so
no floating-point artefact can leak (Mironov 2012). ``b`` is converted to a
``Fraction`` exactly (a float is a dyadic rational), so no rounding either.

The uniform integers come from the generator's ``integers`` (a Philox stream keyed
from the OS CSPRNG under rng 'secure', see rknn_ray.rng) -- or, with
``source=secrets``, straight from ``secrets.randbelow``.
"""
from __future__ import annotations

import math
import secrets
from fractions import Fraction

import numpy as np


class _Uniform:
    """Uniform integers in [0, m) from a numpy Generator or the OS CSPRNG."""

    def __init__(self, rng: np.random.Generator | None):
        self.rng = rng

    def below(self, m: int) -> int:
        if self.rng is None:
            return secrets.randbelow(m)
        if m <= (1 << 62):
            return int(self.rng.integers(0, m))
        # Big denominators: rejection sampling on 62-bit limbs (exactly uniform).
        nbits = m.bit_length()
        while True:
            value = 0
            for _ in range((nbits + 61) // 62):
                value = (value << 62) | int(self.rng.integers(0, 1 << 62))
            value >>= (62 * ((nbits + 61) // 62) - nbits)
            if value < m:
                return value

    def bernoulli(self, p: Fraction) -> bool:
        return self.below(p.denominator) < p.numerator


def _bernoulli_exp_le1(num: int, den: int, u: _Uniform) -> bool:
    """Exact Bernoulli(exp(-num/den)) for 0 <= num/den <= 1, num/den in lowest terms
    (CKS 2020, Alg. 1). Plain integers, not ``Fraction`` (a third of the release's time):
    each trial ``gamma / k`` is reduced as ``Fraction`` reduces it, so the uniform draws,
    and a seeded release, are the same as with ``Fraction``."""
    k = 1
    while True:
        d = den * k
        g = math.gcd(num, d)
        if not u.below(d // g) < num // g:      # Bernoulli(gamma / k)
            return k % 2 == 1
        k += 1


def _bernoulli_exp(num: int, den: int, u: _Uniform) -> bool:
    """Exact Bernoulli(exp(-num/den)) for num/den >= 0 in lowest terms."""
    while num > den:
        if not _bernoulli_exp_le1(1, 1, u):
            return False
        num -= den                # (num - den) / den stays in lowest terms
    return _bernoulli_exp_le1(num, den, u)


def _one_discrete_laplace(scale: Fraction, u: _Uniform) -> int:
    """One exact draw, P[x] ~ exp(-|x|/scale) (CKS 2020, Alg. 2 with scale = t/s)."""
    t, s = scale.numerator, scale.denominator
    while True:
        uu = u.below(t)
        g = math.gcd(uu, t)                     # Fraction(uu, t) in lowest terms
        if not _bernoulli_exp(uu // g, t // g, u):
            continue
        v = 0
        while _bernoulli_exp(1, 1, u):
            v += 1
        y = (uu + t * v) // s
        negative = u.below(2) == 1
        if negative and y == 0:
            continue
        return -y if negative else y


def discrete_laplace(scale: float | Fraction, size: int | tuple,
                     rng: np.random.Generator | None = None) -> np.ndarray:
    """Exact discrete Laplace noise with P[x] ~ exp(-|x|/scale), as int64 array.

    ``rng=None`` draws every uniform integer from ``secrets`` (the OS CSPRNG).
    """
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError(f"discrete Laplace scale must be > 0, got {float(scale)}")
    u = _Uniform(rng)
    n = int(np.prod(size))
    out = np.fromiter((_one_discrete_laplace(scale, u) for _ in range(n)),
                      dtype=np.int64, count=n)
    return out.reshape(size)


def discrete_laplace_variance(scale: float) -> float:
    """Var of discrete Laplace(scale): 2 q / (1 - q)^2 with q = exp(-1/scale)."""
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (1.0 - q) ** 2


def discrete_laplace_pmf(x: np.ndarray, scale: float) -> np.ndarray:
    """P[X = x] = (1 - q) / (1 + q) * q^|x|, q = exp(-1/scale)."""
    q = math.exp(-1.0 / float(scale))
    return (1 - q) / (1 + q) * q ** np.abs(np.asarray(x, dtype=float))


def continuous_laplace(scale: float, size: int | tuple,
                       rng: np.random.Generator) -> np.ndarray:
    """The paper's Laplace(scale) noise (floating point; an option, not the default)."""
    if scale <= 0:
        raise ValueError(f"Laplace scale must be > 0, got {scale}")
    return rng.laplace(0.0, scale, size=size)

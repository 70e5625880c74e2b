"""The discrete Laplace's closed forms, and the continuous Laplace of the paper.

The discrete Laplace distribution with scale ``b`` has P[X = x] proportional to
exp(-|x| / b) on the integers. Added to integer counts with L1 sensitivity
``Delta``, scale ``b = Delta / eps`` gives eps-DP (Canonne, Kamath, Steinke 2020,
"The Discrete Gaussian for Differential Privacy"). Its exact sampler is
:func:`rknn_ray.mechanisms.exact.discrete_laplace`; this module holds its pmf and
variance (for tests, error bounds and estimators) and the paper's floating-point
Laplace, an option that is never the default (Mironov 2012).
"""
from __future__ import annotations

import math

import numpy as np


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

"""Error bounds of the local mechanisms: (eta, beta)-accuracy per bucket (|Y| cells).

An estimate is (eta, beta)-accurate at bucket t if max_y |a_t(y) - est_t(y)| < eta
with probability >= 1 - beta. All bounds here assume one record per client
(the paper's m_i = 1).

* :func:`theorem1_bound` -- Theorem 1 of paper 000 (randomized response), with the
  square root over the whole fraction as in its proof and in paper 002 (the
  long version's statement puts "/(e'+1)" outside the root: a slip).
* :func:`theorem2_bound` -- Theorem 2 (Collision). Its proof states the tail
  P[|u| > eta n/(p - 1/l)] <= exp(-eta^2 n / (2l)); solving that for beta/|Y|
  gives sqrt(2 n l log(|Y|/beta)) / (p - 1/l) ("solved", l in the numerator).
  That tail is valid (Hoeffding gives exp(-2 eta^2 n), stronger) but loose; the
  proof's last line sqrt(2 n log(|Y|/beta) / l) / (p - 1/l) ("printed") is the
  Gaussian approximation with the right variance n/l of an empty cell (what a
  Bernstein bound tends to for large n), not implied by the printed tail, and it
  ignores the larger variance of occupied cells at large eps.
* :func:`bernstein_bound` -- rigorous for any estimator that sums n independent
  bounded per-report terms (used for every 0/1 randomizer).
* :func:`laplace_sum_bound` -- rigorous Chernoff bound for sums of n (discrete or
  continuous) Laplace noises (local Laplace).
"""
from __future__ import annotations

import math

import numpy as np
from scipy.optimize import brentq, minimize_scalar


def _check(beta: float, n: int) -> None:
    if not 0 < beta < 1:
        raise ValueError(f"beta must be in (0, 1), got {beta}")
    if n < 1:
        raise ValueError(f"num_clients must be >= 1, got {n}")


def theorem1_bound(eps: float, k: int, r: int, num_classes: int, n: int, beta: float) -> float:
    """(e'+1)/(e'-1) * sqrt(3 n log(|Y|/beta) / (e'+1)), e' = e^{eps/(2kr)}."""
    _check(beta, n)
    e = math.exp(eps / (2 * k * r))
    return (e + 1) / (e - 1) * math.sqrt(3 * n * math.log(num_classes / beta) / (e + 1))


def theorem2_bound(eps: float, k: int, r: int, num_classes: int, n: int, beta: float,
                   l: int | None = None, variant: str = "solved") -> float:
    """Theorem 2 for the (s|Y|, kr, eps, l)-Collision mechanism.

    ``l`` defaults to the paper's real-valued 2kr - 1 + kr e^eps; with it, 1/(p - 1/l)
    equals the proof's factor (kr e^eps + 2kr - 1)(2kr e^eps + kr - 1) /
    (kr(e^{2eps} - 1) - (e^eps - 1)). ``variant``: 'solved' or 'printed' (module doc).
    """
    _check(beta, n)
    c = k * r
    l = 2 * c - 1 + c * math.exp(eps) if l is None else l
    omega = c * math.exp(eps) + l - c
    factor = 1.0 / (math.exp(eps) / omega - 1.0 / l)
    log_term = 2 * n * math.log(num_classes / beta)
    if variant == "solved":
        return factor * math.sqrt(log_term * l)
    if variant == "printed":
        return factor * math.sqrt(log_term / l)
    raise ValueError(f"variant must be 'solved' or 'printed', got {variant!r}")


def bernstein_bound(n: int, variance: float, max_dev: float, num_classes: int,
                    beta: float) -> float:
    """t with 2|Y| exp(-t^2 / (2 (n variance + max_dev t / 3))) = beta.

    For a cell estimate that is a sum of n independent per-report terms, each with
    variance <= ``variance`` and |term - mean| <= ``max_dev`` (Bernstein), union
    over the |Y| cells of a bucket and both tails.
    """
    _check(beta, n)
    L = math.log(2 * num_classes / beta)
    b = L * max_dev / 3
    return b + math.sqrt(b * b + 2 * L * n * variance)


def _laplace_log_mgf(lam: float, scale: float, discrete: bool) -> float:
    if discrete:
        a = math.exp(-1.0 / scale)
        return 2 * math.log1p(-a) - math.log1p(-a * math.exp(lam)) - math.log1p(-a * math.exp(-lam))
    return -math.log1p(-(scale * lam) ** 2)


def laplace_sum_bound(n: int, num_classes: int, beta: float, scale: float,
                      discrete: bool = True) -> float:
    """t with 2|Y| min_lam exp(-lam t) M(lam)^n = beta for n i.i.d. Laplace(scale).

    ``discrete``: P[x] ~ exp(-|x|/scale) on the integers, else the continuous Laplace.
    """
    _check(beta, n)
    lam_max = 1.0 / scale * (1 - 1e-9)
    target = math.log(beta / (2 * num_classes))

    def log_tail(t: float) -> float:
        res = minimize_scalar(lambda lam: -lam * t + n * _laplace_log_mgf(lam, scale, discrete),
                              bounds=(1e-12, lam_max), method="bounded",
                              options={"xatol": 1e-12 / scale})
        return float(res.fun)

    hi = scale * (math.sqrt(n) + 1)
    while log_tail(hi) > target:
        hi *= 2
    return float(brentq(lambda t: log_tail(t) - target, 0.0, hi, xtol=1e-9 * hi))


def sup_error(estimate: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-bucket sup-norm error max_y |est_t(y) - a_t(y)| (shape (..., s))."""
    return np.abs(np.asarray(estimate) - np.asarray(truth)).max(axis=-1)

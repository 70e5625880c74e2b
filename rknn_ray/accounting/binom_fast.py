"""Binomial pmfs and Bin(m, 1/2) tails for the shuffle bounds, vectorised and check-free.

scipy.stats' binomial (boost's incomplete beta per element, behind per-call argument
checks) made the numerical bounds cost seconds at n = 1e8. Here:

* ``binom_logpmf`` is Loader's saddle-point form (the one R's dbinom uses):
  log pmf = stirlerr(n) - stirlerr(k) - stirlerr(n-k) - bd0(k, np) - bd0(n-k, nq)
            + log(n / (2 pi k (n-k))) / 2,
  whose absolute error in the log is ~1e-16 * (|k - np| + 50), i.e. a relative error
  of the pmf below 1e-10 for every n <= 1e12 we evaluate (no gammaln cancellation,
  which would cost 1e-7 relative at n = 1e9).
* ``half_sf_path`` returns P[Bin(m_i, 1/2) >= t_i] along a path of consecutive m_i
  whose threshold moves by at most one per step (the hockey-stick threshold is
  linear in m with slope <= 1 where delta > 0). One tail, summed from Loader pmfs,
  anchors the path; the exact recurrences
      P[Bin(m+1) >= t] = P[Bin(m) >= t] + pmf(m, t-1) / 2
      P[Bin(m) >= t+1] = P[Bin(m) >= t] - pmf(m, t)
  advance it by a cumulative sum of pmfs. It returns an absolute error bound with
  the tails (a-priori pmf and rounding errors, and a closing check against an
  independent sum at the far end), which the bounds add on the safe side.
  (scipy's bdtrc, cephes' incomplete beta, is only ~1e-7 relative at m ~ 1e7.)
"""
from __future__ import annotations

import math

import numpy as np

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
# bdtrc's relative error grows ~linearly in m: measured <= 1.9e-15 m (m = 1e3 .. 1e6,
# scores 0.5 .. 12, against 25-digit sums); x2 margin.
EXACT_RTOL_PER_M = 4e-15
# Below this m the path's score z changes fast along it (tails fall by orders of
# magnitude and the recurrence's absolute error is no longer small relative to them):
# evaluate such paths exactly, where bdtrc is accurate anyway.
PATH_MIN_M = 2000


def _stirlerr(n: np.ndarray) -> np.ndarray:
    """log(n!) - log(sqrt(2 pi n) (n/e)^n), n >= 1 (float array)."""
    def series(x):
        nn = x * x
        # asymptotic series; first omitted term 691/(360360 n^11) < 1e-16 for n > 15
        return (1 / 12 - (1 / 360 - (1 / 1260 - (1 / 1680 - (1 / 1188) / nn) / nn) / nn) / nn) / x
    if n.size and n.min() > 1000:
        # two terms: the first omitted, 1/(1260 n^5), is < 1e-18
        return (1 / 12 - (1 / 360) / (n * n)) / n
    if n.size == 0 or n.min() > 15:
        return series(n)
    from scipy.special import gammaln  # defers scipy
    small = n <= 15
    out = series(np.where(small, 16.0, n))
    s = n[small]
    out[small] = gammaln(s + 1.0) - (s + 0.5) * np.log(s) + s - _LOG_SQRT_2PI
    return out


def _bd0(x: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """x log(x/mu) + mu - x (>= 0) without cancellation: mu ((1+u) log1p(u) - u), u = x/mu - 1."""
    u = (x - mu) / mu
    return mu * ((1.0 + u) * np.log1p(u) - u)


def _inner_logpmf(kf: np.ndarray, nf: np.ndarray, p: float) -> np.ndarray:
    return (_stirlerr(nf) - _stirlerr(kf) - _stirlerr(nf - kf)
            - _bd0(kf, nf * p) - _bd0(nf - kf, nf * (1.0 - p))
            + 0.5 * np.log(nf / (2.0 * math.pi * kf * (nf - kf))))


def _inner_logpmf_one_n(kf: np.ndarray, n: float, p: float) -> np.ndarray:
    """:func:`_inner_logpmf` for one n: its terms once, not once per k (the same values:
    stirlerr(n) is arithmetic on n alone, and the rest is elementwise in k)."""
    nk = n - kf
    return (_stirlerr(np.array([n]))[0] - _stirlerr(kf) - _stirlerr(nk)
            - _bd0(kf, n * p) - _bd0(nk, n * (1.0 - p))
            + 0.5 * np.log(n / (2.0 * math.pi * kf * nk)))


def binom_logpmf(k, n, p: float) -> np.ndarray:
    """log P[Bin(n, p) = k], elementwise (integer arrays k, n; 0 < p < 1); -inf off the support."""
    k = np.asarray(k, dtype=np.int64)
    if k.size and np.ndim(n) == 0:                  # the common case: one n, no edges
        n0 = int(n)
        if k.min() > 0 and n0 - k.max() > 0:
            return _inner_logpmf_one_n(k.astype(float), float(n0), p)
    n = np.broadcast_to(np.asarray(n, dtype=np.int64), k.shape)
    if k.size and k.min() > 0 and (n - k).min() > 0:          # the common case: no edges
        return _inner_logpmf(k.astype(float), n.astype(float), p)
    kf, nf = k.astype(float), n.astype(float)
    out = np.full(k.shape, -np.inf)
    inner = (k > 0) & (k < n)
    if np.any(inner):
        out[inner] = _inner_logpmf(kf[inner], nf[inner], p)
    zero = (k == 0) & (n >= 0)
    out[zero] = nf[zero] * math.log1p(-p)
    full = (k == n) & (n > 0)
    out[full] = nf[full] * math.log(p)
    return out


def half_sf_exact(m, t) -> np.ndarray:
    """P[Bin(m, 1/2) >= t] by scipy.special.bdtrc (1 for t <= 0, 0 for t > m).

    The reference ("slow") path: cephes' incomplete beta, relative error ~2e-15 m
    (1e-12 at m = 1e3, 2e-9 at m = 1e6, 1e-7 at m ~ 2e7; against 25-digit sums).
    """
    from scipy.special import bdtrc  # defers scipy
    m = np.asarray(m, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    inside = (t >= 1) & (t <= m)
    out = np.where(t <= 0, 1.0, 0.0)
    if np.any(inside):
        out[inside] = bdtrc(t[inside] - 1, m[inside], 0.5)
    return out


def half_sf_sum(m: int, t: int) -> tuple[float, float]:
    """P[Bin(m, 1/2) >= t] as a sum of pmfs, and an absolute error bound.

    The upper tail from s = max(t, m - t + 1) is summed up to s + K by a cumulative
    product of pmf ratios pmf(j+1) = pmf(j) (m-j)/(j+1) (relative error <= one ulp per
    factor, plus the first pmf's). Hoeffding, P[X - m/2 >= x sd] <= exp(-x^2/2) with
    sd = sqrt(m)/2, bounds the rest by exp(-(z^2 + 60)/2) (z = s's score), which is
    added to the error bound. For t below the median, S = 1 - P[X >= m - t + 1].
    """
    m, t = int(m), int(t)
    if t <= 0:
        return 1.0, 0.0
    if t > m:
        return 0.0, 0.0
    s = max(t, m - t + 1)
    sd = math.sqrt(m) / 2.0
    z = max(0.0, (s - m / 2.0) / sd)
    z_end = math.sqrt(z * z + 60.0)
    stop = min(m, s + int(math.ceil((z_end - z) * sd)) + 2)
    j = np.arange(s, stop, dtype=float)
    ratios = np.empty(j.size + 1)
    ratios[0] = math.exp(float(binom_logpmf(np.array([s]), m, 0.5)[0]))
    ratios[1:] = (m - j) / (j + 1.0)
    tail = float(np.sum(np.cumprod(ratios)))
    err = tail * (pmf_rtol(s - m / 2.0) + 2.3e-16 * (2 * ratios.size + 4))
    if stop < m:
        err += math.exp(-0.5 * z_end * z_end)
    return (tail if s == t else 1.0 - tail), err


def half_pmf_path(m, k, block: int = 2048) -> tuple[np.ndarray, float]:
    """P[Bin(m_i, 1/2) = k_i] along consecutive m_i with |k_(i+1) - k_i| <= 1, and its
    relative error bound.

    One Loader pmf per block of ``block`` steps; inside a block the exact ratios
    pmf(m+1, k)/pmf(m, k) = (m+1)/(2(m+1-k)), pmf(m+1, k+1)/pmf(m, k) = (m+1)/(2(k+1)),
    pmf(m+1, k-1)/pmf(m, k) = (m+1) k / (2 (m-k+2) (m-k+1)) advance by a cumulative
    product (<= 6 ulps per step). Paths touching the support's edge are evaluated
    pointwise.
    """
    m = np.asarray(m, dtype=np.int64)
    k = np.asarray(k, dtype=np.int64)
    N = m.size
    rel_loader = pmf_rtol(float(np.abs(k - m / 2.0).max(initial=0.0)) + 1)
    d = np.diff(k)
    if (N < 2 * block or k.min() < 1 or np.any(k >= m) or np.any(np.diff(m) != 1)
            or np.any(np.abs(d) > 1)):
        return np.exp(binom_logpmf(k, m, 0.5)), rel_loader
    mf, kf = m[:-1].astype(float), k[:-1].astype(float)
    ratio = np.where(d == 0, (mf + 1.0) / (2.0 * (mf + 1.0 - kf)),
                     np.where(d == 1, (mf + 1.0) / (2.0 * (kf + 1.0)),
                              (mf + 1.0) * kf / (2.0 * (mf - kf + 2.0) * (mf - kf + 1.0))))
    nb = -(-N // block)
    r = np.ones(nb * block)
    r[1:N] = ratio
    starts = np.arange(nb) * block
    r[starts] = np.exp(binom_logpmf(k[starts], m[starts], 0.5))
    out = np.cumprod(r.reshape(nb, block), axis=1).reshape(-1)[:N]
    return out, rel_loader + 6 * block * 1.12e-16


def half_sf_path(m, t, pmf_below=None, pmf_rel: float | None = None) -> tuple[np.ndarray, float]:
    """P[Bin(m_i, 1/2) >= t_i] for m_i consecutive and |t_(i+1) - t_i| <= 1, and an
    absolute error bound for every element (see module doc); short paths, paths at
    m < PATH_MIN_M and paths with larger steps are evaluated by half_sf_exact.
    ``pmf_below``: P[Bin(m_i, 1/2) = t_i - 1] if the caller has it already, with its
    relative error bound ``pmf_rel``.
    """
    m = np.asarray(m, dtype=np.int64)
    t = np.asarray(t, dtype=np.int64)
    N = m.size
    d = np.diff(t)
    if N < 64 or m[0] < PATH_MIN_M or np.any(np.diff(m) != 1) or np.any(np.abs(d) > 1):
        out = half_sf_exact(m, t)
        return out, EXACT_RTOL_PER_M * float(m.max(initial=1)) * float(out.max(initial=0.0))
    mm, tt = m[:-1].astype(float), t[:-1].astype(float)
    if pmf_below is None:
        pmf_below, pmf_rel = np.exp(binom_logpmf(t - 1, m, 0.5)), None
    # step i -> i+1 with f = pmf(m, t-1):  + f/2, then (up) - pmf(m+1, t) = - f (m+1)/(2t)
    # or (down) + pmf(m+1, t-1) = + f (m+1)/(2(m-t+2)): exact ratios of binomial coefficients
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.where(d == 1, (tt - mm - 1.0) / (2.0 * tt),
                          np.where(d == -1, 0.5 + (mm + 1.0) / (2.0 * (mm - tt + 2.0)), 0.5))
    inc = pmf_below[:-1] * factor
    out = np.empty(N)
    out[0], err0 = half_sf_sum(m[0], t[0])
    out[1:] = out[0] + np.cumsum(inc)
    # a-priori absolute error: every pmf within pmf_rtol (relative), the start sum's,
    # plus the cumulative sum's rounding (N ulps of the largest partial sum)
    rel = (pmf_rel if pmf_rel is not None else pmf_rtol(np.abs(t - m / 2.0).max() + 1)) + 4.5e-16
    err = err0 + rel * float(np.sum(np.abs(inc))) + N * 2.3e-16 * float(np.abs(out).max())
    # closing check against an independent sum at the far end (x10 margin if it is worse)
    end, err_end = half_sf_sum(m[-1], t[-1])
    err = max(err, 10.0 * (abs(out[-1] - end) + err_end))
    return np.clip(out, 0.0, 1.0), err


def pmf_rtol(max_offset: float) -> float:
    """Relative error bound of binom_logpmf's pmf where |k - np| <= max_offset (bd0's
    cancellation-free form loses ~1 ulp of |k - np| in the log; x4 margin)."""
    return 4.4e-16 * (float(max_offset) + 64.0)

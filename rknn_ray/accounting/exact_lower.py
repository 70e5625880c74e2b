"""Exact explicit-data-set lower bounds at every n: the n-fold law of one report's loss term.

For a data set where user 1 holds x (P) or x' (Q) and the other n - 1 users all hold the
same input with report law O, the shuffled output is the histogram of the reports, and

    P(hist) - e^eps Q(hist) = Mult_n(O)(hist) / n * sum_i V(y_i),
    V(y) = (A(y) - e^eps A'(y)) / O(y),

(A, A' the laws of user 1's report on x, x'), so

    delta(eps) = E[(V_1 + ... + V_n)_+] / n,   V_i i.i.d., y_i ~ O.

This is exact (no post-processing of the output is dropped) and V takes a handful of
values; the work is the n-fold law of their sum, here by exact lattice sums.

Per-bit RR, one hot cell (``bitrr``), others all hot on a third cell h'', user 1 on h vs
h': only the bits (y_h, y_h', y_h'') of each report matter (the other bits are i.i.d.
alike under every input), and with b = (1-q)/q, p = b^2,

    V = p^{-y''} (p^{y} - e^eps p^{y'}),   y, y' ~ Bern(q), y'' ~ Bern(1-q) under O.

Given M, the number of reports with y'' = 1 (M ~ Bin(n, 1-q)), the sum is

    S = (n - M + M/p)(1 - e^eps) + (p - 1) (U - e^eps U'),   U = N + K/p,

with N ~ Bin(n - M, q), K ~ Bin(M, q) (and U' an independent copy): the ones among bit h
in the y'' = 0 and y'' = 1 reports.  :class:`BitRRThirdCellDelta` computes, for each M,
the law of U rounded *down* and of U' rounded *up* to a grid (so S only decreases), the
expectation of the positive part exactly from prefix sums of positive terms, and sums
over M.  Where M is bucketed, each M in a bucket uses its bucket's law shifted: moving one
report from y'' = 0 to y'' = 1 changes its V by W (1/p - 1) (W = p^y - e^eps p^y'), and
under a coupling (the moved reports chosen uniformly) E[(S_M)_+] >= E[(S_{M0} - shift)_+],
the shift bounding the moved reports' *average* W over the law's support (Jensen;
:meth:`ThirdCellDelta._rates`), at most the worst case W <= p - e^eps per report (and
-(1 - 1/p)(e^eps p - 1) back).  Every step only lowers the value: rounding, the
shifts, mass left out of the windows (dropped), and a relative error bound on the
binomial pmfs and float sums (all terms are non-negative) taken off: the result is a
certified lower bound on the data set's exact delta, hence on the shuffled mechanism's.

The flip probability used is a hair *above* the sampler's (``bitrr_flip_probability_hi``, a
multiple of 2^-53, so q and 1 - q are exact floats): more noise is a post-processing (flip
again), so its divergence is below the sampler's.  Collision's ratio is
``collision_ratio_lo`` (at most the sampler's), k-RR's ``exp_lo`` (at most e^eps0).

Float parameters.  Where a binomial's parameter is a float computed from the model's exact
ones (Collision's 1/l and p a, k-RR's rates), |q~ - q| <= u min(q, 1 - q) with u = r 2^-53
max(1, q / (1 - q)) for r roundings, and the pmf's ratio is
exp(k log(q~/q) + (n - k) log((1-q~)/(1-q))) = exp(delta (k - n q)/(q(1-q)) + R), |R| <= n u^2,
so its relative error is at most expm1(2 u (|k - n q~| + 1) + 3 n u^2) (``_param_rtol``),
added to the pmf's own.  p enters only the loss terms V: its few ulps are far inside the
1e-12 n p e^eps margin taken off the sum.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rknn_ray.accounting.binom_fast import binom_logpmf, pmf_rtol
from rknn_ray.accounting.hockey import _window
from rknn_ray.accounting.shuffled_rr import bitrr_flip_probability_hi, collision_ratio_lo, exp_lo

#: mass each binomial window may leave out (dropped: only lowers a lower bound)
TAIL = 1e-13
#: floats of per-M laws kept across eps (the eps search re-uses them)
CACHE_FLOATS = 30_000_000
#: float error allowance per accumulated term (relative), on top of the pmfs' own
_FLOAT_REL_PER_TERM = 2.3e-16


#: default bucket width of M in sd(M) units (:class:`ThirdCellDelta`)
WIDTH_SD = 16.0
#: a bucket's shifts are raised to at most this many levels (one evaluation each)
SHIFT_LEVELS = 9

#: largest n the exact third-cell sum runs at by default (its cost grows ~ n: ~4 s at 1e6)
THIRD_CELL_MAX_N = 2_000_000


def third_cell_grid(n: int) -> int:
    """Grid cells per unit of U for :class:`BitRRThirdCellDelta` at n (finer where cheap)."""
    return max(1, min(8, int(2e5 / max(int(n), 1))))


def _param_u(q: float, roundings: int) -> float:
    """u of the module doc for a float q computed by ``roundings`` roundings (0: exact)."""
    return roundings * 2.0 ** -53 * max(1.0, q / (1.0 - q))


def _param_rtol(offset: float, n: int, u: float) -> float:
    """Relative error of Bin(n, q~)'s pmf as Bin(n, q)'s, |k - n q~| <= offset (module doc)."""
    if u == 0.0:
        return 0.0
    return math.expm1(2.0 * u * (offset + 1.0) + 3.0 * n * u * u)


def _pmf(n: int, q: float, tail: float, roundings: int = 0):
    """(lo, pmf over lo..hi, relative error bound) of Bin(n, q) (window leaves out <= tail);
    ``roundings``: how many float roundings q is from the model's exact parameter."""
    if n == 0:
        return 0, np.ones(1), 0.0
    lo, hi, _ = _window(n, q, tail, exact_out=False)
    k = np.arange(lo, hi + 1, dtype=np.int64)
    w = np.exp(binom_logpmf(k, n, q))
    off = max(abs(lo - n * q), abs(hi - n * q)) + 1
    return int(lo), w, pmf_rtol(off) + _param_rtol(off, n, _param_u(q, roundings))


def strided_convolve(w0: np.ndarray, G: int, pr: np.ndarray) -> np.ndarray:
    """``np.convolve(up, pr)`` for ``up`` = ``w0`` spread G apart (``up[::G] = w0``, zeros
    between): output index G k + r only meets ``pr[r::G]``, so G convolutions of w0 with a
    G-th of pr give it, G times fewer products (the zeros' products are skipped). Equal to
    the spread-out convolution up to the order of the float sums (G = 1: the same call)."""
    if G == 1:
        return np.convolve(w0, pr)
    law = np.zeros(G * (w0.size - 1) + pr.size)
    for r in range(min(G, pr.size)):
        part = np.convolve(w0, pr[r::G])
        law[r::G][:part.size] = part
    return law


class ThirdCellDelta:
    """delta(eps) = E[(sum_i V_i)_+] / n for V = p^{-z} (p^y - e^eps p^{y'}) with y, y' ~
    Bern(q_hit) and z ~ Bern(q_z), all independent: (estimate, 0, err_down), estimate -
    err_down a certified lower bound (module doc; :class:`BitRRThirdCellDelta`,
    :class:`CollisionThirdValueExactDelta` name the parameters).

    ``grid``: U is rounded to multiples of 1/grid; ``width``: M values per bucket (default:
    about sd(M) / 16, at least 1: exact per M at small n).  A bucket's M values use its centre's
    law shifted by :meth:`_rates` per report moved (the coupling's average, not its worst
    case: about 1% of the worst case at n = 1e6), so wide buckets cost little.
    """

    def __init__(self, p: float, q_hit: float, q_z: float, n: int, grid: int = 2,
                 width: int | None = None, tail: float = TAIL, roundings: tuple = (0, 0)):
        if not (p > 1.0 and 0.0 < q_hit < 1.0 and 0.0 < q_z < 1.0):
            raise ValueError("need p > 1 and probabilities in (0, 1)")
        self.p, self.q, self.q_z = float(p), float(q_hit), float(q_z)
        self.n, self.grid, self.tail = int(n), int(grid), tail
        sd = math.sqrt(self.n * self.q_z * (1.0 - self.q_z))
        self.width = max(1, int(sd / WIDTH_SD)) if width is None else max(1, int(width))
        self.r_hit, self.r_z = roundings     # float roundings of q_hit, q_z (module doc)
        self.m_lo, self.w_m, self.rel_m = _pmf(self.n, self.q_z, tail, self.r_z)
        self._laws = {}

    def _law(self, m: int):
        """(i_lo, P, i'_lo, F, J, rel, terms): grid indices of U rounded down (pmf P) and of U'
        rounded up (cdf F, J(t) = sum_{i' <= t} (t - i') P'(i')), for M = m."""
        if m in self._laws:
            return self._laws[m]
        n0, n1, G, p = self.n - m, m, self.grid, self.p
        a0, w0, r0 = _pmf(n0, self.q, self.tail, self.r_hit)
        a1, w1, r1 = _pmf(n1, self.q, self.tail, self.r_hit)
        k1 = np.arange(a1, a1 + w1.size, dtype=np.int64)
        out = []
        for rnd, fudge in ((np.floor, 1.0 - 1e-13), (np.ceil, 1.0 + 1e-13)):
            # float G k / p errs by a few ulps: nudged so the rounding errs on the safe side
            r = rnd(G * k1 / p * fudge).astype(np.int64)
            pr = np.bincount(r - r.min(), weights=w1)
            law = strided_convolve(w0, G, pr)
            out.append((G * a0 + int(r.min()), law))
        (i_lo, P), (j_lo, Pq) = out
        F = np.cumsum(Pq)
        J = np.concatenate(([0.0], np.cumsum(F)[:-1]))
        # the error counts the terms of the spread-out convolution (G (w0 - 1) + 1 of them
        # per output), more than strided_convolve sums: the bound holds for either
        terms = G * (w0.size - 1) + 1 + pr.size + 2 * F.size
        rel = 2.0 * (r0 + r1) + _FLOAT_REL_PER_TERM * terms
        self._cached = getattr(self, "_cached", 0) + P.size + 3 * F.size
        if self._cached > CACHE_FLOATS:        # the laws do not depend on eps: kept while small
            self._laws.clear()
            self._cached = 0
        # the windows of N (ones at h among the z = 0 reports) and K (among z = 1): the law's
        # support, over which :meth:`_rates` bounds the coupling's average
        wins = (a0, a0 + w0.size - 1, a1, a1 + w1.size - 1)
        self._laws[m] = law_ = (i_lo, P, j_lo, F, J, rel, wins)
        return law_

    def _rates(self, m0: int, ee: float) -> tuple[float, float]:
        """(d_up, d_dn): S_M >= S_{m0} - k d_up (M = m0 + k, k > 0) or - |k| d_dn (k < 0), in
        expectation's positive part, over the computed support of m0's law.

        Coupling: M = m0 + k arises from m0's configuration by moving k of its z = 0 reports,
        chosen uniformly, to z = 1 (z is independent of (y, y'), so this is M's exact
        conditional law); each moved report's term W = p^y - e^eps p^{y'} becomes W / p, so
        S_M = S_{m0} - (1 - 1/p) sum_moved W, and given the configuration the moved reports'
        mean W is T0 / (n - m0), T0 = sum over the z = 0 reports of W = (n - m0)(1 - e^eps) +
        (p - 1)(N - e^eps N').  By Jensen (x -> x_+ convex) E[(S_M)_+] >= E[(S_{m0} - (1 - 1/p)
        k T0 / (n - m0))_+], and on the support N <= N_hi, N' >= N_lo.  Back (k < 0): |k| of
        the z = 1 reports move to z = 0, S rises by (1 - 1/p) |k| T1 / m0, T1 = m0 (1 - e^eps)
        + (p - 1)(K - e^eps K') >= its value at K_lo, K'_hi.  Each rate is also at most the
        worst case per report ((1 - 1/p)(p - e^eps) and (1 - 1/p)(e^eps p - 1)) and >= 0."""
        p = self.p
        n_lo, n_hi, k_lo, k_hi = self._law(m0)[6]
        worst_up = (1.0 - 1.0 / p) * max(p - ee, 0.0)
        worst_dn = (1.0 - 1.0 / p) * max(ee * p - 1.0, 0.0)
        n0 = self.n - m0
        up = worst_up if n0 <= 0 else min(worst_up, max(0.0, (1.0 - 1.0 / p) * (
            (1.0 - ee) + (p - 1.0) * (n_hi - ee * n_lo) / n0)))
        dn = worst_dn if m0 <= 0 else min(worst_dn, max(0.0, (1.0 - 1.0 / p) * (
            (ee - 1.0) + (p - 1.0) * (ee * k_hi - k_lo) / m0)))
        return up, dn

    def _value(self, m0: int, shifts: np.ndarray, ee: float):
        """E[(S_{m0} - shift)_+] (rounded down) for each shift, and its relative error."""
        i_lo, P, j_lo, F, J, rel, _ = self._law(m0)
        p, G = self.p, self.grid
        scale = (p - 1.0) / G
        c = (self.n - m0 + m0 / p) * (1.0 - ee)
        i = i_lo + np.arange(P.size, dtype=np.float64)
        keep = P > 0
        i, Pi = i[keep], P[keep]
        out = np.empty(shifts.size)
        for s_, x in enumerate(shifts):
            a = (c - x) / scale
            # S / scale = a + i - ee i' > 0  <=>  i' < (a + i) / ee: t = largest such i'
            t = np.ceil((a + i) / ee).astype(np.int64) - 1
            tc = np.minimum(t, j_lo + F.size - 1)
            live = tc >= j_lo
            if not np.any(live):
                out[s_] = 0.0
                continue
            idx = tc[live] - j_lo
            lead = (a + i[live]) - ee * tc[live]
            # (a + i - ee t) > 0 by the choice of t (float: clip at 0, which only lowers)
            inner = np.maximum(lead, 0.0) * F[idx] + ee * J[idx]
            out[s_] = scale * float(np.dot(Pi[live], inner))
        return out, rel + _FLOAT_REL_PER_TERM * (4 * P.size + 8)

    def delta(self, eps: float) -> tuple[float, float, float]:
        ee, p = math.exp(eps), self.p
        # float p, e^eps and the sums' constants err by a few ulps: S is lowered by a margin
        # far above that (|S| terms are at most n p e^eps in size); the per-report shifts come
        # from :meth:`_rates` (they are 0.5% of this margin's size or more at every n here)
        total, err = _blocked_sum(self._value, self.m_lo, self.w_m, self.width, 0.0, 0.0,
                                  1e-12 * self.n * p * ee, ee, self.rel_m, rates=self._rates)
        return total / self.n, 0.0, err / self.n + 1e-300


def _blocked_sum(value, lo: int, weights: np.ndarray, width: int, d_up: float, d_dn: float,
                 safety: float, ee: float, rel_weights: float, rates=None) -> tuple[float, float]:
    """(sum, its error bound) of ``weights[i] * value(lo + i)`` over blocks of ``width``
    counts: each block's values come from one ``value(centre, shifts, ee)`` call, a count k
    away from the centre entering as a shift of k * d_up (k > 0) or -k * d_dn (``rates(centre,
    ee)`` gives (d_up, d_dn) per block where set), plus ``safety`` (only lowering the sum).
    ``value`` is non-increasing in the shift, so more than SHIFT_LEVELS shifts are raised to
    SHIFT_LEVELS evenly spaced levels (each to the smallest level >= it: only lowers). The
    error adds each block's relative error and the weights' own (``rel_weights``)."""
    counts = lo + np.arange(weights.size, dtype=np.int64)
    total, err = 0.0, 0.0
    for s in range(0, counts.size, width):
        block, wb = counts[s:s + width], weights[s:s + width]
        centre = int(block[block.size // 2])
        k = block - centre
        up, dn = (d_up, d_dn) if rates is None else rates(centre, ee)
        shifts = np.where(k > 0, k * up, -k * dn).astype(float) + safety
        if shifts.size > SHIFT_LEVELS:
            levels = np.linspace(shifts.min(), shifts.max(), SHIFT_LEVELS)
            at = np.minimum(np.searchsorted(levels, shifts, side="left"), SHIFT_LEVELS - 1)
            at = np.where(levels[at] >= shifts, at, SHIFT_LEVELS - 1)   # float guard
            lv, rel = value(centre, levels, ee)
            vals = np.where(levels[at] >= shifts, lv[at], 0.0)
        else:
            vals, rel = value(centre, shifts, ee)
        part = float(np.dot(wb, vals))
        total += part
        err += part * (rel + rel_weights)
    return total, err


class BitRRThirdCellDelta(ThirdCellDelta):
    """Per-bit RR (kr = 1) shuffled, user 1 hot on h vs h', the other n - 1 hot on a third
    cell h'': y, y' the bits h, h' (Bern(q)), z the bit h'' (Bern(1 - q)), p = ((1-q)/q)^2,
    at a flip probability q a hair above the sampler's (module doc)."""

    def __init__(self, eps0: float, n: int, grid: int = 2, width: int | None = None,
                 tail: float = TAIL, q: float | None = None):
        q = bitrr_flip_probability_hi(eps0) if q is None else float(q)
        b = (1.0 - q) / q
        # q is the model's parameter (exact); 1 - q is exact for a multiple of 2^-53 (the
        # default q), else one rounding
        exact = Fraction(1) - Fraction(q) == Fraction(1.0 - q)
        super().__init__(b * b, q, 1.0 - q, n, grid=grid, width=width, tail=tail,
                         roundings=(0, 0 if exact else 1))


class CollisionThirdValueExactDelta(ThirdCellDelta):
    """Collision (c = 1, Bloom length l), user 1 on v vs v', the other n - 1 all on v''.

    Each report carries its own fresh hash H_i (its seed), from a 3-wise independent family:
    (H_i(v), H_i(v'), H_i(v'')) is uniform on [l]^3, and z_i is l-RR around H_i(v'') (kept
    w.p. p a, a = 1/(p + l - 1)).  The likelihood ratio of report i depends on the three
    hits y = [z_i = H_i(v)], y' = [z_i = H_i(v')], z = [z_i = H_i(v'')] only, independent
    under the others' law: y, y' ~ Bern(1/l), z ~ Bern(p a), and
    V = (A - e^eps A') / O = p^{-z} (p^y - e^eps p^{y'}): every hash-match pattern, exactly.
    p is :func:`~rknn_ray.accounting.shuffled_rr.collision_ratio_lo`: at most the sampler's
    ratio (it rounds its keep probability down, by < 2^-53; the margin is proved there), and
    l-RR with a smaller p is a post-processing.  (It was e^eps0 lowered by 1e-12 relative, which
    is not below the sampler's ratio where its keep probability is near 0 or 1, e.g. l = 2 at
    eps0 >= 10.)"""

    def __init__(self, eps0: float, n: int, l: int, grid: int = 2, width: int | None = None,
                 tail: float = TAIL):
        if l < 2:
            raise ValueError("Collision needs l >= 2")
        p = collision_ratio_lo(eps0, l)
        # 1/l: one rounding; p / (p + l - 1): two (three allowed for each)
        super().__init__(p, 1.0 / l, p / (p + l - 1.0), n, grid=grid, width=width, tail=tail,
                         roundings=(3, 3))


class KRRThirdValueExactDelta:
    """delta(eps) of shuffled k-RR (k >= 3), user 1 on x vs x', the other n - 1 all on a third
    value v'': (estimate, 0, err_down), estimate - err_down certified below the data set's
    exact divergence of the whole histogram (the same data set as
    :class:`rknn_ray.accounting.shuffled_rr.KRRThirdValueDelta`, there exact at n ~ 1e3-1e4).

    Per report under O (on v''), a = 1/(p + k - 1): x w.p. a (V = p - e^eps), x' w.p. a
    (1 - e^eps p), v'' w.p. p a ((1 - e^eps)/p), each other value w.p. a (1 - e^eps).  With T
    the reports not on x / x' (T ~ Bin(n, (p + k - 3) a)), M of them on v'' (Bin(T, p / (p + k
    - 3))) and X of the n - T others on x (Bin(n - T, 1/2)):

        S = (1 - e)(T - M) + (1 - e) M / p + (1 - e p)(n - T) + (p - 1)(1 + e) X.

    For each T: the law of (e - 1)(1 - 1/p) M + (p - 1)(1 + e) X rounded down to a grid, the
    positive part from suffix sums of non-negative terms.  T is bucketed: one more report off
    x / x' changes S by >= -(p - 1), one less by >= -(e p - 1) + (e - 1)/p (a coupling), so
    each T uses its bucket's law shifted by that bound times the distance (only lowers).
    """

    def __init__(self, eps0: float, n: int, k: int, grid: int = 1, width: int | None = None,
                 tail: float = TAIL):
        if k < 3:
            raise ValueError("a third value needs k >= 3")
        # k-RR's ratio at most e^eps0 (exp_lo): a post-processing of k-RR at eps0
        self.p, self.n, self.k, self.grid, self.tail = exp_lo(eps0), int(n), int(k), int(grid), tail
        self.a = 1.0 / (self.p + k - 1.0)
        self.pi_t = (self.p + k - 3.0) * self.a
        self.rho = self.p / (self.p + k - 3.0)
        sd = math.sqrt(self.n * self.pi_t * (1.0 - self.pi_t))
        self.width = max(1, int(sd / 24.0)) if width is None else max(1, int(width))
        self.t_lo, self.w_t, self.rel_t = _pmf(self.n, self.pi_t, tail, 5)   # 4 roundings

    def _value(self, t0: int, shifts: np.ndarray, ee: float):
        p, G, n = self.p, self.grid, self.n
        alpha = (ee - 1.0) * (1.0 - 1.0 / p)
        D = (p - 1.0) * (1.0 + ee)
        m_lo, wm, rm = (_pmf(t0, self.rho, self.tail, 3) if self.rho < 1.0     # 2 roundings
                        else (t0, np.ones(1), 0.0))
        x_lo, wx, rx = _pmf(n - t0, 0.5, self.tail)
        m = np.arange(m_lo, m_lo + wm.size, dtype=np.float64)
        x = np.arange(x_lo, x_lo + wx.size, dtype=np.float64)
        jm = np.floor(G * alpha * m * (1.0 - 1e-13)).astype(np.int64)
        jx = np.floor(G * D * x * (1.0 - 1e-13)).astype(np.int64)
        pm = np.bincount(jm - jm.min(), weights=wm)
        px = np.bincount(jx - jx.min(), weights=wx)
        P = np.convolve(px, pm)
        j_lo = int(jm.min() + jx.min())
        S0 = np.cumsum(P[::-1])[::-1]                  # sum_{j >= t} P_j
        S1 = np.concatenate((np.cumsum(S0[::-1])[::-1][1:], [0.0]))  # sum_{j > t} S0_j
        c = (1.0 - ee) * t0 + (1.0 - ee * p) * (n - t0)
        out = np.empty(shifts.size)
        for s_, sh in enumerate(shifts):
            C = c - sh
            t = int(math.floor(-C * G)) + 1 - j_lo      # first index with C + j / G > 0
            if t >= P.size:
                out[s_] = 0.0
            elif t <= 0:
                # every grid point counts: (C + j_lo / G) may be > 0 with room below; E = C + E[Z]
                out[s_] = max(0.0, (C + j_lo / G) * S0[0] + S1[0] / G + S0[0] * 0.0)
            else:
                out[s_] = max(0.0, (C + (t + j_lo) / G) * S0[t] + S1[t] / G)
        rel = 2.0 * (rm + rx) + _FLOAT_REL_PER_TERM * (4 * P.size + pm.size + px.size + 8)
        return out, rel

    def delta(self, eps: float) -> tuple[float, float, float]:
        ee, p = math.exp(eps), self.p
        d_up = max(p - 1.0, 0.0)                           # one more report off x / x'
        d_dn = max(ee * p - 1.0 - (ee - 1.0) / p, 0.0)     # one less
        total, err = _blocked_sum(self._value, self.t_lo, self.w_t, self.width, d_up, d_dn,
                                  1e-12 * self.n * p * ee, ee, self.rel_t)
        return total / self.n, 0.0, err / self.n + 1e-300


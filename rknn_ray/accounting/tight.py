"""Tight shuffle amplification for the randomizers the project runs: the privacy blanket.

Bound (``get_bound("tight", mechanism=...)``): the hockey-stick divergence of the
*blanket* view of Balle, Bell, Gascon, Nissim (CRYPTO 2019), which Su, Cheng, Wang
(arXiv 2504.07414) show is the optimal decomposition, computed exactly up to a
bucketing that only rounds up.

Why it is sound (any data of the other n-1 users).  Let R_x be the randomizer's law on
input x and gamma w(y) = min_x R_x(y) (gamma = total mass).  Every user's report is,
independently, a draw from w with probability gamma ("blanket") and otherwise from a
residual law of its own input.  Reveal to the adversary which of users 2..n are not
blanket and their reports: the shuffled output is a function of this richer view, so
its divergence bounds the real one (post-processing), for every dataset of the others.
What is left is user 1's report shuffled with the B blanket reports (B ~ Bin(n-1,
gamma), known); the residuals do not depend on user 1.  With L(y) = (R_x(y) - e^eps
R_x'(y)) / w(y) and Bin(n-1, g)(M-1) / M = Bin(n, g)(M) / (n g):

    delta(eps) = E[(sum_{i<=n} V_i)_+] / (n gamma),  V_i iid: 0 w.p. 1 - gamma,
                 L(y) w.p. gamma w(y).

For k-RR (p = e^eps0, a = 1/(p+k-1), w uniform, gamma = k a) L takes gamma times
(p - e^eps) on "y = x" (prob. a), (1 - e^eps p) on "y = x'" (a) and (1 - e^eps) on
the k-2 other values ("r", prob. (k-2) a).  Collision with c = 1 (Bloom length l, the
report is l-RR on H(x) with the hash H public, pairwise independent: P[H(x) = H(x')]
= kappa = 1/l): the same with a = 1/(p+l-1), x/x' mass (1-kappa) a, plus a "c" kind
(H(x) = H(x'), y = H(x); prob. kappa a) of value gamma p (1 - e^eps).  The generic
eps0-LDP worst case is k = 2 (binary RR: the stronger-clone / variation-ratio pair of
Feldman-McMillan-Talwar 2023 and Wang et al. 2024, which holds for every eps0-LDP
randomizer).

The project's ``rr`` (``bitrr``, :mod:`rknn_ray.mechanisms.randomized_response`) with one
hot cell (kr = 1): each of the d bits is flipped w.p. q_s >= 1/(e^{eps0/2} + 1) (rounded
up); the bound is for q, a hair below that (``shuffled_rr.bitrr_flip_probability``: the
sampler's reports are a post-processing of q's), with per-bit ratio b = (1-q)/q ~
e^{eps0/2}.  With R_0 the
law of the flipped all-zero vector, a one-hot input h has R_h(y) = R_0(y) b^{2 y_h - 1}
>= R_0(y) / b for every y and h, so w = R_0 (gamma = 1/b = q/(1-q)) is a common part of
every input's law (the true minimum is larger only on the all-ones report, mass O(q^d):
a smaller common part is still a valid blanket, and the bound needs no d).  Under w,
(y_h, y_h') are i.i.d. Bern(q), and in units of gamma L = p^{y_h} - e^eps p^{y_h'},
p = b^2 ~ e^eps0: "x" = (1, 0) and "x'" = (0, 1), each gamma q (1-q) = q^2 per user;
"r" = (0, 0), gamma (1-q)^2 = q (1-q), value 1 - e^eps; "c" = (1, 1), gamma q^2 =
q^3 / (1-q), value p (1 - e^eps): Collision's four kinds.  For kr > 1 (2kr-bit neighbours)
the kinds form a 2-D lattice (ones of y in H and in H'): not covered, the jobs use the
generic form there.

Computation.  Condition on the counts m_c, m_r of "c" and "r" reports: the rest is
s ~ Bin(n', q) x/x' reports, h | s ~ Bin(s, 1/2) of them x, and E[X_+ | s] is a
Bin(s, 1/2) tail with its first moment (closed form).  Bucketing m_r (and m_c) and
using each bucket's *lowest* count is an upper bound because E[X_+ | m_c, m_r] is
non-increasing in both: one more "r" report replaces a draw V' of the other kinds,
whose mean is >= the constant gamma (1 - e^eps) = E[V], by that constant, and a
constant below a variable's mean is below it in increasing-convex order, so
E[(Y + const)_+] <= E[(Y + V')_+]; likewise for "c" (its value is below E[V]).
Windows leave out <= 1e-20 of each binomial; the left-out mass times the largest
conditional value (p) is added, with the fast binomials' error bounds
(:mod:`rknn_ray.accounting.binom_fast`) and float slack, on the safe side.

Lower bounds (the gap is measured, not assumed): for k-RR the larger of the exact
pair "others all hold x'" (:mod:`rknn_ray.accounting.shuffled_rr`) and the others all
on a third value: the counts of x and x' (= the blanket view without the blanket
size: a post-processing of that dataset's real output), and where n ~ 1e3-1e4 the
whole histogram exactly (:class:`~rknn_ray.accounting.shuffled_rr.KRRThirdValueDelta`:
the counts of the third value and of the rest estimate the blanket size, which is
what the pair misses where the blanket holds a few dozen reports).  Collision: the
largest of the exact "others hold v'" pair and, with the others all on a third value
v'', the counts of the reports that single out v or v' by their hashes (also counting,
or not, those that match v'' too:
:func:`~rknn_ray.accounting.shuffled_rr.collision_third_value_pairs`), and where the
grid is small (n ~ 1e3, l <= 8) those four counts together
(:class:`~rknn_ray.accounting.shuffled_rr.CollisionThirdValueDelta`: all the view
says about v vs v' but the reports that fit both or neither).  What stays open there
is the upper side: a third value's report lands on v's hash with prob. 1/l, and the
blanket treats those reports as if the adversary could tell them apart.  Generic: the
largest of binary RR and the k-RR pairs (every k-RR is eps0-LDP).  Per-bit RR:
the largest of the exact pair "others all hot on h'" and, with the others hot on a third
cell h'', the counts of the reports showing (1, 0) vs (0, 1) on (h, h'), with bit h'' = 0
or whatever it is (:func:`~rknn_ray.accounting.shuffled_rr.bitrr_pairs`); binary RR's pair
is not one of this randomizer's, so it is left out.  Up to n = 2e6 the third-cell data set's
exact divergence of the whole output raises it (:mod:`rknn_ray.accounting.exact_lower`: the
n-fold sum of one report's loss term, by exact lattice sums, certified from below); so it
does for Collision's third-value data set (every hash-match pattern of each report: each
report carries its own hash) and, where the whole-histogram sum above is too slow, k-RR's.

``dominating_pair(eps0, n)``: the same bucketed pair as explicit distributions, see
:meth:`TightBound.dominating_pair`.
"""
from __future__ import annotations

import math

import numpy as np

from rknn_ray.accounting.binom_fast import (EXACT_RTOL_PER_M, binom_logpmf, half_pmf_path,
                                            half_sf_exact, half_sf_path, pmf_rtol)
from rknn_ray.accounting.bounds import (AmplificationBound, RRLowerBound, _check, _pair_delta)
from rknn_ray.accounting.exact_lower import (THIRD_CELL_MAX_N, BitRRThirdCellDelta,
                                             CollisionThirdValueExactDelta,
                                             KRRThirdValueExactDelta, third_cell_grid)
from rknn_ray.accounting.hockey import FLOAT_SLACK_PER_TERM, _window, eps_for_delta
from rknn_ray.accounting.shuffled_rr import (CollisionThirdValueDelta, KRRThirdValueDelta,
                                             ShuffledRRPairDelta,
                                             bitrr_flip_probability, bitrr_pairs,
                                             collision_pair, collision_third_value_pairs,
                                             exp_lo, krr_pair)
from rknn_ray.errors import ConfigError

TAIL = 1e-20          # binomial mass left out of each window (added back, times p)
# bucket width: one bucket may shift X by at most this fraction of X's sd
BUCKET_SHIFT = 1e-2
MAX_BUCKETS = 256     # per dimension, within 3 sigma of the mean
STOP = 1e-5          # stop summing buckets once the rest is bounded by this share
VECTOR_MAX = 400_000  # c buckets x s window evaluated at once (exact tails)
SKIP = 1e-30         # per-s Hoeffding bound below which a term is bounded, not summed
TABLE_MAX = 4_000_000   # cells of the Bin(m, 1/2) pmf / tail band table (small n)
FOUR_COUNT_TERMS = 6_000_000  # grid of Collision's four-count lower bound (~1 s per eps)
THREE_COUNT_TERMS = 300_000   # cells of k-RR's whole-histogram third-value bound (~0.1 s per eps)
# dominating_pair's buckets per count: the most of these whose pair has at most
# PAIR_ATOM_BUDGET atoms (about a second to build and turn into a PLD), else the last
PAIR_BUCKETS = (256, 128, 64, 32, 16, 8)
PAIR_ATOM_BUDGET = 1_500_000
BUCKETS_HELD = 8192   # BlanketDelta._buckets' process-wide cache (a few KiB each)
_BUCKETS: dict = {}


class BlanketDelta:
    """delta(eps) = E[(sum V_i)_+] / (n gamma) of the blanket view, (estimate, up, down).

    ``pi_x``: prob. of "y = x" (and of "y = x'") per user; ``pi_r``, ``pi_c``: of the
    "r" and "c" kinds (values (1 - e^eps), p (1 - e^eps) in units of gamma).
    ``method``: "fast" (Loader pmfs, recurrence tails, adaptive buckets), "exact"
    (scipy's binomials, one bucket per count: the slow reference path).
    """

    def __init__(self, p: float, n: int, pi_x: float, pi_r: float = 0.0, pi_c: float = 0.0,
                 method: str = "fast", tail: float = TAIL):
        if method not in ("fast", "exact"):
            raise ValueError(f"method must be 'fast' or 'exact', got {method!r}")
        if not (p > 1.0 and pi_x > 0 and pi_r >= 0 and pi_c >= 0 and 2 * pi_x + pi_r + pi_c <= 1 + 1e-12):
            raise ValueError("need p > 1 and kind probabilities summing to <= 1")
        self.p, self.n, self.method, self.tail = p, int(n), method, tail
        self.pi_x, self.pi_r, self.pi_c = pi_x, pi_r, pi_c

    # ---------------------------------------------------------------- pieces
    def _pmf(self, k, n, q):
        if self.method == "exact":
            from scipy import stats  # defers scipy: the slow exactness path only
            return stats.binom.pmf(k, n, q)
        return np.exp(binom_logpmf(k, n, q))

    def _buckets(self, n: int, q: float, width: int):
        """(lowest count per bucket, bucket prob. upper bound, left-out mass below).

        Shared by every instance in the process (read-only arrays): a pure function of
        (n, q, width, tail, method), and a calibration's instances at other eps0 ask for
        the same ones (Collision's and k-RR's c | T law does not depend on eps0)."""
        key = (n, q, int(width), self.tail, self.method)
        hit = _BUCKETS.get(key)
        if hit is None:
            if len(_BUCKETS) >= BUCKETS_HELD:
                _BUCKETS.clear()
            hit = self._buckets_uncached(n, q, width)
            hit[0].setflags(write=False)
            hit[1].setflags(write=False)
            _BUCKETS[key] = hit
        return hit

    def _buckets_uncached(self, n: int, q: float, width: int):
        if q <= 0.0 or n == 0:
            return np.zeros(1, dtype=np.int64), np.ones(1), 0.0
        lo, hi, _ = _window(n, q, self.tail, exact_out=False)
        below = 0.5 * self.tail if lo > 0 else 0.0
        m = np.arange(lo, hi + 1, dtype=np.int64)
        w = self._pmf(m, n, q)
        rel = 0.0 if self.method == "exact" else pmf_rtol(max(abs(lo - n * q), abs(hi - n * q)) + 1)
        sig = math.sqrt(n * q * (1.0 - q))
        starts = (np.arange(m.size) if self.method == "exact" else
                  _bucket_starts(m.size, n * q - lo, sig, max(int(width), int(12.0 * sig / MAX_BUCKETS))))
        probs = np.add.reduceat(w, starts) * (1.0 + rel) + FLOAT_SLACK_PER_TERM * m.size
        probs[-1] += 0.5 * self.tail if hi < n else 0.0     # the last bucket runs to n
        return m[starts], probs, below

    def _sd(self, ee: float) -> float:
        """sd of sum V_i / gamma (sizes the buckets)."""
        p, n = self.p, self.n
        vals = ((p - ee, self.pi_x), (1 - ee * p, self.pi_x), (1 - ee, self.pi_r),
                (p * (1 - ee), self.pi_c))
        m1 = sum(v * q for v, q in vals)
        m2 = sum(v * v * q for v, q in vals)
        return math.sqrt(max(n * (m2 - m1 * m1), 1e-300))

    def _s_window(self, n2: int):
        """(s, Bin(n2, q) pmf over s's window, q, left-out mass): x/x' reports among n2."""
        cache = self.__dict__.setdefault("_s_cache", {})
        if n2 not in cache:
            rest = 1.0 - self.pi_r - self.pi_c
            q = min(1.0, 2.0 * self.pi_x / rest) if rest > 0 else 1.0
            lo, hi, _ = _window(n2, q, self.tail, exact_out=False) if q < 1.0 else (n2, n2, 0.0)
            out = 0.5 * self.tail * ((lo > 0) + (hi < n2)) if q < 1.0 else 0.0
            s = np.arange(max(lo, 1), hi + 1, dtype=np.int64)
            w = self._pmf(s, n2, q) if q < 1.0 else np.ones(s.size)
            w_rel = 0.0 if (self.method == "exact" or q >= 1.0) else \
                pmf_rtol(max(abs(lo - n2 * q), abs(hi - n2 * q)) + 1)
            if len(cache) > 4096:
                cache.clear()
            cache[n2] = (s, w, w_rel, out)
        return cache[n2]

    def _inner_many(self, n2: int, Cs: np.ndarray, ee: float):
        """:meth:`_inner` for many fixed parts at once (short s windows: exact tails)."""
        fast = self._inner_many_live(n2, Cs, ee)
        return fast if fast is not None else self._inner_many_masked(n2, Cs, ee)

    def _inner_many_live(self, n2: int, Cs: np.ndarray, ee: float):
        """:meth:`_inner_many` where every cell is live and the tail table covers the rows
        (every n ~ 1e3-1e4 cell): the masked path's values, bit for bit, with half its
        array passes (row parts cached per n2, the liveness test on the one row with the
        largest thresholds: h0 is non-increasing in the fixed part), else None."""
        p = self.p
        cxp, D = 1.0 - ee * p, (p - 1.0) * (1.0 + ee)
        s, w, w_rel, out = self._s_window(n2)
        if Cs.size == 0 or s.size == 0:
            return None
        rows = self._live_rows(n2)
        if rows is None:
            return None
        sf_, s_hi, off, base, W2, band, rel = rows
        Cp = Cs[:, None] + cxp * sf_
        # h0 = clip(floor(-Cp / D) + 1, 0, s + 1), in floats (exact: small integers)
        f = np.floor(Cp / -D)
        f += 1.0
        np.maximum(f, 0.0, out=f)
        np.minimum(f, s_hi, out=f)
        top = int(np.argmin(Cs))
        z = np.maximum(f[top] - sf_[0] / 2.0, 0.0)
        if not (D * sf_[0] * np.exp(-2.0 * z * z / sf_[0]) > SKIP).all():
            return None
        f -= off                                   # t - (m // 2 - W), t = h0 - 1
        np.maximum(f, 0.0, out=f)
        np.minimum(f, W2, out=f)
        f += base
        idx = f.astype(np.intp)
        tab = self.__dict__["_half_tab"]
        sf, pmf = tab[3].ravel().take(idx), tab[2].ravel().take(idx)
        K = Cp + D * sf_ / 2.0
        A = K * sf
        hC = Cp / 2.0
        hp = hC * pmf                              # -B
        v = A - hp
        np.maximum(v, 0.0, out=v)
        v *= w
        est = v.sum(axis=1)
        absA = np.abs(A)
        np.abs(hp, out=hp)
        hp += absA
        hp *= w
        mag = hp.sum(axis=1)
        absA *= w
        err = (2.0 * (w_rel + rel) * mag + rel * absA.sum(axis=1)
               + p * n2 * out + 0.0 + FLOAT_SLACK_PER_TERM * (8 * s.size + 16) * np.maximum(1.0, mag))
        np.abs(K, out=K)
        np.abs(hC, out=hC)
        K += hC
        K *= w
        err = err + band * K.sum(axis=1)
        return est, err, mag

    def _live_rows(self, n2: int):
        """Row parts of :meth:`_inner_many_live` for n2's s window (None: no table)."""
        cache = self.__dict__.setdefault("_live_rows_cache", {})
        if n2 not in cache:
            s = self._s_window(n2)[0]
            m_lo, m_hi = int(s[0]) - 1, int(s[-1]) - 1
            tab = self._half_table(m_lo, m_hi)
            if tab is None or not tab[5]:
                cache[n2] = None
            else:
                lo, W, _, _, rel, band = tab
                m = (s - 1).astype(np.int64)
                cache[n2] = (s.astype(float)[None, :], (s + 1).astype(float)[None, :],
                             (m // 2 - W + 1).astype(float)[None, :],
                             ((m - lo) * (2 * W + 1)).astype(float)[None, :], float(2 * W),
                             band, rel)
            if len(cache) > 4096:
                cache.clear()
        return cache[n2]

    def _inner_many_masked(self, n2: int, Cs: np.ndarray, ee: float):
        """:meth:`_inner_many`'s general path (some cells bounded, not summed; or no table)."""
        p = self.p
        cxp, D = 1.0 - ee * p, (p - 1.0) * (1.0 + ee)
        s, w, w_rel, out = self._s_window(n2)
        sf_ = s.astype(float)[None, :]
        Cp = Cs[:, None] + cxp * sf_
        # np.minimum(np.maximum(.)) is np.clip's result without its per-call dispatch
        h0 = np.minimum(np.maximum(np.floor(-Cp / D).astype(np.int64) + 1, 0), s[None, :] + 1)
        z = np.maximum(h0 - sf_ / 2.0, 0.0)
        bound = D * sf_ * np.exp(-2.0 * z * z / sf_)
        live = bound > SKIP
        if live.all():
            # the common case (every n ~ 1e3-1e4 cell is live): the same values as the
            # masked path below, without its boolean gathers and scatters
            skipped = 0.0
            m, t = s[None, :] - 1, h0 - 1          # m: one row, broadcast against t
            m_lo, m_hi = int(s[0]) - 1, int(s[-1]) - 1
        else:
            skipped = np.sum(np.where(live, 0.0, bound), axis=1)
            m = np.broadcast_to(s[None, :] - 1, Cp.shape)[live]
            t = (h0 - 1)[live]
            m_lo, m_hi = (int(m.min()), int(m.max())) if m.size else (0, 0)
        tab = self._half_table(m_lo, m_hi) if m.size else None
        band = 0.0
        if tab is not None:
            lo, W, P, S, rel, band = tab
            # one flat take per table (S and P are C-contiguous, rows of 2 W + 1)
            idx = (m - lo) * (2 * W + 1) + np.clip(t - (m // 2 - W), 0, 2 * W)
            sf_v, pmf_v = S.ravel().take(idx), P.ravel().take(idx)
            pmf_rel = sf_rel = rel
        else:
            m = np.broadcast_to(m, t.shape)
            sf_v = half_sf_exact(m, t)
            pmf_v = np.exp(binom_logpmf(t, m, 0.5)) if m.size else np.zeros(0)
            pmf_rel = pmf_rtol(float(np.abs(t - m / 2.0).max(initial=0.0)) + 1)
            sf_rel = EXACT_RTOL_PER_M * float(max(1, s.max()))
        if live.all():
            sf, pmf = sf_v, pmf_v
        else:
            sf = np.zeros(Cp.shape)
            pmf = np.zeros(Cp.shape)
            sf[live], pmf[live] = sf_v, pmf_v
        K = Cp + D * sf_ / 2.0
        A = K * sf
        B = -(Cp / 2.0) * pmf
        est = np.sum(w * np.maximum(A + B, 0.0), axis=1)
        mag = np.sum(w * (np.abs(A) + np.abs(B)), axis=1)
        err = (2.0 * (w_rel + pmf_rel) * mag + sf_rel * np.sum(w * np.abs(A), axis=1)
               + p * n2 * out + skipped + FLOAT_SLACK_PER_TERM * (8 * s.size + 16) * np.maximum(1.0, mag))
        if band:
            err = err + band * np.sum(w * (np.abs(K) + np.abs(Cp) / 2.0), axis=1)
        return est, err, mag

    def _half_table(self, m_lo: int, m_hi: int):
        """(m_lo', W, pmf, sf, rel, band): Bin(m, 1/2) pmf and tails P[>= t] for rows
        m = m_lo'.., columns t = m // 2 - W .. m // 2 + W (a lookup clips t to them), or
        None past TABLE_MAX cells.  Built once per instance for every row the sums can
        reach: the small-n sums look tails up here instead of one incomplete beta per cell
        and eps.  rel bounds both tables' relative error (the pmfs', and summing <= 2W + 1
        positive terms); band the absolute error of a clipped or in-band value (each side
        beyond the band holds <= exp(-2 (W - 1)^2 / m) <= 1e-25 by Hoeffding)."""
        tab = self.__dict__.get("_half_tab")
        if tab is not None:
            ok = tab[2] is not None and tab[0] <= m_lo and m_hi <= tab[0] + tab[2].shape[0] - 1
            return tab if ok else None
        # every row any count can reach: s over the windows of n - T, T over Bin(n, pneg)'s
        pneg = self.pi_r + self.pi_c
        t_lo, t_hi = (0, 0) if pneg <= 0 else _window(self.n, pneg, self.tail, exact_out=False)[:2]
        m_lo = min(m_lo, max(int(self._s_window(self.n - t_hi)[0][:1].min(initial=1)) - 1, 0))
        m_hi = max(m_hi, int(self._s_window(self.n - t_lo)[0][-1:].max(initial=1)) - 1)
        W = int(math.ceil(math.sqrt(28.8 * max(m_hi, 1)))) + 2
        if (m_hi - m_lo + 1) * (2 * W + 1) > TABLE_MAX:
            self.__dict__["_half_tab"] = (0, 0, None, None, 0.0, 0.0)
            return None
        rows = np.arange(m_lo, m_hi + 1, dtype=np.int64)[:, None]
        cols = rows // 2 - W + np.arange(0, 2 * W + 1, dtype=np.int64)[None, :]
        inside = (cols >= 0) & (cols <= rows)
        P = np.where(inside, np.exp(binom_logpmf(np.clip(cols, 0, rows), rows, 0.5)), 0.0)
        S = np.ascontiguousarray(np.cumsum(P[:, ::-1], axis=1)[:, ::-1])   # flat takes
        rel = pmf_rtol(W + 1) + 2.3e-16 * (2 * W + 3)
        tab = (m_lo, W, P, S, rel, 2e-25)
        self.__dict__["_half_tab"] = tab
        return tab

    def _inner(self, n2: int, C: float, ee: float):
        """(E[(X/gamma)_+ | counts], its absolute error, its magnitude): n2 reports left
        for the x / x' kinds, C the fixed part (the "r" and "c" reports' values)."""
        p = self.p
        if n2 <= 0:
            return max(C, 0.0), 0.0, abs(C)
        cxp, D = 1.0 - ee * p, (p - 1.0) * (1.0 + ee)
        s, w, w_rel, out = self._s_window(n2)
        sf_ = s.astype(float)
        Cp = C + cxp * sf_
        h0 = np.clip(np.floor(-Cp / D).astype(np.int64) + 1, 0, s + 1)
        skipped = 0.0
        if self.method == "fast":
            # Hoeffding: E[(Cp + D h)_+] <= D s P[h >= h0] <= D s exp(-2 (h0 - s/2)^2 / s);
            # s where that is <= SKIP are bounded, not summed (the live ones are an
            # interval: h0 - s/2 grows linearly in s); their bounds go to the error
            z = np.maximum(h0 - sf_ / 2.0, 0.0)
            bound = D * sf_ * np.exp(-2.0 * z * z / sf_)
            live = np.nonzero(bound > SKIP)[0]
            if live.size == 0:
                return 0.0, float(np.sum(bound)) + p * n2 * out, 0.0
            i0, i1 = int(live[0]), int(live[-1]) + 1
            skipped = float(np.sum(bound[:i0]) + np.sum(bound[i1:]))
            s, sf_, Cp, h0, w = s[i0:i1], sf_[i0:i1], Cp[i0:i1], h0[i0:i1], w[i0:i1]
        # E[(Cp + D h)_+], h ~ Bin(s, 1/2), h >= h0:
        #   (Cp + D s/2) P[Bin(s-1) >= h0-1] - (Cp/2) P[Bin(s-1) = h0-1]
        m, t = s - 1, h0 - 1
        if self.method == "exact":
            from scipy import stats  # defers scipy: the slow exactness path only
            sf = half_sf_exact(m, t)
            pmf = stats.binom.pmf(t, m, 0.5)
            sf_err, pmf_rel = EXACT_RTOL_PER_M * float(max(1, m.max())), 0.0
            sf_abs = sf_err * sf
        else:
            pmf, pmf_rel = half_pmf_path(m, t)
            sf, e1 = half_sf_path(m, t)
            sf_abs = e1
        A = (Cp + D * sf_ / 2.0) * sf
        B = -(Cp / 2.0) * pmf
        val = np.maximum(A + B, 0.0)
        est = float(np.sum(w * val))
        mag = float(np.sum(w * (np.abs(A) + np.abs(B))))
        sf_abs = np.broadcast_to(np.asarray(sf_abs, dtype=float), s.shape)
        err = (2.0 * (w_rel + pmf_rel) * mag
               + float(np.sum(w * np.abs(Cp + D * sf_ / 2.0) * sf_abs))
               + p * n2 * out + skipped + FLOAT_SLACK_PER_TERM * (8 * s.size + 16) * max(1.0, mag))
        return est, err, mag

    # ---------------------------------------------------------------- delta
    def delta(self, eps: float) -> tuple[float, float, float]:
        """Sum over buckets of T = m_r + m_c (and of m_c given T) at their lowest counts.

        E[X_+ | T, m_c] is non-increasing in T (an "r" report for one of another kind)
        and in m_c (a "c" report for an "r" one: a smaller value); m_c | T ~ Bin(T, .)
        grows stochastically with T, so a T bucket may use its lowest T throughout.
        Both orders let the sum stop once the rest is bounded by the current term.
        """
        p, n = self.p, self.n
        ee = math.exp(eps)
        if self.method == "exact":
            wT = wc = 1
        else:
            # one bucket shifts X by <= BUCKET_SHIFT of its sd, and by <= 5% of an x step
            # times sqrt(E #x) (where x reports are few, X is far from Gaussian)
            sd = self._sd(ee)
            scale = min(BUCKET_SHIFT * sd,
                        0.05 * max(p - ee, 0.0) * math.sqrt(max(1.0, n * self.pi_x)))
            wT = _pow2(scale / max(ee - 1.0, 1e-300))
            wc = _pow2(scale / max((p - 1.0) * (ee - 1.0), 1e-300))
        pneg = self.pi_r + self.pi_c
        tc = self.pi_c / pneg if pneg > 0 else 0.0
        total, err, mag = 0.0, 0.0, 0.0
        Ts, Tp, Tbelow = self._buckets(n, pneg, wT)
        Tp_rest = np.cumsum(Tp[::-1])[::-1]
        err += Tbelow * p * n
        for i, (T, PT) in enumerate(zip(Ts.tolist(), Tp.tolist())):
            cs, cp, cbelow = self._buckets(T, tc, wc)
            g_est, g_err, g_mag = 0.0, cbelow * p * n, 0.0
            if self.method == "fast" and cs.size > 1 and n - T > 0 and \
                    self._s_window(n - T)[0].size * cs.size <= VECTOR_MAX:
                e, er, mg = self._inner_many(n - T, (1.0 - ee) * (T + (p - 1.0) * cs), ee)
                g_est, g_err, g_mag = float(cp @ e), g_err + float(cp @ er), float(cp @ mg)
                cs = cs[:0]
            cp_rest = np.cumsum(cp[::-1])[::-1] if cs.size else cp   # (the loop's only)
            for j, (mc, Pc) in enumerate(zip(cs.tolist(), cp.tolist())):
                e, er, mg = self._inner(n - T, (1.0 - ee) * (T + (p - 1.0) * mc), ee)
                if self.method == "fast" and j and (e + er) * cp_rest[j] <= STOP * (g_est + g_err):
                    g_err += float(cp_rest[j]) * (e + er)
                    break
                g_est += Pc * e
                g_err += Pc * er
                g_mag += Pc * mg
            if self.method == "fast" and i and (g_est + g_err) * Tp_rest[i] <= STOP * (total + err):
                err += float(Tp_rest[i]) * (g_est + g_err)
                break
            total += PT * g_est
            err += PT * g_err
            mag += PT * g_mag
        est = total / n
        up = err / n + FLOAT_SLACK_PER_TERM * 16
        return est, up, up

    def _span(self, n: int, q: float) -> int:
        if q <= 0.0 or n == 0:
            return 1
        lo, hi, _ = _window(n, q, self.tail, exact_out=False)
        return hi - lo + 1


def _pair_atoms(bd: BlanketDelta, n: int, px: float, pr: float, pc: float, wr: int, wc: int,
                max_buckets: int, tail: float) -> int:
    """About how many atoms :meth:`TightBound.dominating_pair` builds with ``max_buckets``
    (the cells of its buckets times each cell's s window times the h window of its
    largest s: an over-estimate).  Only sizes the buckets; soundness does not depend on it."""
    atoms = 0
    rest = 1.0 - pr - pc
    q = min(1.0, 2.0 * px / rest) if rest > 0 else 1.0
    qr = pr / (1.0 - pc) if pc < 1 else 0.0
    for mc, _ in _norm_buckets(bd, n, pc, max(wc, -(-bd._span(n, pc) // max_buckets))):
        if mc is None:
            continue
        for mr, _ in _norm_buckets(bd, n - mc, qr,
                                   max(wr, -(-bd._span(n - mc, qr) // max_buckets))):
            if mr is None:
                continue
            n2 = n - mc - mr
            if q < 1.0:
                lo, hi, _ = _window(n2, q, tail, exact_out=False)
            else:
                lo = hi = n2
            hlo, hhi, _ = _window(max(hi, 1), 0.5, tail, exact_out=False)
            atoms += (hi - lo + 1) * (max(hhi, hi - hlo) - min(hlo, hi - hhi) + 1)
            if atoms > 4 * PAIR_ATOM_BUDGET:
                return atoms
    return atoms


def _bucket_starts(size: int, center: float, sigma: float, width: int) -> np.ndarray:
    """Bucket start indices over a window of ``size`` counts: ``width`` apart up to 3
    sigma above the mean (index ``center``), doubling beyond (little mass there, and a
    bucket's value is that of its lowest count, which is larger further down only)."""
    width = int(min(max(1, width), size))
    c_hi = int(min(size, max(1, math.ceil(center + 3.0 * sigma) + 1)))
    starts = list(range(0, c_hi, width))
    pos, step = starts[-1] + width, width
    while pos < size:
        starts.append(pos)
        step *= 2
        pos += step
    return np.array(starts, dtype=np.int64)


def _pow2(x: float) -> int:
    """The largest power of two <= x (>= 1, capped): bucket widths repeat across eps."""
    return 1 << int(max(0.0, min(math.log2(max(x, 1.0)), 50.0)))


def _norm_buckets(bd: BlanketDelta, n: int, q: float, width: int):
    """[(lowest count, prob.)] summing to 1: (None, mass) holds what lies below the
    window (and pmf rounding), the last bucket runs to n."""
    if q <= 0.0 or n == 0:
        return [(0, 1.0)]
    lo, hi, _ = _window(n, q, bd.tail, exact_out=False)
    m = np.arange(lo, hi + 1, dtype=np.int64)
    w = np.exp(binom_logpmf(m, n, q))
    rel = pmf_rtol(max(abs(lo - n * q), abs(hi - n * q)) + 1)
    sig = math.sqrt(n * q * (1.0 - q))
    starts = _bucket_starts(m.size, n * q - lo, sig, int(width))
    probs = np.add.reduceat(w, starts) * (1.0 + rel)
    below = 0.5 * bd.tail if lo > 0 else 0.0
    out = [(None, below)] if below > 0 else []
    out += [(int(a), float(b)) for a, b in zip(m[starts][:-1], probs[:-1])]
    out.append((int(m[starts][-1]), max(0.0, 1.0 - below - float(np.sum(probs[:-1])))))
    return out


def solve_upper(pd, delta: float, eps_hi: float, guess: float, rtol: float = 1e-6) -> float:
    """Smallest eps (to rtol, rounded up) with est + err <= delta: a certified upper bound.

    delta(eps) falls roughly exponentially, so the root is bracketed by doubling /
    halving from ``guess`` and found by Brent's method on log(delta) (a few
    evaluations, none at the flat, expensive large-eps end); the answer is re-checked.
    """
    from scipy import optimize  # defers scipy: the root search only

    def g(e: float) -> float:
        est, up, _ = pd.delta(e)
        return math.log(max(est + up, 1e-300)) - math.log(delta)

    memo = {}
    g_raw = g

    def g(e: float) -> float:            # noqa: F811 -- memoised; delta(eps0) = 0 exactly
        if e >= eps_hi:                    # (the shuffled eps0-LDP output is eps0-DP)
            return -math.inf
        if e not in memo:
            memo[e] = g_raw(e)
        return memo[e]

    e = min(max(guess, 1e-12), eps_hi * 0.999)
    ge = g(e)
    if ge > 0:
        lo = e
        hi = min(eps_hi, 2 * e)
        while g(hi) > 0:
            lo, hi = hi, min(eps_hi, 2 * hi)
        if hi >= eps_hi:
            g_hi = lambda x: -1e300 if x >= eps_hi else g(x)  # noqa: E731
            root = optimize.brentq(lambda x: max(g_hi(x), -700.0), lo, hi, xtol=1e-14,
                                   rtol=rtol * 1e-2)
            e = min(eps_hi, root * (1 + rtol))
            while g(e) > 0 and e < eps_hi:
                e = min(eps_hi, e * (1 + 4 * rtol))
            return e
    else:
        hi, lo = e, e / 2
        while g(lo) <= 0:
            if lo < 1e-12:
                return lo
            hi, lo = lo, lo / 2
    root = optimize.brentq(g, lo, hi, xtol=1e-14, rtol=rtol * 1e-2)
    step = max(1e-13, rtol * root)
    e = min(eps_hi, root + step)
    while g(e) > 0 and e < eps_hi:
        step *= 4
        e = min(eps_hi, root + step)
    return e


def _lower_with(pd, delta: float, eps_hi: float, best: float) -> float:
    """max(best, pd's certified lower eps): one evaluation where pd cannot beat ``best``
    (est - err_down <= delta at ``best``: its crossing is below), else the full search.
    At n = 1e9 one count pair costs ~30 evaluations of ~0.3 s (its incomplete betas)."""
    if best > 0.0:
        est, _, down = pd.delta(best)
        if not est - down > delta:
            return best
    return max(best, eps_for_delta(pd, delta, eps_hi, upper=False))


def _cheap_first(pairs: list) -> list:
    """The count pairs with fast binomials (PairDelta) before the exact-histogram pairs
    (ShuffledRRPairDelta: an incomplete beta per cell), so that a dominated expensive pair
    costs one evaluation in :func:`_lower_with`."""
    return sorted(pairs, key=lambda pd: isinstance(pd, ShuffledRRPairDelta))


def _raise_lower(pd, delta: float, start: float, eps_hi: float, rtol: float = 2e-4,
                 max_evals: int = 8) -> float:
    """The largest eps >= ``start`` found with est - err_down > delta (a certified lower
    bound), ``start`` if none: every answer is an evaluated point.  From ``start`` (an eps a
    cheaper pair certified) and 2% above it, secant steps on log(est - err_down) (nearly
    linear in eps over a few percent), aimed a hair below the predicted crossing and kept
    inside the bracket, until the bracket is ``rtol`` wide or ``max_evals`` evaluations
    (the exact sums cost ~0.3 s each at n = 1e6: 4-5 evaluations instead of 2% steps and
    five bisections)."""
    def h(e: float) -> float:
        est, _, down = pd.delta(e)
        v = est - down
        return math.log(v) - math.log(delta) if v > 0.0 else -math.inf

    lo = start
    if lo <= 0.0:
        return start
    h_lo = h(lo)
    if not h_lo > 0.0:
        return start
    hi, h_hi = None, None
    prev = (lo, h_lo)
    e = min(eps_hi, lo * 1.02)
    for _ in range(max_evals - 1):
        if e <= lo or (hi is not None and e >= hi):
            break
        he = h(e)
        if he > 0.0:
            prev, lo, h_lo = (lo, h_lo), e, he
        else:
            hi, h_hi = e, he
        if hi is not None and hi - lo <= rtol * lo:
            break
        if hi is None:
            # both points above delta: extrapolate the secant through the last two
            (e0, h0), (e1, h1) = prev, (lo, h_lo)
            slope = (h1 - h0) / (e1 - e0) if e1 != e0 else 0.0
            guess = e1 - h1 / slope if slope < 0.0 else e1 * 1.02
            e = min(eps_hi, max(min(guess * (1.0 + rtol / 4), e1 * 1.10), e1 * (1.0 + rtol)))
        else:
            if math.isfinite(h_hi):
                guess = lo - h_lo * (hi - lo) / (h_hi - h_lo)
                # aim just below the crossing (an evaluated point above delta is the answer),
                # inside the bracket's middle 90%
                guess *= 1.0 - rtol / 4
            else:
                guess = 0.5 * (lo + hi)
            e = min(max(guess, lo + 0.05 * (hi - lo)), hi - 0.05 * (hi - lo))
    return lo


# ---------------------------------------------------------------- mechanisms

def blanket_params(mechanism: str, eps0: float, k: int | None = None, l: int | None = None,
                   kr: int | None = None):
    """(p, pi_x, pi_r, pi_c) of the blanket view of ``mechanism`` at eps0."""
    if mechanism == "bitrr":
        # per-bit RR, kr = 1, at a q at most the sampler's (shuffled_rr.bitrr_flip_probability):
        # per-bit ratio b = (1-q)/q, p = b^2, blanket w = R_0 / b (gamma = q/(1-q)): module doc
        if kr not in (None, 1):
            raise ValueError(f"the per-bit RR blanket covers kr = 1, got kr={kr}")
        q = bitrr_flip_probability(eps0, 1)
        b = (1.0 - q) / q
        return b * b, q * q, q * (1.0 - q), q ** 3 / (1.0 - q)
    p = math.exp(eps0)
    if mechanism == "generic":
        return p, 1.0 / (p + 1.0), 0.0, 0.0
    if mechanism == "krr":
        a = 1.0 / (p + k - 1.0)
        return p, a, (k - 2) * a, 0.0
    a = 1.0 / (p + l - 1.0)
    kappa = 1.0 / l
    pi_x, pi_c = (1.0 - kappa) * a, kappa * a
    return p, pi_x, max(0.0, l * a - 2.0 * pi_x - pi_c), pi_c


class TightBound(AmplificationBound):
    """Blanket-divergence upper bound for k-RR, Collision (c = 1), the project's per-bit RR
    (kr = 1) or generic eps0-LDP."""
    kind = "upper"

    def __init__(self, mechanism: str = "generic", k: int | None = None, l: int | None = None,
                 c: int | None = None, method: str = "fast", kr: int | None = None,
                 d: int | None = None):
        if mechanism not in ("generic", "krr", "collision", "bitrr"):
            raise ConfigError("mechanism", f"unknown mechanism {mechanism!r}",
                              "use 'generic', 'krr' (k=...), 'collision' (l=..., c=1) or "
                              "'bitrr' (kr=1, d=...)")
        if mechanism == "bitrr":
            if d is None or int(d) != d or d < 2:
                raise ConfigError("d", f"per-bit RR needs an integer report length d >= 2, "
                                  f"got {d!r}", "pass d=<s * |Y|>")
            if kr != 1:
                raise ConfigError("kr", f"the tight per-bit RR form covers kr = 1 (one hot cell), "
                                  f"got kr={kr!r}", "use the generic form (mechanism='generic')")
        if mechanism == "krr" and (k is None or int(k) != k or k < 2):
            raise ConfigError("k", f"k-RR needs an integer k >= 2, got {k!r}",
                              "pass k=<number of options>")
        if mechanism == "collision":
            if l is None or int(l) != l or l < 2:
                raise ConfigError("l", f"Collision needs an integer Bloom length l >= 2, got {l!r}",
                                  "pass l=<Bloom filter length>")
            if c not in (None, 1):
                raise ConfigError("c", f"the tight bound covers Collision with c = 1, got c={c}",
                                  "use c=1 or the 'variation_ratio' bound")
        self.mechanism, self.k, self.l, self.method = mechanism, k, l, method
        self.kr, self.d = (int(kr), int(d)) if mechanism == "bitrr" else (None, None)
        self.name = "tight" if mechanism == "generic" else f"tight_{mechanism}"
        self.citation = ("privacy-blanket divergence (Balle et al. 2019; optimal decomposition: "
                         "Su, Cheng, Wang, arXiv 2504.07414), computed exactly with upward "
                         "bucketing: rknn_ray.accounting.tight")

    def pair_delta(self, eps0: float, n: int) -> BlanketDelta:
        p, px, pr, pc = blanket_params(self.mechanism, eps0, self.k, self.l, self.kr)
        return BlanketDelta(p, n, px, pr, pc, method=self.method)

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        _check(eps0, n, delta)
        p = math.exp(eps0)
        guess = min(eps0, 2.0 * (p - 1.0) / math.sqrt(p + 1.0) * math.sqrt(math.log(1.0 / delta) / n))
        return solve_upper(self.pair_delta(eps0, n), delta, eps0, guess)

    def lower(self, eps0: float, n: int, delta: float) -> float:
        """A certified lower bound for the same randomizer (see the module doc)."""
        _check(eps0, n, delta)
        if self.mechanism == "bitrr":
            best = 0.0
            for pd in _cheap_first(bitrr_pairs(eps0, n, self.d)):
                best = _lower_with(pd, delta, eps0, best)
            if self.d >= 3 and 2 <= n <= THIRD_CELL_MAX_N:
                # the third-cell data set's exact divergence (whole output, not two counts)
                best = _raise_lower(BitRRThirdCellDelta(eps0, n, grid=third_cell_grid(n)),
                                    delta, best, eps0)
            return best
        if self.mechanism == "collision":
            best = 0.0
            for pd in _cheap_first([collision_pair(eps0, n, self.l)]
                                   + collision_third_value_pairs(eps0, n, self.l)):
                best = _lower_with(pd, delta, eps0, best)
            if n >= 2 and CollisionThirdValueDelta.terms(eps0, n, self.l) <= FOUR_COUNT_TERMS:
                best = _raise_lower(CollisionThirdValueDelta(eps0, n, self.l), delta, best, eps0)
            if 2 <= n <= THIRD_CELL_MAX_N:
                # the same data set's exact divergence, every hash-match pattern of each report
                best = _raise_lower(CollisionThirdValueExactDelta(eps0, n, self.l,
                                                                  grid=third_cell_grid(n)),
                                    delta, best, eps0)
            return best
        ks = [self.k] if self.mechanism == "krr" else [2, 3, 4]
        best = RRLowerBound().central_eps(eps0, n, delta) if self.mechanism == "generic" else 0.0
        p = exp_lo(eps0)        # at most e^eps0: k-RR at this ratio is a post-processing
        for k in ks:
            if k >= 3 and n >= 2:
                # the merged third-value pair first: fast binomials, and where the exact
                # pair below cannot beat it, that one costs one evaluation (_lower_with)
                a = 1.0 / (p + k - 1.0)
                pd = _pair_delta(p, a, 1.0 - (p + 1.0) * a, a, n)
                best = _lower_with(pd, delta, eps0, best)
            best = _lower_with(krr_pair(eps0, n, k), delta, eps0, best)
            if k >= 3 and n >= 2:
                if KRRThirdValueDelta.terms(eps0, n, k) <= THREE_COUNT_TERMS:
                    best = _raise_lower(KRRThirdValueDelta.shared(eps0, n, k), delta, best, eps0)
                elif self.mechanism == "krr" and n <= THIRD_CELL_MAX_N:
                    # the same data set's whole histogram, exactly, where the above is too slow
                    best = _raise_lower(KRRThirdValueExactDelta(eps0, n, k), delta, best, eps0)
        return best

    def dominating_pair(self, eps0: float, n: int, eps_ref: float | None = None,
                        tail: float = 1e-15, max_atoms: int = 5_000_000,
                        max_buckets: int | None = None):
        """(log_p, log_q): a pair of distributions whose hockey-stick divergence at every
        eps, in both directions, is >= this bound's delta (the bucketed blanket pair).

        Atoms: (bucket of m_c, m_r; s; h) with P = P(bucket) Bin(n', q)(s) Bin(s, 1/2)(h)
        (p h + d + m_r + p m_c) / n (Q: h and d swapped), m_c, m_r the bucket's lowest
        counts (at most ``max_buckets`` per count: coarser than
        :class:`BlanketDelta`'s, still an upper bound; default: the most of
        PAIR_BUCKETS whose pair has at most PAIR_ATOM_BUDGET atoms, at least the last,
        so small n gets fine buckets: 4-RR at n = 1000, eps0 = ln 13 composed over 4 and
        16 rounds is 0.12-0.14% above the one-bucket-per-count pair with 64 buckets per
        count, 0.9% with 8).  The
        lowest counts make the total mass T <= 1: a zero-loss atom (equal mass on both
        sides) holds 1 - T.  Mass left out of the s / h windows (``tail`` per binomial
        side) and below the bucket windows goes pessimistically to two extra atoms: the
        last but one has P = leftover, Q = 0 (loss +inf, log_q = -inf), the last P = 0,
        Q = leftover (loss -inf). Buckets are sized for ``eps_ref`` (default: this
        bound's eps at delta = 1e-8); the pair dominates at every eps regardless.
        """
        _check(eps0, n, 1e-8)
        if eps_ref is None:
            eps_ref = self.central_eps(eps0, n, 1e-8)
        p, px, pr, pc = blanket_params(self.mechanism, eps0, self.k, self.l, self.kr)
        bd = BlanketDelta(p, n, px, pr, pc, tail=tail)
        ee = math.exp(max(eps_ref, 1e-9))
        sd = bd._sd(ee)
        scale = min(BUCKET_SHIFT * sd, 0.05 * max(p - ee, 0.0))
        wr = _pow2(scale / (ee - 1.0))
        wc = _pow2(scale / (p * (ee - 1.0)))
        if max_buckets is None:
            max_buckets = PAIR_BUCKETS[-1]
            for mb in PAIR_BUCKETS:
                if _pair_atoms(bd, n, px, pr, pc, wr, wc, mb, tail) <= PAIR_ATOM_BUDGET:
                    max_buckets = mb
                    break
        lp, lq = [], []
        mass_p = mass_q = 0.0
        total = 0.0            # T: the bucketed pair's full mass
        left = 0.0             # mass outside the bucket windows
        atoms = 0
        # s -> (h window, log Bin(s, 1/2)(h)): the same for every bucket an s recurs in
        halves: dict = {}
        for mc, Pc in _norm_buckets(bd, n, pc, max(wc, -(-bd._span(n, pc) // max_buckets))):
            if mc is None:
                left += Pc
                continue
            qr = pr / (1.0 - pc) if pc < 1 else 0.0
            for mr, Pr in _norm_buckets(bd, n - mc, qr,
                                        max(wr, -(-bd._span(n - mc, qr) // max_buckets))):
                if mr is None:
                    left += Pc * Pr
                    continue
                if Pc * Pr <= 0.0:
                    continue
                n2 = n - mc - mr
                rest = 1.0 - pr - pc
                q = min(1.0, 2.0 * px / rest) if rest > 0 else 1.0
                total += Pc * Pr * ((p + 1.0) * n2 * q / 2.0 + mr + p * mc) / n
                if q < 1.0:
                    lo, hi, _ = _window(n2, q, tail, exact_out=False)
                else:
                    lo = hi = n2
                svals = np.arange(lo, hi + 1, dtype=np.int64)
                lw = (binom_logpmf(svals, n2, q) if q < 1.0 else np.zeros(1)) + math.log(Pc * Pr)
                for s_, lws in zip(svals.tolist(), lw.tolist()):
                    if s_ not in halves:
                        if s_ == 0:
                            h = np.zeros(1, dtype=np.int64)
                        else:
                            hlo, hhi, _ = _window(s_, 0.5, tail, exact_out=False)
                            hlo = min(hlo, s_ - hhi)          # symmetric: h <-> s - h
                            h = np.arange(hlo, s_ - hlo + 1, dtype=np.int64)
                        halves[s_] = (h, binom_logpmf(h, s_, 0.5))
                    h, log_half = halves[s_]
                    base = lws + log_half - math.log(n)
                    d = s_ - h
                    wp = p * h + d + mr + p * mc
                    wq = h + p * d + mr + p * mc
                    with np.errstate(divide="ignore"):
                        lp.append(base + np.log(wp))
                        lq.append(base + np.log(wq))
                    atoms += h.size
                    if atoms > max_atoms:
                        raise ConfigError("n", f"the explicit tight pair at n={n} needs more than "
                                          f"{max_atoms} atoms", "pass a larger max_atoms or a "
                                          "larger tail, or compose at a smaller n")
        log_p, log_q = np.concatenate(lp), np.concatenate(lq)
        kept_p = float(np.sum(np.exp(log_p)))
        kept_q = float(np.sum(np.exp(log_q)))
        zero = max(0.0, 1.0 - total - 1e-12)
        inf_p = max(0.0, 1.0 - zero - kept_p)
        inf_q = max(0.0, 1.0 - zero - kept_q)
        with np.errstate(divide="ignore"):
            extra_p = np.log(np.array([zero, inf_p, 0.0]))
            extra_q = np.log(np.array([zero, 0.0, inf_q]))
        return np.concatenate([log_p, extra_p]), np.concatenate([log_q, extra_q])

    def lower_bound(self) -> "TightLowerBound":
        return TightLowerBound(self)


class TightLowerBound(AmplificationBound):
    """:meth:`TightBound.lower` as a bound object (kind 'lower')."""
    name = "lower_bound"
    kind = "lower"

    def __init__(self, upper: TightBound):
        self.upper = upper
        self.citation = {"krr": "exact divergences of shuffled k-RR: others all hold x', or all "
                                "a third value (counts of x and x'; the whole histogram where "
                                "n is small); the larger",
                         "collision": "exact divergences of shuffled Collision (c=1): others all "
                                      "hold v', or all a third value (counts of the reports "
                                      "that single out v or v'; the whole output, every "
                                      "hash pattern, exactly, up to n = 2e6); the largest",
                         "bitrr": "exact divergences of shuffled per-bit RR (kr = 1): others "
                                  "all hot on h' (exact), or all on a third cell (counts of two "
                                  "patterns on the three cells; the whole output, exactly, up "
                                  "to n = 2e6); the largest",
                         "generic": "the largest exact divergence of shuffled binary RR and "
                                    "3-/4-RR pairs (each eps0-LDP)"}[upper.mechanism]

    def central_eps(self, eps0: float, n: int, delta: float) -> float:
        return self.upper.lower(eps0, n, delta)


def tight_bound(mechanism: str = "generic", **params) -> TightBound:
    """The tight bound for ``mechanism``: 'generic', 'krr' (k=), 'collision' (l=, c=1),
    'bitrr' (kr=1, d=)."""
    allowed = {"generic": set(), "krr": {"k"}, "collision": {"l", "c"},
               "bitrr": {"kr", "d"}}.get(mechanism)
    if allowed is not None:
        extra = set(params) - allowed
        if extra:
            raise ConfigError("mechanism", f"{mechanism!r} takes no parameter(s) {sorted(extra)}",
                              f"pass only {sorted(allowed) or 'no parameters'}")
    return TightBound(mechanism, **params)

"""Exact divergence of shuffled k-RR (and Collision with c = 1) for one neighbouring pair.

The pair: user 1 holds x vs x', the other n-1 users all hold x'. Under the second
dataset all n reports are i.i.d.; the first replaces one of them, so for the shuffled
multiset h

    P0(h) / P1(h) = (1/n) sum_i L(y_i),  L(y) = P[y | x] / P[y | x'],

and L is p = e^eps0 on "y says x", 1/p on "y says x'", 1 elsewhere. Hence
LR = 1 + ((p-1) h0 - (1-1/p) h1) / n with h0, h1 the counts of the two kinds, a
sufficient statistic, and under P1 (h0, h1) is multinomial(n; pi0, pi1):

* k-RR (a = 1/(p+k-1)): pi0 = a, pi1 = p a; for k = 2 this is the binary-RR pair
  of :class:`rknn_ray.accounting.bounds.RRLowerBound`.
* Collision with c = 1 (Omega = p + l - 1, a = 1/Omega): given a client's hash H the
  report is l-RR on H(x); the adversary sees H, and a report counts towards h0 / h1
  only if H(x) != H(x') (probability 1 - 1/l under a pairwise-independent hash), so
  pi0 = a (1 - 1/l), pi1 = p a (1 - 1/l).

delta(eps) = E_P1[(LR - e^eps)+] (and the reverse direction E_P1[(1 - e^eps LR)+]) is a
one-dimensional sum over h0: for fixed h0 the positive part is a tail in h1, whose
partial first moment is N rho P[Bin(N-1, rho) <= u-1]. The h0 window drops terms
(nonnegative, mass <= 1e-15), which only lowers the value: sound for a lower bound.
"""
from __future__ import annotations

import math

import numpy as np

from rknn_ray.accounting.binom_fast import EXACT_RTOL_PER_M, binom_logpmf, pmf_rtol
from rknn_ray.accounting.hockey import FLOAT_SLACK_PER_TERM, BlanketPair, PairDelta, _window


class ShuffledRRPairDelta:
    """delta(eps) of the pair above, with (estimate, err_up, err_down) like PairDelta."""

    def __init__(self, p: float, n: int, pi0: float, pi1: float, tail: float = 1e-15):
        if not (p > 1.0 and 0 < pi0 and 0 < pi1 and pi0 + pi1 <= 1.0 + 1e-12):
            raise ValueError("need p > 1 and category probabilities pi0, pi1 > 0 summing to <= 1")
        self.p, self.n = p, int(n)
        lo, hi, _ = _window(self.n, pi0, tail, exact_out=False)
        h0 = np.arange(lo, hi + 1, dtype=np.int64)
        self.h0 = h0
        self.w = np.exp(binom_logpmf(h0, self.n, pi0)) if self.n > 0 else np.ones(1)
        self.N = self.n - h0                           # reports left for h1
        self.rho = min(1.0, pi1 / (1.0 - pi0))
        # relative error of the weights and of cephes' binomial CDFs (~2e-15 N)
        self.rel = pmf_rtol(max(abs(lo - self.n * pi0), abs(hi - self.n * pi0)) + 1) \
            + EXACT_RTOL_PER_M * max(1, self.n)
        self.slack = FLOAT_SLACK_PER_TERM * (8 * h0.size + 16)

    def _cdf(self, u, N):
        """P[Bin(N, rho) <= u] elementwise (0 for u < 0, 1 for u >= N)."""
        from scipy.special import bdtr  # defers scipy
        out = np.where(u >= N, 1.0, 0.0)
        inside = (u >= 0) & (u < N)
        if np.any(inside):
            out[inside] = bdtr(u[inside], N[inside], self.rho)
        return out

    def _sf(self, v, N):
        """P[Bin(N, rho) >= v] elementwise (1 for v <= 0, 0 for v > N)."""
        from scipy.special import bdtrc  # defers scipy
        out = np.where(v <= 0, 1.0, 0.0)
        inside = (v >= 1) & (v <= N)
        if np.any(inside):
            out[inside] = bdtrc(v[inside] - 1, N[inside], self.rho)
        return out

    def _pmf(self, j, N):
        """P[Bin(N, rho) = j] elementwise (0 off the support)."""
        if self.rho >= 1.0:
            return (j == N).astype(float)
        return np.exp(binom_logpmf(j, N, self.rho))

    def delta(self, eps: float) -> tuple[float, float, float]:
        p, n, h0, N, rho = self.p, self.n, self.h0, self.N, self.rho
        ee = math.exp(eps)
        h0f = h0.astype(float)
        c1 = (1.0 - 1.0 / p) / n                       # LR = b0(h0) - c1 h1
        b0 = 1.0 + (p - 1.0) * h0f / n
        Nm1 = np.maximum(N - 1, 0)
        # P0 vs P1: LR - ee > 0  <=>  h1 < (b0 - ee) / c1: h1 <= u
        # clipped to [-2, n + 2] before the cast: beyond int64 (e^eps n ~ 1e22 at eps0 = 30,
        # n = 1e9) the cast is undefined (numpy warns and wraps); outside [0, N] the
        # tails below are 0 or 1 anyway
        u = np.ceil(np.clip((b0 - ee) / c1, -2.0, n + 2.0)).astype(np.int64) - 1
        # one CDF per h0; the other by P[Bin(N) <= u] = P[Bin(N-1) <= u-1] + (1-rho) pmf_(N-1)(u)
        # (a sum of nonnegative terms: no cancellation)
        F1 = self._cdf(u - 1, Nm1)
        F = np.where(u >= N, 1.0, F1 + (1.0 - rho) * self._pmf(u, Nm1))
        m1 = N * rho * F1                              # E[h1 1{h1 <= u}]
        t01 = (b0 - ee) * F - c1 * m1
        mag01 = np.abs(b0 - ee) * F + c1 * m1
        # P1 vs P0: 1 - ee LR > 0  <=>  h1 > (b0 - 1/ee) / c1: h1 >= v
        v = np.floor(np.clip((b0 - 1.0 / ee) / c1, -2.0, n + 2.0)).astype(np.int64) + 1
        # P[Bin(N-1) >= v-1] = P[Bin(N) >= v] + (1-rho) pmf_(N-1)(v-1), again a sum
        S = self._sf(v, N)
        S1 = np.where(v <= 1, 1.0, S + (1.0 - rho) * self._pmf(v - 1, Nm1))
        m2 = N * rho * S1                              # E[h1 1{h1 >= v}]
        t10 = (1.0 - ee * b0) * S + ee * c1 * m2
        mag10 = np.abs(1.0 - ee * b0) * S + ee * c1 * m2
        best, err = 0.0, 0.0
        for t, mag in ((t01, mag01), (t10, mag10)):
            d = float(np.sum(self.w * np.maximum(t, 0.0)))
            if d >= best:
                best = d
                err = 2.0 * self.rel * float(np.sum(self.w * mag))
        return best, self.slack + err, self.slack + err


def exp_lo(x: float) -> float:
    """A float at most e^x (x >= 0): math.exp errs by < 1 ulp, lowered by 4 ulps (2^-50
    relative). The lower bounds of k-RR (an eps0-LDP randomizer in exact arithmetic) use it:
    k-RR with a smaller ratio is a post-processing (mixing with the uniform draw), so its
    divergence is at most k-RR's at eps0; with the float e^eps0 (possibly a hair above) it
    would not be."""
    return math.exp(float(x)) * (1.0 - 2.0 ** -50)


def collision_ratio_lo(eps0: float, l: int) -> float:
    """A float ratio p at most the one the project's Collision sampler (c = 1) realises at eps0.

    The sampler keeps the hashed cell with pi_s = a multiple of 2^-53 at least
    w / (w + l - 1) - 2^-53, w an exact lower bound of e^eps0 within 2^-149 relative
    (rknn_ray.mechanisms.collision.collision_member_threshold), and spreads 1 - pi_s evenly:
    ratio r(pi_s) = pi_s (l - 1) / (1 - pi_s), convex and increasing in pi, with r(pi*) = w at
    pi* = w / (w + l - 1), so r(pi_s) >= w - 2^-53 (w + l - 1)^2 / (l - 1).  This returns
    e^eps0 lowered by 1e-12 relative (which covers w's and math.exp's errors) and by twice
    that second term, in floats lowered once more by 1e-15 relative; an l-RR with a smaller
    ratio is a post-processing of the sampler's, so its divergence is a lower bound.
    (e^eps0 itself, as the count pairs used before, can be above the sampler's ratio: the
    unsafe direction for a lower bound.)"""
    e = math.exp(float(eps0))
    l = int(l)
    return (e * (1.0 - 1e-12) - 2.0 ** -52 * (e + l - 1.0) ** 2 / (l - 1.0)) * (1.0 - 1e-15)


def krr_pair(eps0: float, n: int, k: int) -> ShuffledRRPairDelta:
    """k-RR, user 1 holds value 0 vs 1, the other n-1 users hold 1 (ratio :func:`exp_lo`)."""
    p = exp_lo(eps0)
    a = 1.0 / (p + k - 1.0)
    return ShuffledRRPairDelta(p, n, a, p * a)


def collision_pair(eps0: float, n: int, l: int) -> ShuffledRRPairDelta:
    """Collision with c = 1 and Bloom length l, user 1 holds cell v vs v', the others v'
    (ratio :func:`collision_ratio_lo`, at most the sampler's)."""
    p = collision_ratio_lo(eps0, l)
    a = 1.0 / (p + l - 1.0)
    keep = 1.0 - 1.0 / l
    return ShuffledRRPairDelta(p, n, a * keep, p * a * keep)


def collision_third_value_pairs(eps0: float, n: int, l: int) -> list[PairDelta]:
    """Collision (c = 1), user 1 holds v vs v', the other n-1 users all hold a third v''.

    The adversary knows v, v', v'' and every report's hash, so it can sort each report
    (H, z) by [z = H(v)], [z = H(v')], [z = H(v'')]; with H(v), H(v'), H(v'') i.i.d.
    uniform on [l] (the hash is 3-wise independent), kappa = 1/l, u = (1-kappa)^2 a:

    * A: z = H(v), not H(v') nor H(v''): p u under v, u under v', u for each other user;
    * B: the same with v and v' swapped;
    * C: z = H(v) = H(v'') != H(v'): kappa (1-kappa) a times (p, 1, p) (v, v', others);
      D: C with v and v' swapped; everything else has the same law under v and v'.

    Two coarsenings have the shape of :class:`rknn_ray.accounting.hockey.BlanketPair`
    (user 1 lands in "0" / "1" w.p. (p b, b) vs (b, p b), each other user w.p. r each):
    the counts of A and B (b = r = u), and of A+C and B+D (b = (1-kappa) a, r = u +
    kappa (1-kappa) p a).  Each count pair is a post-processing of the shuffled output of
    this dataset, so its exact divergence is a lower bound (A/B wins at large l, A+C/B+D
    at small l and eps0).  Empty for n < 2.  p: :func:`collision_ratio_lo`.
    """
    if n < 2:
        return []
    p = collision_ratio_lo(eps0, l)
    a = 1.0 / (p + l - 1.0)
    kappa = 1.0 / l
    u = (1.0 - kappa) ** 2 * a
    merged = (1.0 - kappa) * a
    return [PairDelta(BlanketPair(p, b, 1.0 - (p + 1.0) * b, r, int(n)))
            for b, r in ((u, u), (merged, u + kappa * (1.0 - kappa) * p * a))]



def bitrr_flip_probability(eps0: float, kr: int = 1) -> float:
    """A flip probability at most the one the project's ``rr`` sampler uses at eps0 with kr
    ones, for the per-bit RR bounds (rknn_ray.accounting.tight's ``bitrr`` form).

    The sampler flips with q_s = 1/(w + 1) rounded *up* to a multiple of 2^-53, w an exact
    lower bound of e^{eps0/(2kr)} (rknn_ray.mechanisms.randomized_response.rr_flip_threshold),
    so q_s >= 1/(e^{eps0/(2kr)} + 1). This returns that float value lowered by 1e-15
    relative (more than the few ulps its evaluation may err up): q <= q_s. Flipping with q_s
    is flipping with q, then again independently with (q_s - q)/(1 - 2q), a post-processing
    of each report, so a bound for q holds for the sampler's reports (and the accounting
    package needs nothing from the mechanisms one, which imports it)."""
    return (1.0 - 1e-15) / (math.exp(float(eps0) / (2.0 * int(kr))) + 1.0)


def bitrr_flip_probability_hi(eps0: float, kr: int = 1) -> float:
    """A flip probability at least the ``rr`` sampler's q_s at eps0 (with kr ones), for the
    per-bit RR *lower* bounds: q_s is 1/(w + 1) rounded up to a multiple of 2^-53, w an exact
    lower bound of e^{eps0/(2kr)} (:func:`bitrr_flip_probability`'s doc), so
    1/(e^{eps0/(2kr)} + 1) raised by 1e-14 relative and by 2^-52 is above it; that is rounded
    up to a multiple of 2^-53, so q and 1 - q are exact floats (the binomials of the lower
    bounds then have exact parameters). More noise is a post-processing (flip again), so the
    divergence at this q is at most the sampler's."""
    q = (1.0 + 1e-14) / (math.exp(float(eps0) / (2.0 * int(kr))) + 1.0) + 2.0 ** -52
    return math.ceil(q * 2.0 ** 53) / 2.0 ** 53

def bitrr_pairs(eps0: float, n: int, d: int) -> list:
    """The project's per-bit RR with one hot cell (kr = 1) on d cells, at a flip probability q
    at least the sampler's (:func:`bitrr_flip_probability_hi`; p = ((1-q)/q)^2 is then at most
    the sampler's ratio): pairs whose exact divergences are lower bounds for its shuffled
    output, user 1 hot on h vs h'. (Before issue 50's fix they used
    :func:`bitrr_flip_probability`, 1e-15 *below* the sampler's q: less noise, the unsafe
    direction for a lower bound.)

    * The others all hot on h': only (y_h, y_h') differs in law, with
      L = p on (1, 0), 1/p on (0, 1), 1 elsewhere, so the counts of (1, 0) and (0, 1) are
      sufficient: the exact divergence of this dataset's shuffled output (pi0 = q^2,
      pi1 = (1-q)^2 per report under h').
    * d >= 3, the others all hot on a third cell h'': the counts of reports showing (1, 0)
      vs (0, 1) on (h, h') with their bit h'' = 0 (user 1: (1-q)^3 vs q^2 (1-q) under h,
      swapped under h'; each other user q^2 (1-q) each), and the same counts whatever bit
      h'' (user 1: (1-q)^2 vs q^2; others q (1-q)): shapes of
      :class:`rknn_ray.accounting.hockey.BlanketPair`, post-processings of the output.

    Empty for n < 2.
    """
    if n < 2:
        return []
    q = bitrr_flip_probability_hi(eps0, 1)
    b = (1.0 - q) / q
    p = b * b
    pairs: list = [ShuffledRRPairDelta(p, n, q * q, (1.0 - q) ** 2)]
    if d >= 3:
        pairs += [PairDelta(BlanketPair(p, a, 1.0 - (p + 1.0) * a, r, int(n)))
                  for a, r in ((q * q * (1.0 - q), q * q * (1.0 - q)), (q * q, q * (1.0 - q)))]
    return pairs


class CollisionThirdValueDelta:
    """delta(eps) of the four counts A, B, C, D of :func:`collision_third_value_pairs`
    (the rest merged), exact, as (estimate, err_up, err_down); cost grows as n^1.5.

    With N ~ Multinomial(n; u, u, w, w, rest) the counts when all n users hold v'' and
    rho_b(c) = P[c | user 1 holds b] / P[c | v''], user 1 holding v (b = 0) vs v' (1)
    gives P_b(N) = P''(N) sum_c N_c rho_b(c) / n, so

        delta(eps) = E''[(sum_c N_c (rho_0(c) - e^eps rho_1(c)))_+] / n,

    summed over t = N_C + N_D, N_C | t, m = N_A + N_B | t, and in closed form over
    h = N_A | m ~ Bin(m, 1/2): with the sum K + D h, c = -K / D and h0 = floor(c) + 1,
    E[(K + D h)_+] = D (E[(h - h0)_+] + (h0 - c) P[h >= h0]), both read from tables of
    Bin(., 1/2) tails and of their sums (nonnegative terms: no cancellation).  Windows
    drop terms (each >= 0: the value only falls, sound for a lower bound); the tables'
    relative errors and the rounding of c go to err_down.  ``terms(eps0, n, l)`` counts
    the (N_C, m) grid points before any work (callers keep the cost bounded).
    """

    @staticmethod
    def terms(eps0: float, n: int, l: int, tail: float = 1e-11) -> int:
        p = collision_ratio_lo(eps0, l)
        a = 1.0 / (p + l - 1.0)
        w = (1.0 - 1.0 / l) / l * p * a
        u = (1.0 - 1.0 / l) ** 2 * a
        lo, hi, _ = _window(int(n), 2.0 * w, tail, exact_out=False)
        t = max(1, int(n * 2.0 * w))
        jl, jh, _ = _window(t, 0.5, tail, exact_out=False)
        ml, mh, _ = _window(int(n) - t, 2.0 * u / (1.0 - 2.0 * w), tail, exact_out=False)
        return (hi - lo + 1) * (jh - jl + 1) * (mh - ml + 1)

    def __init__(self, eps0: float, n: int, l: int, tail: float = 1e-11):
        p = collision_ratio_lo(eps0, l)     # at most the sampler's ratio (a lower bound)
        a = 1.0 / (p + l - 1.0)
        kappa = 1.0 / l
        u, w = (1.0 - kappa) ** 2 * a, kappa * (1.0 - kappa) * p * a
        rest = 1.0 - 2.0 * u - 2.0 * w
        self.p, self.n = p, int(n)
        self.rho_r = (1.0 - (p + 1.0) * u - w - w / p) / rest if rest > 0 else 1.0
        lo, hi, _ = _window(self.n, 2.0 * w, tail, exact_out=False)
        qm = 2.0 * u / (1.0 - 2.0 * w)
        self.blocks = []              # (t, j, P(t) P(j | t), m, P(m | t))
        m_lo, m_hi = self.n, 0
        off = max(abs(lo - self.n * 2.0 * w), abs(hi - self.n * 2.0 * w))   # weights' offsets
        for t in range(lo, hi + 1):
            wt = float(np.exp(binom_logpmf(np.array([t]), self.n, 2.0 * w))[0])
            jl, jh, _ = _window(t, 0.5, tail, exact_out=False)
            j = np.arange(jl, jh + 1, dtype=np.int64)
            ml, mh, _ = _window(self.n - t, qm, tail, exact_out=False)
            m = np.arange(ml, mh + 1, dtype=np.int64)
            wj = np.exp(binom_logpmf(j, t, 0.5)) if t > 0 else np.ones(1)
            wm = np.exp(binom_logpmf(m, self.n - t, qm)) if self.n > t else np.ones(1)
            self.blocks.append((t, j, wt * wj, m, wm))
            off = max(off, jh - t / 2.0, t / 2.0 - jl, abs(mh - (self.n - t) * qm),
                      abs(ml - (self.n - t) * qm))
            m_lo, m_hi = min(m_lo, int(m[0])), max(m_hi, int(m[-1]))
        # S[r, k] = P[Bin(m_lo - 1 + r, 1/2) >= k], k = 0 .. m_hi + 1 (0 beyond m)
        self.m0 = max(m_lo - 1, 0)
        rows = np.arange(self.m0, m_hi + 1, dtype=np.int64)
        k = np.arange(0, m_hi + 2, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            pmf = np.where(k[None, :] <= rows[:, None],
                           np.exp(binom_logpmf(np.minimum(k[None, :], rows[:, None]),
                                               rows[:, None], 0.5)), 0.0)
        pmf[rows == 0, 0] = 1.0
        self.S = np.cumsum(pmf[:, ::-1], axis=1)[:, ::-1]            # P[h >= k]
        G = np.cumsum(self.S[:, ::-1], axis=1)[:, ::-1]               # sum_{j >= k} P[h >= j]
        self.G = np.concatenate([G[:, 1:], np.zeros((G.shape[0], 1))], axis=1)  # E[(h - k)_+]
        # weights: three pmfs each; table: one pmf and <= m_hi + 2 summed terms
        self.rel = 3.0 * pmf_rtol(off + 1) + pmf_rtol(m_hi / 2.0 + 1) + 4.5e-16 * (m_hi + 2)
        self.terms = sum(j.size * m.size for _, j, _, m, _ in self.blocks)

    def delta(self, eps: float) -> tuple[float, float, float]:
        p, n = self.p, self.n
        ee = math.exp(eps)
        D = (p - 1.0) * (1.0 + ee)
        vB, vD, vR = 1.0 - ee * p, 1.0 / p - ee, self.rho_r * (1.0 - ee)
        est = err_c = 0.0
        for t, j, wj, m, wm in self.blocks:
            parts = (t * vD, (D / p) * j[:, None], (vB - vR) * m[None, :], (n - t) * vR)
            K = parts[0] + parts[1] + parts[2] + parts[3]
            size = abs(parts[0]) + np.abs(parts[1]) + np.abs(parts[2]) + abs(parts[3])
            c = -K / D
            mm = np.broadcast_to(m[None, :], K.shape)
            h0 = np.clip(np.floor(c).astype(np.int64) + 1, 0, mm + 1)
            r = mm - self.m0
            sf = self.S[r, h0]
            val = D * (self.G[r, h0] + (h0 - c) * sf)
            W = wj[:, None] * wm[None, :]
            est += float(np.sum(W * val))
            # c's rounding (a few ulps of the parts summed into K) moves val by <= D sf |dc|
            err_c += float(np.sum(W * sf * (size + D * np.abs(c)))) * 8.0 * 2.2e-16
        est /= n
        # every term is >= 0: float rounding (products, pairwise sums over <= 2^40 terms)
        # is relative, <= 64 ulps of the total
        err = (1.01 * self.rel + 64 * 2.2e-16) * est + err_c / n
        return est, err, err


class KRRThirdValueDelta:
    """delta(eps) of shuffled k-RR (k >= 3), user 1 holding x vs x', the other n-1 users all
    holding a third value v'': exact, from the whole histogram, as (estimate, err_up,
    err_down); cost grows as n (one incomplete beta per (N_x, N_x') cell).

    Under the second data set and the first the others' reports are the same, so with P''
    the law when all n users hold v'' and rho_b(y) = P[y | b] / P[y | v'']:
    P_b(h) = P''(h) sum_i rho_b(y_i) / n, and rho_x is p on "x", 1/p on "v''", 1 elsewhere.
    The histogram's counts N_x, N_x', N_r (the k-3 other values) and N_v'' = n - the rest
    are therefore sufficient, and

        delta(eps) = E''[(N_x (p - e^eps) + N_x' (1 - e^eps p) + N_r (1 - e^eps)
                          + N_v'' (1 - e^eps) / p)_+] / n,

    the same in both directions (x and x' swap).  :func:`krr_pair`'s "counts of x and x'"
    coarsening of this data set drops N_r and N_v'', which tell the adversary how many
    of the others' reports were randomized; where the blanket holds few reports (n ~ 1e3,
    eps0 ~ 6) that is most of the gap.  Given (N_x, N_x') the sum is K + c N_r with
    c = (1 - e^eps)(1 - 1/p) <= 0 and N_r ~ Bin(N, q): a lower tail with its first
    moment, closed form.  Windows drop terms (each >= 0: the value only falls, sound for a
    lower bound); the weights' and incomplete betas' relative errors go to err_down.
    """

    @staticmethod
    def terms(eps0: float, n: int, k: int, tail: float = 1e-13) -> int:
        """(N_x, N_x') cells summed: callers keep the cost bounded."""
        a = 1.0 / (exp_lo(eps0) + k - 1.0)
        lo, hi, _ = _window(int(n), a, tail, exact_out=False)
        return (hi - lo + 1) ** 2

    _shared: dict = {}

    @classmethod
    def shared(cls, eps0: float, n: int, k: int) -> "KRRThirdValueDelta":
        """One instance per (eps0, n, k) in this process: a pure function of public
        parameters, never changed after __init__, whose cells cost ~10 ms to build; a
        grid, a calibration and the published comparison ask for the same ones again."""
        key = (float(eps0), int(n), int(k))
        if key not in cls._shared:
            if len(cls._shared) >= 256:
                cls._shared.clear()
            cls._shared[key] = cls(eps0, n, k)
        return cls._shared[key]

    def __init__(self, eps0: float, n: int, k: int, tail: float = 1e-13):
        if k < 3 or n < 2:
            raise ValueError("the third-value pair needs k >= 3 and n >= 2")
        p = exp_lo(eps0)                               # at most e^eps0: a lower bound
        a = 1.0 / (p + k - 1.0)
        self.p, self.n = p, int(n)
        self.qy = a / (1.0 - a)                        # x' among reports that are not x
        self.qr = (k - 3) * a / (1.0 - 2.0 * a)        # the k-3 others among the rest
        lo, hi, _ = _window(self.n, a, tail, exact_out=False)
        self.cells = []                                # (N_x, N_x' values, weights)
        off = max(abs(lo - self.n * a), abs(hi - self.n * a))
        for x in range(lo, hi + 1):
            wx = float(np.exp(binom_logpmf(np.array([x]), self.n, a))[0])
            ylo, yhi, _ = _window(self.n - x, self.qy, tail, exact_out=False)
            y = np.arange(ylo, yhi + 1, dtype=np.int64)
            wy = np.exp(binom_logpmf(y, self.n - x, self.qy)) if self.n > x else np.ones(1)
            off = max(off, abs(ylo - (self.n - x) * self.qy), abs(yhi - (self.n - x) * self.qy))
            self.cells.append((x, y, wx * wy))
        # two weights' pmfs, the tail's pmf term (its offset is at most n) and one
        # incomplete beta (relative ~4e-15 per trial) per cell
        self.rel = 2.0 * pmf_rtol(off + 1) + pmf_rtol(self.n + 1) + EXACT_RTOL_PER_M * max(1, self.n)
        self.slack = FLOAT_SLACK_PER_TERM * (8 * sum(c[1].size for c in self.cells) + 16)

    def delta(self, eps: float) -> tuple[float, float, float]:
        from scipy.special import bdtr  # defers scipy
        p, n, q = self.p, self.n, self.qr
        ee = math.exp(eps)
        c = (1.0 - ee) * (1.0 - 1.0 / p)
        est = mag_sum = 0.0
        for x, y, w in self.cells:
            N = n - x - y
            K = x * (p - ee) + y * (1.0 - ee * p) + N * (1.0 - ee) / p
            size = x * abs(p - ee) + y * abs(1.0 - ee * p) + N * abs(1.0 - ee) / p
            if c == 0.0 or q <= 0.0:
                val, mag = np.maximum(K, 0.0), size * (K > 0)
            else:
                # positive iff N_r <= u; P[Bin(N) <= u] = P[Bin(N-1) <= u-1] + (1-q) pmf_(N-1)(u)
                u = np.minimum(np.ceil(-K / c).astype(np.int64) - 1, N)
                live = u >= 0
                F1 = np.zeros(K.shape)
                pm = np.zeros(K.shape)
                whole = live & (u >= N)
                F1[whole] = 1.0
                part = live & (u < N) & (u >= 1)
                F1[part] = bdtr(u[part] - 1, N[part] - 1, q)
                inner = live & (u < N)
                pm[inner] = np.exp(binom_logpmf(u[inner], np.maximum(N[inner] - 1, 0), q))
                F = np.where(whole, 1.0, F1 + (1.0 - q) * pm)
                m1 = N * q * F1                        # E[N_r 1{N_r <= u}]
                val = np.where(live, K * F + c * m1, 0.0)
                mag = np.where(live, size * F + abs(c) * m1, 0.0)
            est += float(np.sum(w * np.maximum(val, 0.0)))
            mag_sum += float(np.sum(w * mag))
        err = self.slack + 2.0 * self.rel * mag_sum / n
        return est / n, err, err

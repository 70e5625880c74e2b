"""A shuffled round as a privacy loss distribution (PLD), so rounds compose tightly.

An amplification bound that names a *dominating pair* (P, Q) for n shuffled eps0-LDP
reports (``AmplificationBound.dominating_pair(eps0, n) -> (log_p, log_q)``, log
probabilities over a common finite support) certifies more than one (eps, delta): the
round's output pair on any neighbouring datasets is a post-processing of (P, Q), so
its hockey-stick divergence is below (P, Q)'s at every eps, in both directions, and
T rounds are below the T-fold composition of (P, Q) (dominating pairs compose). The
PLD of (P, Q), discretised pessimistically, composes with dp_accounting's PLDs: a
T-round job is charged that composition, not T times the per-round eps.

Pessimistic discretisation: each privacy loss is rounded *up* to the grid (with a
margin for float error); mass the pair leaves out (its truncated tails) and the
relative error of its log probabilities go to the infinite loss. The optimistic
twin (losses rounded down, dropped mass dropped) gives *lower* bounds, e.g. for the
T-fold composition of an explicit lower-bound pair (:func:`rr_lower_pair`).

Pairs here:

* :func:`blanket_pair_chunks`: the clone / blanket pair of
  :class:`rknn_ray.accounting.hockey.BlanketPair` with no "*" part (g = 0): user 1
  reports bucket 0 w.p. p a and bucket 1 w.p. a (swapped under Q), each of the n-1
  others lands in bucket 0 or 1 w.p. r each. With m = reports in {0, 1} and c of
  them in bucket 0, P(c, m) = W(m-1) Bin(m, 1/2)(c) 2 a (p c + m - c) / m, W the
  pmf of Bin(n-1, 2r): FMT's clone pair (r = e^-eps0 / 2) and Wang et al.'s generic
  variation-ratio pair (r = 1/(p+1)). It is 2-D, produced in chunks of m.
* :func:`rr_lower_pair`: shuffled binary RR, the others holding user 1's
  alternative (:class:`rknn_ray.accounting.bounds.RRLowerBound`): an explicit
  eps0-LDP mechanism, so its composition is a lower bound for any generic bound's.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from rknn_ray.accounting.binom_fast import binom_logpmf, pmf_rtol
from rknn_ray.accounting.hockey import TAIL_MASS, _window
from rknn_ray.accounting.shuffled_rr import exp_lo

#: the loss grid of the project's PLDs (rknn_ray.accounting.accountants uses the same)
PLD_DISCRETIZATION = 1e-4
#: most support points one pair may have (a round's PLD then builds in about a second)
MAX_SUPPORT = 20_000_000
#: support points per chunk (bounds the memory of one step)
CHUNK = 1 << 20
#: relative error assumed of a pair's probabilities when its bound states none (``pair_rtol``):
#: the fast binomials' (binom_fast.pmf_rtol) at offsets of ~1e3, with margin
_PAIR_RTOL = 1e-12
#: float margin on a loss, in grid units, before rounding (losses are accurate to ~1e-13)
_GRID_MARGIN = 1e-6


class PairTooLarge(ValueError):
    """The pair's support is above MAX_SUPPORT points: cost the round by its (eps, delta)."""


def blanket_pair_chunks(p: float, a: float, r: float, n: int, tail: float = TAIL_MASS,
                        max_support: int = MAX_SUPPORT):
    """Yield (log_p, log_q, loss, rel) chunks of the g = 0 blanket pair (module docstring).

    ``loss`` = log P/Q computed directly (not as a difference of two large logs);
    ``rel`` bounds the relative error of the chunk's probabilities (binom_fast's pmfs).
    """
    if not (p > 1.0 and 0.0 < r <= 0.5 and a > 0 and abs((p + 1.0) * a - 1.0) < 1e-9):
        raise ValueError(f"need p > 1, 0 < r <= 1/2 and (p + 1) a = 1, got p={p}, a={a}, r={r}")
    n1 = int(n) - 1
    q = min(1.0, 2.0 * r)
    if n1 == 0 or q >= 1.0:
        ms = np.array([1 if n1 == 0 else int(n)], dtype=np.int64)
        logw = np.zeros(1)
        w_rel = 0.0
    else:
        lo, hi, _ = _window(n1, q, tail, exact_out=False)
        ms = np.arange(lo, hi + 1, dtype=np.int64) + 1          # m - 1 = others in {0, 1}
        logw = binom_logpmf(ms - 1, n1, q)
        w_rel = pmf_rtol(max(abs(lo - n1 * q), abs(hi - n1 * q)) + 1)
    # c around m/2: the window of Bin(m_max, 1/2), shared by every m (a superset for smaller m)
    m_max = int(ms[-1])
    c_lo, c_hi, _ = _window(m_max, 0.5, tail, exact_out=False)
    half = max(m_max / 2.0 - c_lo, c_hi - m_max / 2.0) + 1
    offsets = np.arange(-math.ceil(half), math.ceil(half) + 1, dtype=np.int64)
    if ms.size * offsets.size > max_support:
        raise PairTooLarge(f"the pair has {ms.size * offsets.size:.3g} support points "
                           f"(n={n}, r={r:.3g}), above {max_support:.3g}")
    rel = w_rel + pmf_rtol(half + 1) + 1e-15
    rows = max(1, CHUNK // offsets.size)
    log_pa, lp = math.log(2.0 * a), math.log(p)
    for s in range(0, ms.size, rows):
        m = ms[s:s + rows, None]
        c = (m // 2) + offsets[None, :]
        ok = (c >= 0) & (c <= m)
        m_b = np.broadcast_to(m, c.shape)[ok]
        c_b, w_b = c[ok], np.broadcast_to(logw[s:s + rows, None], c.shape)[ok]
        mf, cf = m_b.astype(float), c_b.astype(float)
        common = w_b + binom_logpmf(c_b, m_b, 0.5) + log_pa - np.log(mf)
        up, down = p * cf + (mf - cf), cf + p * (mf - cf)
        # log((p c + m - c) / (c + p (m - c))) = log1p((p - 1)(2c - m) / (c + p (m - c)))
        loss = np.log1p((p - 1.0) * (2.0 * cf - mf) / down)
        yield common + np.log(up), common + np.log(down), np.clip(loss, -lp, lp), rel


def rr_lower_pair(eps0: float, n: int, tail: float = 1e-15) -> tuple[np.ndarray, np.ndarray]:
    """(log P0, log P1) of shuffled binary RR: user 1 holds 0 vs 1, the n-1 others hold 1.

    The count of "0" reports is I + Bin(n-1, 1/(p+1)), I ~ Bern(p/(p+1)) vs Bern(1/(p+1))
    (a sufficient statistic). The window drops up to ``tail`` of mass: fine for a lower bound.
    """
    p = exp_lo(eps0)        # at most e^eps0: the lower bound's side
    q = 1.0 / (p + 1.0)
    if n <= 1:
        return np.log([q, 1 - q]), np.log([1 - q, q])
    lo, hi, _ = _window(n - 1, q, tail, exact_out=False)
    k = np.arange(lo, hi + 2, dtype=np.int64)
    prev, same = np.exp(binom_logpmf(k - 1, n - 1, q)), np.exp(binom_logpmf(k, n - 1, q))
    p0 = (1 - q) * prev + q * same
    p1 = q * prev + (1 - q) * same
    with np.errstate(divide="ignore"):
        return np.log(p0), np.log(p1)


def histogram_lower_pair(p: float, n: int, pi0: float, pi1: float,
                         tail: float = 1e-15) -> tuple[np.ndarray, np.ndarray]:
    """(log P0, log P1) over the counts (h0, h1) of :mod:`rknn_ray.accounting.shuffled_rr`'s
    pair (user 1 holds x vs x', the others x'): P1 multinomial(n; pi0, pi1), P0 = LR P1
    with LR = 1 + ((p-1) h0 - (1-1/p) h1) / n. ``krr_pair`` / ``collision_pair`` name
    (p, pi0, pi1) for k-RR and Collision (c = 1); an explicit mechanism, so its composition
    is a lower bound for any upper bound on that randomizer's. Windows drop <= 2 ``tail``."""
    lo, hi, _ = _window(int(n), pi0, tail, exact_out=False)
    h0 = np.arange(lo, hi + 1, dtype=np.int64)[:, None]
    rho = min(1.0, pi1 / (1.0 - pi0))
    N = int(n) - h0
    c_lo, c_hi, _ = _window(int(N.max()), rho, tail, exact_out=False)
    half = math.ceil(max(N.max() * rho - c_lo, c_hi - N.max() * rho)) + 1
    h1 = np.rint(N * rho).astype(np.int64) + np.arange(-half, half + 1, dtype=np.int64)[None, :]
    ok = (h1 >= 0) & (h1 <= N)
    h0b, Nb, h1b = np.broadcast_to(h0, h1.shape)[ok], np.broadcast_to(N, h1.shape)[ok], h1[ok]
    log_p1 = binom_logpmf(h0b, int(n), pi0) + (binom_logpmf(h1b, Nb, rho) if rho < 1.0
                                               else np.where(h1b == Nb, 0.0, -np.inf))
    lr = 1.0 + ((p - 1.0) * h0b - (1.0 - 1.0 / p) * h1b) / n
    return log_p1 + np.log(lr), log_p1


class _Direction:
    """One direction's loss histogram, filled chunk by chunk (mass: probabilities under the
    first distribution; loss: log of its ratio to the second, +inf where that is 0)."""

    def __init__(self, d: float, pessimistic: bool):
        self.d, self.pessimistic = d, pessimistic
        self.lo, self.hist, self.kept, self.inf_mass, self.rel = None, np.zeros(0), 0.0, 0.0, 0.0

    def add(self, mass: np.ndarray, loss: np.ndarray, rel: float) -> None:
        self.rel = max(self.rel, rel)
        keep = mass > 0
        mass, loss = mass[keep], loss[keep]
        infinite = ~np.isfinite(loss)
        if np.any(infinite):
            at_inf = float(np.sum(mass[infinite & (loss > 0)]))
            self.inf_mass, self.kept = self.inf_mass + at_inf, self.kept + at_inf
            mass, loss = mass[~infinite], loss[~infinite]
        if not mass.size:
            return
        self.kept += float(np.sum(mass))
        scaled = loss / self.d
        idx = (np.ceil(scaled + _GRID_MARGIN) if self.pessimistic
               else np.floor(scaled - _GRID_MARGIN)).astype(np.int64)
        c_lo, c_hi = int(idx.min()), int(idx.max())
        lo, hist = self.lo, self.hist
        if lo is None:
            lo, hist = c_lo, np.zeros(c_hi - c_lo + 1)
        elif c_lo < lo or c_hi >= lo + hist.size:
            new_lo, new_hi = min(lo, c_lo), max(lo + hist.size - 1, c_hi)
            grown = np.zeros(new_hi - new_lo + 1)
            grown[lo - new_lo:lo - new_lo + hist.size] = hist
            lo, hist = new_lo, grown
        hist += np.bincount(idx - lo, weights=mass, minlength=hist.size)[:hist.size]
        self.lo, self.hist = lo, hist

    def pmf(self):
        from dp_accounting.pld import pld_pmf  # defers dp_accounting (see accounting/__init__)
        lo, hist = (0, np.zeros(1)) if self.lo is None else (self.lo, self.hist)
        # each probability is at least (1 - rel) of its computed value: keep that much; the
        # rest of the mass (what the pair left out, what its probabilities may lack, the
        # sums' float error) goes to the infinite loss when pessimistic, is dropped otherwise
        hist = hist * (1.0 - self.rel)
        inf_mass = self.inf_mass
        if self.pessimistic:
            inf_mass += max(0.0, 1.0 - self.kept * (1.0 - self.rel)) + 1e-14
            if inf_mass >= 1.0:
                raise ValueError("the pair's masses do not form a distribution")
        return pld_pmf.DensePLDPmf(self.d, lo, hist, min(1.0, inf_mass), self.pessimistic)


def pld_from_chunks(chunks, d: float = PLD_DISCRETIZATION, pessimistic: bool = True):
    """The PLD of a pair given as an iterable of (log_p, log_q, loss, rel) chunks, both
    directions in one pass (remove: loss of P over Q under P; add: of Q over P under Q)."""
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution  # defers dp_accounting
    remove, add = _Direction(d, pessimistic), _Direction(d, pessimistic)
    for log_p, log_q, loss, rel in chunks:
        remove.add(np.exp(log_p), loss, rel)
        add.add(np.exp(log_q), -loss, rel)
    return PrivacyLossDistribution(remove.pmf(), add.pmf())


def pld_from_pair(log_p, log_q, d: float = PLD_DISCRETIZATION, pessimistic: bool = True,
                  rel: float = 0.0):
    """The PLD of (P, Q) given as log probabilities over a common support (both directions:
    remove = loss of P over Q under P, add = of Q over P under Q). ``rel`` bounds the
    relative error of the probabilities (added to the infinite loss when pessimistic)."""
    log_p, log_q = np.asarray(log_p, float).ravel(), np.asarray(log_q, float).ravel()
    if log_p.shape != log_q.shape:
        raise ValueError(f"log_p and log_q must share one support, got {log_p.shape} vs {log_q.shape}")
    with np.errstate(invalid="ignore"):
        loss = np.where(np.isneginf(log_q), np.inf,
                        np.where(np.isneginf(log_p), -np.inf, log_p - log_q))
    return pld_from_chunks([(log_p, log_q, loss, rel)], d, pessimistic)


@functools.lru_cache(maxsize=256)
def round_pld(bound, eps0: float, n: int, d: float = PLD_DISCRETIZATION):
    """The pessimistic PLD of one shuffled round under ``bound`` (which must have a
    dominating pair); cached per (bound, eps0, n): a ledger asks at every check.
    Raises PairTooLarge where the pair is too big to build in seconds."""
    chunks = getattr(bound, "dominating_pair_chunks", None)
    if chunks is not None:
        return pld_from_chunks(chunks(eps0, n), d)
    log_p, log_q = bound.dominating_pair(eps0, n)
    return pld_from_pair(log_p, log_q, d, rel=float(getattr(bound, "pair_rtol", _PAIR_RTOL)))


def composed_eps(pld, rounds: int, delta: float) -> float:
    """eps at ``delta`` of ``rounds`` self-compositions of ``pld``."""
    return float(pld.self_compose(int(rounds)).get_epsilon_for_delta(float(delta)))

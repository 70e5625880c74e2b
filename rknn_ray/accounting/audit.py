"""Empirical privacy audit of shuffled randomizers, and simulated labeling error.

Audit: run the shuffled randomizer on two neighbouring datasets many times, apply the
optimal test, and turn the observed rejection rates into a *certified* lower bound on
eps with Clopper-Pearson intervals (Jagielski et al. 2020 / Nasr et al. 2021 style):

    eps_lb = log((P0_lo(S) - delta) / P1_hi(S)),

which holds with confidence 1 - alpha.  It must lie below every claimed upper bound;
if it does not, the bound (or the implementation) is wrong -- the output flags it.

The randomizer audited is ``binary_rr`` -- binary randomized response written here
(it is the canonical eps0-LDP randomizer and the worst case of the lower bound).  The
shuffled multiset of n binary reports is exactly its count of ones, so simulating the
count (binomials) *is* running the shuffled randomizer, vectorised over trials.
Neighbouring datasets: user 1 holds 0 vs 1, the other n-1 users hold 1.  The test
rejects when the count of zeros is >= a threshold (likelihood ratio is monotone in
it); the threshold is chosen on a separate half of the trials.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Two-sided (1 - alpha) Clopper-Pearson interval for a binomial proportion."""
    lo = 0.0 if k == 0 else float(stats.beta.ppf(alpha / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(stats.beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lo, hi


def binary_rr_shuffled_zero_counts(first_bit: int, n: int, eps0: float, trials: int,
                                   rng: np.random.Generator) -> np.ndarray:
    """Count of 0-reports in the shuffled output of n binary-RR users (others hold 1)."""
    keep = math.exp(eps0) / (math.exp(eps0) + 1.0)
    flip = 1.0 - keep
    others = rng.binomial(n - 1, flip, size=trials)          # others hold 1: report 0 w.p. flip
    p_first_zero = keep if first_bit == 0 else flip
    return others + (rng.random(trials) < p_first_zero)


@dataclass
class AuditResult:
    n: int
    eps0: float
    delta: float
    trials: int
    threshold: int
    p0_hat: float
    p1_hat: float
    eps_lower_empirical: float
    claimed_upper: dict
    red_flags: list
    confidence: float

    def to_dict(self) -> dict:
        return asdict(self)


def audit_binary_rr(n: int, eps0: float, delta: float, claimed_upper: dict,
                    trials: int = 1_000_000, alpha: float = 0.05,
                    rng: np.random.Generator | None = None) -> AuditResult:
    """Empirical lower bound on the shuffled eps of binary RR vs claimed upper bounds."""
    rng = rng or np.random.default_rng()
    half = trials // 2
    c0 = binary_rr_shuffled_zero_counts(0, n, eps0, trials, rng)
    c1 = binary_rr_shuffled_zero_counts(1, n, eps0, trials, rng)
    # choose the threshold on the first half: maximise the Clopper-Pearson lower bound
    # there (a point estimate would pick noisy extreme tails)
    a0, a1 = c0[:half], c1[:half]
    cands = np.unique(np.quantile(a0, np.linspace(0.3, 0.9999, 80)).astype(np.int64))
    best_t, best_v = int(cands[0]), -np.inf
    for t in cands:
        lo0, _ = clopper_pearson(int(np.sum(a0 >= t)), half, alpha / 2)
        _, hi1 = clopper_pearson(int(np.sum(a1 >= t)), half, alpha / 2)
        if lo0 > delta and hi1 > 0:
            v = math.log((lo0 - delta) / hi1)
            if v > best_v:
                best_t, best_v = int(t), v
    b0, b1 = c0[half:], c1[half:]
    k0, k1 = int(np.sum(b0 >= best_t)), int(np.sum(b1 >= best_t))
    m = b0.size
    p0_lo, _ = clopper_pearson(k0, m, alpha / 2)
    _, p1_hi = clopper_pearson(k1, m, alpha / 2)
    eps_lb = math.log((p0_lo - delta) / p1_hi) if p0_lo > delta and p1_hi > 0 else 0.0
    eps_lb = max(0.0, eps_lb)
    flags = [name for name, ub in claimed_upper.items()
             if ub is not None and eps_lb > ub]
    return AuditResult(n, eps0, delta, trials, best_t, k0 / m, k1 / m, eps_lb,
                       dict(claimed_upper), flags, 1 - alpha)


# ----------------------------------------------------------- BSVS labeling error

def rr_error_bound(eps_local: float, n: int, k: int, r: int, num_classes: int,
                   beta: float = 0.05) -> float:
    """(eta, beta)-accuracy of local RR for BSVS, paper 000 Theorem 1 (sqrt form of its proof).

    eta = (e'+1)/(e'-1) * sqrt(3 n log(|Y|/beta) / (e'+1)),  e' = e^{eps/(2kr)}.
    """
    e = math.exp(eps_local / (2 * k * r))
    return (e + 1) / (e - 1) * math.sqrt(3 * n * math.log(num_classes / beta) / (e + 1))


def simulate_rr_labeling_error(eps_local: float, counts: np.ndarray, n: int, k: int, r: int,
                               trials: int, rng: np.random.Generator) -> float:
    """Fraction of (query, trial) pairs whose argmax label flips under local RR.

    ``counts`` is the true (s, |Y|) BSVS count matrix of n one-record clients; each bit
    of each client's answer is flipped w.p. q = 1/(e^{eps/(2kr)}+1), so a cell's
    reported ones are Bin(c, 1-q) + Bin(n-c, q) -- exact, simulated per cell.
    """
    q = 1.0 / (math.exp(eps_local / (2 * k * r)) + 1.0)
    c = np.broadcast_to(counts, (trials,) + counts.shape)
    ones = rng.binomial(c, 1 - q) + rng.binomial(n - c, q)
    est = (ones - n * q) / (1 - 2 * q)
    truth = np.argmax(counts, axis=1)
    return float(np.mean(np.argmax(est, axis=2) != truth[None, :]))

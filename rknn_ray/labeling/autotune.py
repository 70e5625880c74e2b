"""Choosing s (queries) and k (neighbours per record) from public information only.

Inputs: the number of private records n (a count the protocol already discloses),
r, the privacy parameters through the mechanism's noise standard deviation per
count, the number of public samples and classes. No private record and no public
label is read, so the choice itself costs no privacy.

The rule. A query receives on average mu = n*k*r/s votes; the mechanism adds noise
of standard deviation sigma(k) per count, and for the additive mechanisms sigma
grows linearly in k (sensitivity 2kr), so the per-query signal-to-noise ratio
mu/sigma = n*r/(s*sigma(1)) does not depend on k. The released counts are then
smoothed over up to ``smooth_neighbours`` public neighbours (rknn_ray.labeling.denoise), which
averages about q = max(1, m*s/N) distinct queries and multiplies the ratio by sqrt(q).
We take the largest s (finer clusters give purer labels) whose ratio *after*
smoothing reaches ``target_snr``, clipped to [max(|Y|, 10), number of public samples]; a
mechanism whose noise dominates even there gets s = |Y|. A local randomizer's sigma is its
exact per-report variances summed (rknn_ray.mechanisms.stage.noise_std_per_count), not its
error bound: Collision's Theorem 2 bound grows with its domain l and, read as a std, had sent
single-message Collision on Fashion-MNIST to s = |Y| (student 0.61), where the variances give
s in the hundreds (0.84 with every record reporting, issue 47).
Then k: each smoothed label should rest on about ``votes`` records so that its majority
is stable. Smoothing already pools the q = max(1, m*s/N) queries its neighbours belong
to, so k = ceil(votes*s/(n*r*q)), clipped to [1, max_k] (k > 1 spreads each record's
vote to its k nearest queries, a kernel over the query graph, at k times the noise).

The constants were fitted on Fashion-MNIST labels (HOG + PCA-64, 3 noise draws, the
sweep in README "Utility"): target 8 with m <= 10 picks s = 5000, k = 1 at eps = 1
(labels 0.855, student 0.854, median of 3 seeds; k = 3, the rule before smoothing
counted, gave labels 0.848 and student 0.855) and s ~ 260, k = 1 at eps = 0.1 (0.82,
where the old rule's s = 1041 gave 0.80).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AutoChoice:
    s: int
    k: int
    reason: str

    def to_dict(self) -> dict:
        return {"s": self.s, "k": self.k, "reason": self.reason}


def choose_s_k(num_records: int, num_public: int, num_classes: int, noise_std_k1: float,
               r: int = 1, target_snr: float = 8.0, votes: float = 30.0, max_k: int = 5,
               smooth_neighbours: int = 10,
               fixed_s: int | None = None, fixed_k: int | None = None,
               max_s: tuple[int, str] | None = None) -> AutoChoice:
    """(s, k) and a one-line reason; ``noise_std_k1`` is the noise std per count at k = 1.

    ``fixed_s`` / ``fixed_k``: a value the config fixed (only the other one is chosen).
    ``max_s``: (cap, why) from a cost outside the noise (the multi-message protocol's
    messages per client), applied to a chosen s.
    Monotone: a larger eps (smaller noise) never gives a smaller s.
    """
    n = max(1, int(num_records))
    # at least one query per class: where the noise dominates even there (single-message
    # Collision or randomized response, whose per-count error does not shrink with s) the
    # fewest queries, |Y|, give each the most votes
    min_s = min(num_public, max(num_classes, 10))
    m = max(1, int(smooth_neighbours))
    if fixed_s is not None:
        s = int(fixed_s)
        why_s = f"s = {s} fixed by the config"
    elif noise_std_k1 <= 0:
        s = int(num_public)
        why_s = f"no noise: s = every public sample ({s})"
    else:
        s_snr = smoothed_snr_limit(n * r / noise_std_k1, num_public, m, target_snr)
        s = int(max(min_s, min(num_public, math.floor(s_snr))))
        why_s = (f"largest s with per-query SNR n*r/(s*sigma) * sqrt(max(1, m*s/N)) >= "
                 f"{target_snr:g} (smoothing over m <= {m} of N = {num_public} public "
                 f"neighbours): n={n}, sigma(k=1)={noise_std_k1:.3g} -> {s_snr:.0f}, "
                 f"clipped to [{min_s}, {num_public}] -> s = {s}")
        if max_s is not None and s > max_s[0]:
            s = int(max(1, max_s[0]))
            why_s += f"; capped at s = {s}: {max_s[1]}"
    if fixed_k is not None:
        k = int(fixed_k)
        why_k = f"k = {k} fixed by the config"
    else:
        q = max(1.0, m * s / max(1, num_public))     # distinct queries one smoothed label pools
        k = int(max(1, min(max_k, s, math.ceil(votes * s / (n * r * q)))))
        why_k = (f"~{votes:g} votes behind each smoothed label (pooling q = max(1, m*s/N) = "
                 f"{q:.3g} queries): k = ceil({votes:g}*s/(n*r*q)) in [1, {max_k}] -> k = {k}")
    return AutoChoice(s, k, f"{why_s}; {why_k}")


def smoothed_snr_limit(signal: float, num_public: int, m: int, target: float) -> float:
    """Largest s with (signal/s) * sqrt(max(1, m*s/N)) >= target (signal = n*r/sigma).

    Without smoothing gains (m*s <= N) that is s = signal/target; where the m neighbours
    span several queries (m*s > N) the ratio is signal*sqrt(m/(s*N)), which reaches the
    target up to s = m*signal^2/(N*target^2). The ratio falls with s on both pieces.
    """
    s_plain = signal / target
    if m * s_plain <= num_public:
        return s_plain
    return max(num_public / m, m * signal ** 2 / (num_public * target ** 2))

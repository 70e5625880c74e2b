"""A PLD's delta(eps) on a sorted grid of eps, as dp_accounting's own vectorised call gives it.

``PrivacyLossDistribution.get_delta_for_epsilon(array)`` (dp_accounting 0.4-0.6) walks the
losses and the grid in one Python loop, O(losses + grid) interpreted steps: at a composed
multi-message PLD and :func:`rknn_ray.accounting.accountants.eps_with_failure`'s 2049-point
grid, seconds per call. :func:`grid_deltas` computes the same sums with numpy: the loop's
running sums (``inf_mass + p_top + p_next + ...`` and ``sum p_i e^{-l_i}``, top loss first)
are sequential cumulative sums in the same order (``np.cumsum`` adds left to right), read at
each eps's count of losses above it, so the values are the loop's, bit for bit (a test
compares them on real PLDs). Dense pmfs only (what the project builds); anything else goes
to the library's call.
"""
from __future__ import annotations

import numpy as np


def _dense_deltas(pmf, es: np.ndarray):
    """The loop's deltas for one dense pmf (None where ``pmf`` is not one)."""
    needed = ("_probs", "_lower_loss", "_discretization", "_infinity_mass", "size")
    if type(pmf).__name__ != "DensePLDPmf" or not all(hasattr(pmf, a) for a in needed):
        return None
    probs = np.asarray(pmf._probs, dtype=np.float64)
    losses = (np.arange(pmf.size) + pmf._lower_loss) * pmf._discretization
    top = slice(None, None, -1)
    upper = np.cumsum(np.concatenate(([pmf._infinity_mass], probs[top])))
    lower = np.cumsum(np.concatenate(([0.0], (probs * np.exp(-losses))[top])))
    above = probs.size - np.searchsorted(losses, es, side="right")   # losses > eps
    return upper[above] - np.exp(es) * lower[above]


def grid_deltas(pld, es) -> np.ndarray:
    """``pld.get_delta_for_epsilon(es)`` for a sorted, finite grid ``es``: the larger of the
    two directions' hockey-stick divergences (one, where the PLD is symmetric)."""
    es = np.asarray(es, dtype=np.float64)
    if es.ndim != 1 or not np.all(np.isfinite(es)) or np.any(np.diff(es) < 0):
        return np.asarray(pld.get_delta_for_epsilon(es))
    pmfs = [getattr(pld, "_pmf_remove", None)]
    if not getattr(pld, "_symmetric", True):
        pmfs.append(getattr(pld, "_pmf_add", None))
    out = [_dense_deltas(p, es) for p in pmfs]
    if any(d is None for d in out):
        return np.asarray(pld.get_delta_for_epsilon(es))
    return out[0] if len(out) == 1 else np.maximum(out[0], out[1])

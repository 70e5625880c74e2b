"""The release of each baseline system as a *standard* event: what happened, no computed eps.

Each builder returns a dp_accounting event (self-composition of Laplace / Gaussian /
Poisson-sampled Gaussian steps) or one of the project's parameter-only events
(rknn_ray.accounting.events: ``SubsampleDpEvent`` for FedMD-NFDP's subsample,
``SelectiveRRDpEvent`` for DP-DFD's restricted randomized response). What a release
costs is the accountant's answer (rknn_ray.accounting.accountants.event_cost) under
the choices recorded beside the event (``Costing``: the delta it is stated at, rdp or
pld): a baseline's reported eps is that cost, never a number carried in the event.
"""
from __future__ import annotations

import math

from dp_accounting import dp_event

from rknn_ray.accounting.events import SelectiveRRDpEvent, SubsampleDpEvent


def lnmax_event(scale: float, num_queries: int):
    """PATE LNMax: per query, two unit-sensitivity Laplace mechanisms of scale ``scale``
    (add/remove-one record moves one teacher's vote: +1 in one class, -1 in another)."""
    return dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(float(scale)), 2 * int(num_queries))


def gnmax_event(sigma: float, num_queries: int):
    """PATE GNMax: per query a Gaussian of std ``sigma`` on an L2-sensitivity-sqrt(2) vote."""
    return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(float(sigma) / math.sqrt(2.0)),
                                        int(num_queries))


def private_knn_event(gamma: float, sigma: float, num_queries: int):
    """Private-kNN: per query a Poisson subsample (rate ``gamma``) of the records votes,
    Gaussian noise ``sigma`` on an L2-sensitivity-sqrt(2) histogram."""
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(float(gamma),
                                       dp_event.GaussianDpEvent(float(sigma) / math.sqrt(2.0))),
        int(num_queries))


def dpsgd_event(q: float, sigma: float, steps: int):
    """DP-SGD: ``steps`` Poisson-sampled (rate ``q``) Gaussian steps, noise multiplier ``sigma``."""
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(float(q), dp_event.GaussianDpEvent(float(sigma))), int(steps))


def nfdp_event(k: int, n: int, replacement: bool = True) -> SubsampleDpEvent:
    """FedMD-NFDP: a party trains on a ``k``-subsample of its ``n`` records."""
    return SubsampleDpEvent(int(k), int(n), bool(replacement))


def selective_rr_event(eps: float, num_queries: int, min_candidates: int,
                       max_candidates: int) -> SelectiveRRDpEvent:
    """DP-DFD: restricted randomized response with parameter ``eps`` on every query's label."""
    return SelectiveRRDpEvent(float(eps), int(num_queries), int(min_candidates),
                              int(max_candidates))

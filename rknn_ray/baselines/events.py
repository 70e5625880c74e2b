"""Ledger events of the baseline systems (rknn_ray.baselines).

Each event keeps the mechanism's own parameters *and* the (eps, delta) its paper's
accounting gives for the whole release (RDP through ``dp_accounting`` for PATE,
Private-kNN and DP-SGD; closed forms for FedMD-NFDP and selective randomized
response). They subclass :class:`~rknn_ray.accounting.events.ApproxDpEvent`, so the
project's accountants (``basic``, ``pld``) cost them at that stated (eps, delta)
without any change to rknn_ray.accounting, and ``event_to_dict`` writes every
parameter. Composition *inside* one release (the queries of PATE, the steps of
DP-SGD) is done by the baseline's accountant before the event is built; the ledger
composes releases with each other.
"""
from __future__ import annotations

import attr

from rknn_ray.accounting.events import ApproxDpEvent


@attr.s(frozen=True, slots=True, auto_attribs=True)
class NfdpSubsampleDpEvent(ApproxDpEvent):
    """FedMD-NFDP (paper 003): a party trains only on a k-subsample of its n records.

    eps, delta from Theorem 2 (with replacement: k ln((n+1)/n), 1-((n-1)/n)^k) or
    Theorem 1 (without: ln((n+1)/(n+1-k)), k/n), natural log; add/remove-one record.
    """
    k: int = 0
    n: int = 0
    replacement: bool = True


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SelectiveRRDpEvent(ApproxDpEvent):
    """DP-DFD (paper 004): one label per query through randomized response restricted to a
    candidate set of ``min_candidates``..``max_candidates`` classes; eps-label-DP per query
    (each query's label is released once, so queries compose in parallel)."""
    num_queries: int = 0
    min_candidates: int = 0
    max_candidates: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PateDpEvent(ApproxDpEvent):
    """PATE noisy argmax over teacher votes: ``aggregator`` 'lnmax' (Laplace, scale
    ``noise``) or 'gnmax' (Gaussian, std ``noise``), ``num_queries`` answered queries,
    ``num_teachers`` teachers on disjoint partitions; (eps, delta) from RDP."""
    aggregator: str = "gnmax"
    noise: float = 0.0
    num_queries: int = 0
    num_teachers: int = 0
    data_dependent: bool = False


@attr.s(frozen=True, slots=True, auto_attribs=True)
class PrivateKnnDpEvent(ApproxDpEvent):
    """Private-kNN: per query a Poisson subsample (rate ``sampling_rate``) of the private
    records, the ``k`` nearest of them vote, Gaussian noise ``sigma``; RDP over queries."""
    sampling_rate: float = 0.0
    sigma: float = 0.0
    k: int = 0
    num_queries: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DpSgdDpEvent(ApproxDpEvent):
    """DP-SGD: ``steps`` Poisson-sampled (rate ``sampling_rate``) Gaussian steps with noise
    multiplier ``noise_multiplier`` on per-example gradients clipped to ``clip``."""
    sampling_rate: float = 0.0
    noise_multiplier: float = 0.0
    steps: int = 0
    clip: float = 1.0
    accountant: str = "rdp"


BASELINE_EVENTS = (NfdpSubsampleDpEvent, SelectiveRRDpEvent, PateDpEvent, PrivateKnnDpEvent,
                   DpSgdDpEvent)


def baseline_event_from_dict(d: dict):
    """Rebuild a baseline event from :func:`rknn_ray.accounting.events.event_to_dict` output."""
    known = {c.__name__: c for c in BASELINE_EVENTS}
    if d.get("type") not in known:
        raise ValueError(f"not a baseline event: {d.get('type')!r}")
    return known[d["type"]](**{k: v for k, v in d.items() if k != "type"})

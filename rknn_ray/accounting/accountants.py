"""Accountants: turn the events of a ledger into one (eps, delta).

* ``basic``: each event's own (eps, delta) (:func:`event_cost`), summed. Exact for
  pure DP, valid for any events.
* ``pld``: privacy-loss-distribution composition with ``dp_accounting``: exact PLDs
  for (discrete) Laplace events, the generic (eps, delta) PLD of an event's own cost
  otherwise (the worst mechanism with that guarantee); pessimistic discretisation,
  so the result is an upper bound. Never reported above ``basic``.

:func:`event_cost` is where the shuffle amplification bounds and the multi-message
accounting interpret their events. Every accountant passes the conformance suite in
tests/test_accountants.py.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod

from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from rknn_ray.accounting.events import (ApproxDpEvent, LocalRandomizerDpEvent, MultiMessageShuffleDpEvent,
                                        ShuffledLocalDpEvent)

PLD_DISCRETIZATION = 1e-4


class UnknownEventError(TypeError):
    """An event no accountant here knows how to cost."""


def event_cost(event) -> tuple[float, float]:
    """(eps, delta) of one event on its own."""
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return float(event.noise_parameter * event.sensitivity), 0.0
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1.0 / float(event.noise_multiplier), 0.0
    if isinstance(event, LocalRandomizerDpEvent):
        return float(event.eps), 0.0
    if isinstance(event, ApproxDpEvent):
        return float(event.eps), float(event.delta)
    if isinstance(event, ShuffledLocalDpEvent):
        from rknn_ray.accounting.bounds import BOUNDS
        eps = BOUNDS[event.bound].central_eps(event.eps0, int(event.num_senders), event.delta) \
            if int(event.num_senders) >= 2 else math.inf
        if not eps < event.eps0:         # each record's own report is eps0-LDP regardless
            return float(event.eps0), 0.0
        return float(eps), float(event.delta)
    if isinstance(event, MultiMessageShuffleDpEvent):
        from rknn_ray.accounting.multi_message import protocol_eps
        return float(protocol_eps(event.dlap_p, event.flood_mean_total, event.sensitivity_l1,
                                  event.delta, event.flood_shape)), \
            float(event.delta + event.cap_failure)
    if isinstance(event, dp_event.ComposedDpEvent):
        costs = [event_cost(e) for e in event.events]
        return sum(c[0] for c in costs), min(1.0, sum(c[1] for c in costs))
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0, 0.0
    raise UnknownEventError(f"no accountant knows {type(event).__name__}; add it to "
                            "rknn_ray.accounting.accountants.event_cost")


class Accountant(ABC):
    """Consumes events; reports the composed (eps, delta) at a target delta."""
    name = "abstract"

    @abstractmethod
    def compose(self, events: list, target_delta: float) -> tuple[float, float]:
        """(eps, delta) of all ``events`` together (delta <= target where the method allows)."""


class BasicAccountant(Accountant):
    name = "basic"

    def compose(self, events: list, target_delta: float = 0.0) -> tuple[float, float]:
        costs = [event_cost(e) for e in events]
        return sum(c[0] for c in costs), min(1.0, sum(c[1] for c in costs))


def event_pld(event):
    """The PLD of one event: exact for (discrete) Laplace, generic from its cost otherwise."""
    if isinstance(event, dp_event.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(event.noise_multiplier, sensitivity=1,
                                              value_discretization_interval=PLD_DISCRETIZATION)
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(
            event.noise_parameter, sensitivity=event.sensitivity,
            value_discretization_interval=PLD_DISCRETIZATION)
    eps, delta = event_cost(event)
    if eps == 0 and delta == 0:
        return None
    return pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps, delta),
                                           value_discretization_interval=PLD_DISCRETIZATION)


class PLDAccountant(Accountant):
    name = "pld"

    def compose(self, events: list, target_delta: float) -> tuple[float, float]:
        basic = BasicAccountant().compose(events)
        total = None
        for e in events:
            pld = event_pld(e)
            if pld is not None:
                total = pld if total is None else total.compose(pld)
        if total is None:
            return 0.0, 0.0
        target = max(float(target_delta), 1e-12)
        eps = float(total.get_epsilon_for_delta(target))
        if not math.isfinite(eps):      # target below the events' own deltas: PLD says nothing
            return basic
        if basic[0] <= eps and basic[1] <= target:      # basic is tighter here: report it
            return basic
        return eps, target


ACCOUNTANTS = {"basic": BasicAccountant, "pld": PLDAccountant}


def get_accountant(name: str) -> Accountant:
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; use one of {sorted(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]()

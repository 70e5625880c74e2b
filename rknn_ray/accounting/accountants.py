"""Accountants: the only place an (eps, delta) is computed from what happened.

An event says what a release is (rknn_ray.accounting.events); :func:`event_cost` says what
it costs under the accountant's choices (:class:`Costing`, recorded beside the event,
never in it: the amplification bound, the delta a non-pure event is stated at, rdp/pld).
A mechanism's guarantee and a baseline's reported eps are this cost; the ledgers compose
it. A ledger item is an event or an (event, Costing) pair.

* ``basic``: each event's own (eps, delta) (:func:`event_cost`), summed. Exact for
  pure DP, valid for any events.
* ``pld``: privacy-loss-distribution composition with ``dp_accounting``: exact PLDs
  for (discrete) Laplace events, the PLD of the amplification bound's dominating pair
  for a single-message shuffle round (rknn_ray.accounting.shuffle_pld: T rounds cost
  the composed pair, not T times a round's eps), the protocol's exact PLD for a
  multi-message shuffle round (rknn_ray.accounting.multi_message.protocol_pld, with its
  message cap's failure mass carried beside it: :class:`Composition`), the generic
  (eps, delta) PLD of an event's own cost otherwise (the worst mechanism with that
  guarantee); pessimistic discretisation, so the result is an upper bound. Never
  reported above ``basic``.

:func:`event_cost` is where the shuffle amplification bounds and the multi-message
accounting interpret their events. Every accountant passes the conformance suite in
tests/test_accountants.py.
"""
from __future__ import annotations

import functools
import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass

import numpy as np

from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from rknn_ray.accounting.bound_choice import round_bound, upper_bound_names
from rknn_ray.accounting.events import (ApproxDpEvent, LocalRandomizerDpEvent, MultiMessageShuffleDpEvent,
                                        SelectiveRRDpEvent, ShuffledLocalDpEvent, SubsampleDpEvent)
from rknn_ray.accounting.multi_message import protocol_eps, protocol_pld
from rknn_ray.accounting.pld_deltas import grid_deltas
from rknn_ray.accounting.shuffle_pld import PairTooLarge, round_pld

PLD_DISCRETIZATION = 1e-4
DEFAULT_BOUND = "clones_numerical"
#: RDP orders of every RDP conversion (dp_accounting's default grid, extended).
RDP_ORDERS = tuple([1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64)) +
                   [64, 80, 96, 128, 192, 256, 512, 1024])
APPROX_METHODS = ("rdp", "pld")


class UnknownEventError(TypeError):
    """An event no accountant here knows how to cost."""


@dataclass(frozen=True)
class Costing:
    """The accountant's choices for one release, recorded beside its event, never in it.

    ``bound``: the amplification upper bound a single-message shuffle event is costed
    with (any upper bound is valid; the mechanism calibrated eps0 with this one).
    ``delta``: the delta an event with no pure-DP cost (Gaussian, sampled Gaussian) is
    stated at; 0 = pure DP only. ``method``: how such an event is converted ("rdp":
    dp_accounting's RdpAccountant; "pld": its PLDAccountant). An event with a pure cost
    is stated at the smaller of that and its approximate cost (when ``delta`` > 0).
    """
    bound: str = DEFAULT_BOUND
    delta: float = 0.0
    method: str = "rdp"

    def __post_init__(self):
        if self.method not in APPROX_METHODS:
            raise ValueError(f"costing method must be one of {APPROX_METHODS}, got {self.method!r}")
        if not 0 <= self.delta < 1:
            raise ValueError(f"costing delta must be in [0, 1), got {self.delta}")

    def to_dict(self) -> dict:
        return asdict(self)

    def shown_for(self, event) -> dict:
        """The choices ``event``'s cost reads (what report.json shows beside it): the bound
        only for a shuffled single-message event, rdp/pld only when stated at a delta. A
        central or local guarantee named a shuffle bound it never used (issue 57). Reading
        the dict back (:meth:`from_dict`) gives the same cost: the rest are defaults."""
        out = {"delta": self.delta}
        if _reads_bound(event):
            out["bound"] = self.bound
        if self.delta > 0:
            out["method"] = self.method
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "Costing":
        return cls() if not d else cls(**d)


DEFAULT_COSTING = Costing()


def _reads_bound(event) -> bool:
    """Whether an amplification bound prices ``event`` (or one it composes)."""
    if isinstance(event, ShuffledLocalDpEvent):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_reads_bound(e) for e in event.events)
    inner = getattr(event, "event", None)          # self-composed, sampled, ...
    return inner is not None and _reads_bound(inner)


def rdp_epsilon(event, delta: float, orders=RDP_ORDERS) -> float:
    """eps at ``delta`` of a dp_accounting event under add/remove-one (RdpAccountant)."""
    import logging  # only to quiet absl's warning below

    from dp_accounting.rdp import rdp_privacy_accountant as rdp  # defers the RDP accountant
    # orders whose series does not converge are skipped by dp_accounting (a logged warning)
    logging.getLogger("absl").setLevel(logging.ERROR)
    acc = rdp.RdpAccountant(list(orders))
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def pld_epsilon(event, delta: float) -> float:
    """eps at ``delta`` of a dp_accounting event (PLD accountant, add/remove-one)."""
    from dp_accounting.pld import pld_privacy_accountant as pld  # defers the PLD accountant
    acc = pld.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def subsample_epsilon_delta(k: int, n: int, replacement: bool = True,
                            log=math.log) -> tuple[float, float]:
    """(eps, delta) of training on a k-subsample of n records (FedMD-NFDP, paper 003):
    Theorem 2 (with replacement) or Theorem 1 (without), natural log; add/remove-one."""
    if n < 1 or k < 0:
        raise ValueError(f"need n >= 1 and k >= 0, got n={n}, k={k}")
    if replacement:
        return k * log((n + 1) / n), 1.0 - ((n - 1) / n) ** k
    if k > n:
        raise ValueError(f"without replacement k={k} cannot exceed n={n}")
    return log((n + 1) / (n + 1 - k)), k / n


def _pure_eps(event) -> float | None:
    """The pure-DP eps of an event that has one (None: it has none, or is not known here)."""
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return float(event.noise_parameter * event.sensitivity)
    if isinstance(event, dp_event.LaplaceDpEvent):
        return 1.0 / float(event.noise_multiplier)
    if isinstance(event, (LocalRandomizerDpEvent, SelectiveRRDpEvent)):
        return float(event.eps)
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = _pure_eps(event.event)
        return None if inner is None else int(event.count) * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [_pure_eps(e) for e in event.events]
        return None if any(p is None for p in parts) else float(sum(parts))
    return None


#: dp_accounting events its RDP and PLD accountants convert at a delta (nested freely)
_LIBRARY = (dp_event.GaussianDpEvent, dp_event.LaplaceDpEvent, dp_event.PoissonSampledDpEvent,
            dp_event.SelfComposedDpEvent, dp_event.ComposedDpEvent)


def _library_event(event) -> bool:
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _library_event(event.event)
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return _library_event(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return all(_library_event(e) for e in event.events)
    return isinstance(event, (dp_event.GaussianDpEvent, dp_event.LaplaceDpEvent))


@functools.lru_cache(maxsize=1024)
def _amplified(bound, eps0: float, n: int, delta: float) -> float:
    """``bound.central_eps`` once per (bound, eps0, n, delta): a round's one shuffle event is
    costed at its check, its record and every later check (each a root finding)."""
    return bound.central_eps(eps0, n, delta)


def event_cost(event, costing: Costing = DEFAULT_COSTING) -> tuple[float, float]:
    """(eps, delta) of one event on its own, under the accountant's ``costing`` choices."""
    pure = _pure_eps(event)
    if costing.delta > 0 and _library_event(event):
        convert = rdp_epsilon if costing.method == "rdp" else pld_epsilon
        approx = convert(event, costing.delta)
        if pure is None or approx < pure:
            return float(approx), float(costing.delta)
    if pure is not None:
        return pure, 0.0
    if isinstance(event, ApproxDpEvent):
        return float(event.eps), float(event.delta)
    if isinstance(event, ShuffledLocalDpEvent):
        eps = _amplified(_round_bound(event, costing), float(event.eps0), int(event.num_senders),
                         float(event.delta)) if int(event.num_senders) >= 2 else math.inf
        if not eps < event.eps0:         # each record's own report is eps0-LDP regardless
            return float(event.eps0), 0.0
        return float(eps), float(event.delta)
    if isinstance(event, MultiMessageShuffleDpEvent):
        return float(protocol_eps(event.dlap_p, event.flood_mean_total, event.sensitivity_l1,
                                  event.delta, event.flood_shape)), \
            float(event.delta + event.cap_failure)
    if isinstance(event, SubsampleDpEvent):
        return subsample_epsilon_delta(int(event.k), int(event.n), bool(event.replacement))
    if isinstance(event, dp_event.ComposedDpEvent):
        costs = [event_cost(e, costing) for e in event.events]
        return sum(c[0] for c in costs), min(1.0, sum(c[1] for c in costs))
    if _library_event(event):
        raise UnknownEventError(f"{type(event).__name__} has no pure-DP cost: state it at a "
                                "delta (Costing(delta=...) beside the event) so that "
                                "rknn_ray.accounting.accountants.event_cost converts it")
    raise UnknownEventError(f"no accountant knows {type(event).__name__}; add it to "
                            "rknn_ray.accounting.accountants.event_cost")


def as_costed(item) -> tuple[object, Costing]:
    """(event, costing) of a ledger item: a bare event (default choices) or such a pair."""
    if isinstance(item, tuple):
        event, costing = item
        return event, costing or DEFAULT_COSTING
    return item, DEFAULT_COSTING


class Accountant(ABC):
    """Consumes events; reports the composed (eps, delta) at a target delta."""
    name = "abstract"

    @abstractmethod
    def compose(self, events: list, target_delta: float) -> tuple[float, float]:
        """(eps, delta) of all ``events`` together (delta <= target where the method allows)."""


class BasicAccountant(Accountant):
    name = "basic"

    def compose(self, events: list, target_delta: float = 0.0) -> tuple[float, float]:
        return Composition("basic").extend(events).result(target_delta)


def _round_bound(event: ShuffledLocalDpEvent, costing: Costing):
    """The upper bound ``costing.bound`` as it applies to the event's randomizer."""
    if costing.bound not in upper_bound_names():
        raise UnknownEventError(f"amplification bound {costing.bound!r} is not an upper bound; "
                                f"cost shuffle events with one of {list(upper_bound_names())}")
    return round_bound(costing.bound, event.local_mechanism, int(event.collision_c),
                       int(event.collision_l), int(event.rr_kr), int(event.rr_d))


def shuffled_round_pld(event: ShuffledLocalDpEvent, costing: Costing = DEFAULT_COSTING):
    """The PLD of a single-message shuffle round under ``costing.bound``'s dominating pair
    (rknn_ray.accounting.shuffle_pld), or None where there is none to use: the bound names
    no pair, too few senders, or a pair too large to build in seconds (then the round is
    composed by its (eps, delta) cost, which is sound too)."""
    bound = _round_bound(event, costing)
    if not getattr(bound, "has_pair", False) or int(event.num_senders) < 2:
        return None
    try:
        return round_pld(bound, float(event.eps0), int(event.num_senders), PLD_DISCRETIZATION)
    except PairTooLarge:
        return None


@functools.lru_cache(maxsize=32)
def _multi_message_pld(p: float, mu: float, sensitivity_l1: int, flood_shape: float):
    """The protocol's PLD at the accountant's interval (a ledger costs a round at its check,
    its record and on every read)."""
    return protocol_pld(p, mu, sensitivity_l1, flood_shape, PLD_DISCRETIZATION)


def cap_failure_mass(event) -> float:
    """phi: the probability that the message cap changes a multi-message round's output (0
    for every other event; and for rounds that record no ``cap_failure``).

    The cap drops an honest client's noise beyond its allowance, an event that depends on
    the noise alone (never on the data); each of the n clients was given the failure
    probability cap_failure / ((1 + e^eps) n), eps the one the cap was sized with (the
    event's ``cap_eps``; an event written before that was recorded: ``event_cost``'s,
    the same calibration recomputed identically),
    so phi <= cap_failure / (1 + e^eps). Capped (M) and uncapped (M') outputs coincide
    off that event, so for any set S, P[M(D) in S] <= P[M'(D) in S] + phi and
    P[M(D') in S] >= P[M'(D') in S] - phi: H_E(M(D) || M(D')) <= H_E(M'(D) || M'(D'))
    + (1 + e^E) phi at every E, in both directions. Over rounds (adaptive too: each
    round's noise is fresh) the outputs coincide unless some round fails, probability
    <= sum of phi_t, so the composed capped rounds cost delta_PLD(E) + (1 + e^E) sum phi_t,
    delta_PLD the composition of the uncapped protocol's PLDs (:func:`event_pld`)."""
    if not isinstance(event, MultiMessageShuffleDpEvent) or not event.cap_failure > 0:
        return 0.0
    # the eps the cap was sized with, as recorded; an older event's own eps, recomputed
    eps = float(event.cap_eps) if event.cap_eps > 0 else event_cost(event)[0]
    return float(event.cap_failure) / (1.0 + math.exp(min(eps, 700.0)))


def event_pld(item):
    """The PLD of one event: exact for (discrete) Laplace, the amplification bound's
    dominating pair for a single-message shuffle round (when it names one), the uncapped
    protocol's exact PLD for a multi-message round (its cap's failure mass is
    :func:`cap_failure_mass`: whoever composes it must carry that too, as
    :class:`Composition` does), generic from its cost otherwise."""
    event, costing = as_costed(item)
    if isinstance(event, MultiMessageShuffleDpEvent):
        return _multi_message_pld(float(event.dlap_p), float(event.flood_mean_total),
                                  int(event.sensitivity_l1), float(event.flood_shape))
    if isinstance(event, ShuffledLocalDpEvent):
        pld = shuffled_round_pld(event, costing)
        if pld is not None:
            return pld
    if isinstance(event, dp_event.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(event.noise_multiplier, sensitivity=1,
                                              value_discretization_interval=PLD_DISCRETIZATION)
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(
            event.noise_parameter, sensitivity=event.sensitivity,
            value_discretization_interval=PLD_DISCRETIZATION)
    eps, delta = event_cost(event, costing)
    if eps == 0 and delta == 0:
        return None
    return pld_lib.from_privacy_parameters(pld_common.DifferentialPrivacyParameters(eps, delta),
                                           value_discretization_interval=PLD_DISCRETIZATION)


class PLDAccountant(Accountant):
    name = "pld"

    def compose(self, events: list, target_delta: float) -> tuple[float, float]:
        return Composition("pld").extend(events).result(target_delta)


class Composition:
    """A running composition by one accountant: each event is costed once, when added.

    A ledger that checks its budget before every round keeps one and adds each release
    to it, so a check costs the new event, not every event again. The result is the
    accountant's ``compose`` of the same events in the same order, to the bit (both are
    this class): ``basic`` sums left to right, ``pld`` composes the PLDs left to right,
    and sums the multi-message rounds' cap failure masses (:func:`cap_failure_mass`) beside
    them: the eps at a delta is then the smallest E with
    delta_PLD(E) + (1 + e^E) * phi <= delta (:func:`eps_with_failure`).
    """

    def __init__(self, accountant: str = "basic"):
        if accountant not in ACCOUNTANTS:
            raise ValueError(f"unknown accountant {accountant!r}; use one of {sorted(ACCOUNTANTS)}")
        self.accountant = accountant
        self.eps, self.delta = 0, 0           # basic: the events' own costs, summed (as sum())
        self.pld = None                        # pld: the composed PLD (None: nothing to compose)
        self.phi = 0.0                         # pld: the summed cap failure masses
        self.events = 0

    def add(self, item) -> "Composition":
        """Compose one more ledger item (an event or an (event, Costing) pair) in place."""
        eps, delta = event_cost(*as_costed(item))
        self.eps, self.delta = self.eps + eps, self.delta + delta
        if self.accountant == "pld":
            pld = event_pld(item)
            if pld is not None:
                self.pld = pld if self.pld is None else self.pld.compose(pld)
            self.phi += cap_failure_mass(as_costed(item)[0])
        self.events += 1
        return self

    def extend(self, items) -> "Composition":
        for item in items:
            self.add(item)
        return self

    def copy(self) -> "Composition":
        """An independent running composition (PLDs are never changed in place)."""
        other = Composition.__new__(Composition)
        other.__dict__.update(self.__dict__)
        return other

    def basic(self) -> tuple[float, float]:
        """The basic composition (sums) of the events added so far."""
        return self.eps, min(1.0, self.delta)

    def pld_eps(self, target_delta: float) -> float:
        """eps at ``target_delta`` of the pld composition alone (cap failures included;
        inf where it says nothing, e.g. nothing to compose)."""
        if self.pld is None:
            return math.inf
        return eps_with_failure(self.pld, float(target_delta), self.phi)

    def result(self, target_delta: float = 0.0) -> tuple[float, float]:
        """(eps, delta) of the events added so far, at ``target_delta`` (pld; basic ignores it)."""
        basic = self.basic()
        if self.accountant == "basic":
            return basic
        if self.pld is None:
            return 0.0, 0.0
        target = max(float(target_delta), 1e-12)
        eps = self.pld_eps(target)
        if not math.isfinite(eps):      # target below the events' own deltas: PLD says nothing
            return basic
        if basic[0] <= eps and basic[1] <= target:      # basic is tighter here: report it
            return basic
        return eps, target


def eps_with_failure(pld, target_delta: float, phi: float = 0.0, grid: int = 2049) -> float:
    """The smallest E (to 1e-9, on the safe side) with pld's delta(E) + (1 + e^E) phi <=
    ``target_delta`` (inf where none; phi = 0: ``pld.get_epsilon_for_delta``).

    Each direction's delta(E) + (1 + e^E) phi has derivative e^E (phi - Q[loss > E]),
    negative then positive, so the E that pass form an interval starting no lower than
    pld's own eps at the target: the first passing point of a grid up to where
    (1 + e^E) phi alone exceeds the target, then a bisection below it (the passing set is
    an interval, so the predicate is monotone between a failing point left of it and a
    passing one)."""
    lo = float(pld.get_epsilon_for_delta(target_delta))
    if phi <= 0 or not math.isfinite(lo):
        return lo
    if not target_delta > 2.0 * phi:
        return math.inf

    def fits(e):
        return float(pld.get_delta_for_epsilon(e)) + (1.0 + math.exp(e)) * phi <= target_delta
    top = math.log(target_delta / phi - 1.0)
    if fits(lo):
        return lo
    if not lo < top:
        return math.inf
    es = np.linspace(lo, top, grid)
    ok = grid_deltas(pld, es) + (1.0 + np.exp(es)) * phi <= target_delta
    if not ok.any():
        return math.inf
    i = int(np.argmax(ok))
    a, b = float(es[i - 1]), float(es[i])       # i >= 1: es[0] = lo failed
    if not fits(b):                             # the vectorised and scalar sums disagree
        return math.inf
    while b - a > 1e-9:
        mid = 0.5 * (a + b)
        a, b = (a, mid) if fits(mid) else (mid, b)
    return b


ACCOUNTANTS = {"basic": BasicAccountant, "pld": PLDAccountant}


def get_accountant(name: str) -> Accountant:
    if name not in ACCOUNTANTS:
        raise ValueError(f"unknown accountant {name!r}; use one of {sorted(ACCOUNTANTS)}")
    return ACCOUNTANTS[name]()

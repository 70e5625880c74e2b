"""What a release *is*, as immutable events in the style of Google's ``dp_accounting``.

An event records the mechanism and its public parameters, never a computed eps nor the
accountant's choices (which amplification bound, which delta; accountants.Costing):
the accountants (:mod:`rknn_ray.accounting.accountants`) decide what it costs. We use
``dp_accounting``'s own events where one fits (the central model's discrete and
continuous Laplace) and add small frozen events, subclasses of ``DpEvent``, for what
it lacks: a pure eps-LDP report, a shuffled single-message release, and the
multi-message histogram protocol. Every mechanism builds its event as a pure
function of its parameters and the number of senders actually shuffled
(``Mechanism.event(n)``).
"""
from __future__ import annotations

import attr
from dp_accounting import dp_event


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LocalRandomizerDpEvent(dp_event.DpEvent):
    """One report per client from an ``eps``-LDP randomizer (the local model).

    ``eps`` is the randomizer's parameter (its worst-case likelihood ratio is e^eps
    for one record, replace-one), not a derived cost.
    """
    mechanism: str
    eps: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ShuffledLocalDpEvent(dp_event.DpEvent):
    """Single-message shuffle: ``num_senders`` eps0-LDP reports, anonymized and shuffled.

    The accountant turns it into a central (eps, delta) at this ``delta`` with the
    amplification bound of its choice (``Costing.bound``, recorded beside the event:
    rknn_ray.accounting.accountants), never above (eps0, 0):
    each record's own report is eps0-LDP whatever the others send. ``num_senders`` is
    the reports the amplification counts: those assumed honest
    (``honest_fraction``) among the senders, at most those the server opened
    (``reports_opened``; 0 in events written before it was recorded).
    ``collision_c``, ``collision_l``: a Collision randomizer's ones per report and output
    domain, for the bounds specific to it (``bound_choice.round_bound``; 0: not recorded, the
    report is costed as a generic eps0-LDP one). ``rr_kr``, ``rr_d``: likewise a per-bit
    randomized response's ones per input (k*r) and report length (s*|Y|).
    """
    local_mechanism: str
    eps0: float
    num_senders: int
    delta: float
    honest_fraction: float = 1.0
    reports_opened: int = 0
    collision_c: int = 0
    collision_l: int = 0
    rr_kr: int = 0
    rr_d: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class MultiMessageShuffleDpEvent(dp_event.DpEvent):
    """Multi-message shuffle: per cell, NB shares of DLap(dlap_p) over ``num_senders`` clients
    plus flooding pairs with mean ``flood_mean_total``: NB with shape ``flood_shape``, or
    Poisson for 0 (every event written before the shape was recorded); one record moves
    ``sensitivity_l1`` cells.

    The accountant computes eps at ``delta`` with rknn_ray.accounting.multi_message and
    adds ``cap_failure`` (the chance that an honest client's noise exceeds the per-sender
    message cap, see rknn_ray.mechanisms.shuffle_multi.noise_message_cap) to delta; the pld
    accountant composes the protocol's own PLD and charges the cap at the composed eps
    (rknn_ray.accounting.accountants.cap_failure_mass). ``cap_eps``: the eps the cap was
    sized with (per-client failure probability cap_failure / ((1 + e^cap_eps) n); 0 in
    events written before it was recorded: then the event's own eps, recomputed).
    ``dlap_p`` and ``flood_mean_total`` are the noise of the ``noise_senders`` =
    ceil(``honest_fraction`` * ``num_senders``) honest clients alone: each client sends
    that many clients' share, so the guarantee holds whenever at least that many follow
    the protocol (0 in events written before it was recorded: then all ``num_senders``).
    """
    dlap_p: float
    flood_mean_total: float
    num_senders: int
    sensitivity_l1: int
    num_cells: int
    delta: float
    cap_failure: float = 0.0
    honest_fraction: float = 1.0
    noise_senders: int = 0
    flood_shape: float = 0.0
    cap_eps: float = 0.0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SubsampleDpEvent(dp_event.DpEvent):
    """A model trained (without noise) on a ``k``-subsample of a party's ``n`` records, drawn
    with or without ``replacement`` (FedMD-NFDP, paper 003, Theorems 1 and 2); add/remove-one
    record. The accountant's closed form is ``accountants.subsample_epsilon_delta``."""
    k: int
    n: int
    replacement: bool = True


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SelectiveRRDpEvent(dp_event.DpEvent):
    """DP-DFD (paper 004): each of ``num_queries`` labels through randomized response with
    parameter ``eps`` restricted to a candidate set of ``min_candidates``..``max_candidates``
    classes: eps-label-DP per query, each label released once (parallel composition)."""
    eps: float
    num_queries: int = 0
    min_candidates: int = 0
    max_candidates: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ApproxDpEvent(dp_event.DpEvent):
    """A spend known only by its stated (eps, delta): a budget *reservation* (what a job
    may spend before it has run), never a release (releases are mechanism-level events)."""
    eps: float
    delta: float


#: what :func:`event_from_dict` rebuilds: this project's events and dp_accounting's own
REBUILDABLE = {c.__name__: c for c in (
    LocalRandomizerDpEvent, ShuffledLocalDpEvent, MultiMessageShuffleDpEvent, SubsampleDpEvent,
    SelectiveRRDpEvent, ApproxDpEvent, dp_event.DiscreteLaplaceDpEvent, dp_event.LaplaceDpEvent,
    dp_event.GaussianDpEvent, dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)}


class UnrebuildableEventError(ValueError):
    """A saved event of a type this version cannot rebuild (never costed as something else)."""


def event_to_dict(event) -> dict | None:
    """JSON-able description: the event's type and its parameters (nested for composition)."""
    if event is None:
        return None
    if isinstance(event, dp_event.ComposedDpEvent):
        return {"type": "ComposedDpEvent", "events": [event_to_dict(e) for e in event.events]}
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return {"type": "SelfComposedDpEvent", "event": event_to_dict(event.event),
                "count": int(event.count)}
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return {"type": "PoissonSampledDpEvent", "sampling_probability":
                float(event.sampling_probability), "event": event_to_dict(event.event)}
    if attr.has(type(event)):
        return {"type": type(event).__name__, **attr.asdict(event, recurse=False)}
    return {"type": type(event).__name__, "repr": repr(event)}


def costed_from_dict(d: dict | None):
    """(event, legacy accountant choices) from :func:`event_to_dict` output.

    Events saved before the amplification bound became the accountant's choice carry it
    as a ``bound`` field: it is returned as ``{"bound": ...}`` (else ``{}``), not kept
    in the event. Any type not in :data:`REBUILDABLE` (or composed of them) is refused
    with :class:`UnrebuildableEventError`: nothing is costed as a generic event."""
    if d is None:
        return None, {}
    kind = d.get("type")
    if kind == "ComposedDpEvent":
        return dp_event.ComposedDpEvent([costed_from_dict(e)[0] for e in d["events"]]), {}
    if kind == "SelfComposedDpEvent":
        return dp_event.SelfComposedDpEvent(costed_from_dict(d["event"])[0], int(d["count"])), {}
    if kind == "PoissonSampledDpEvent":
        return dp_event.PoissonSampledDpEvent(float(d["sampling_probability"]),
                                              costed_from_dict(d["event"])[0]), {}
    if kind not in REBUILDABLE:
        raise UnrebuildableEventError(
            f"cannot rebuild a saved event of type {kind!r}: this version knows "
            f"{sorted(REBUILDABLE) + ['ComposedDpEvent', 'PoissonSampledDpEvent', 'SelfComposedDpEvent']}"
            ". Fix: record releases with one of these events (add the type to "
            "rknn_ray.accounting.events.REBUILDABLE and to accountants.event_cost), or use a "
            "ledger written by this version (a fresh --out / --ledger)")
    fields = {k: v for k, v in d.items() if k != "type"}
    legacy = {}
    if kind == "ShuffledLocalDpEvent" and "bound" in fields:
        legacy["bound"] = fields.pop("bound")
    try:
        return REBUILDABLE[kind](**fields), legacy
    except TypeError as exc:
        raise UnrebuildableEventError(f"cannot rebuild a saved {kind}: its fields {sorted(fields)} "
                                      f"do not match this version's ({exc}). Fix: use a ledger "
                                      "written by this version") from None


def event_from_dict(d: dict | None):
    """Inverse of :func:`event_to_dict` (the event only; see :func:`costed_from_dict`)."""
    return costed_from_dict(d)[0]

"""What a release *is*, as immutable events in the style of Google's ``dp_accounting``.

An event records the mechanism and its public parameters, never a computed eps:
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

    The accountant turns it into a central (eps, delta) with the amplification
    ``bound`` (rknn_ray.accounting.bounds) at this ``delta``, never above (eps0, 0):
    each record's own report is eps0-LDP whatever the others send. ``num_senders`` is
    the reports the amplification counts: those assumed honest
    (``honest_fraction``) among the senders, at most those the server opened
    (``reports_opened``; 0 in events written before it was recorded).
    """
    local_mechanism: str
    eps0: float
    num_senders: int
    delta: float
    bound: str
    honest_fraction: float = 1.0
    reports_opened: int = 0


@attr.s(frozen=True, slots=True, auto_attribs=True)
class MultiMessageShuffleDpEvent(dp_event.DpEvent):
    """Multi-message shuffle: per cell, NB shares of DLap(dlap_p) over ``num_senders`` clients
    plus flooding pairs with mean ``flood_mean_total``: NB with shape ``flood_shape``, or
    Poisson for 0 (every event written before the shape was recorded); one record moves
    ``sensitivity_l1`` cells.

    The accountant computes eps at ``delta`` with rknn_ray.accounting.multi_message and
    adds ``cap_failure`` (the chance that an honest client's noise exceeds the per-sender
    message cap, see rknn_ray.mechanisms.shuffle_multi.noise_message_cap) to delta.
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


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ApproxDpEvent(dp_event.DpEvent):
    """A release known only by its stated (eps, delta) guarantee (no mechanism-level event)."""
    eps: float
    delta: float


def event_to_dict(event) -> dict | None:
    """JSON-able description: the event's type and its parameters (nested for composition)."""
    if event is None:
        return None
    if isinstance(event, dp_event.ComposedDpEvent):
        return {"type": "ComposedDpEvent", "events": [event_to_dict(e) for e in event.events]}
    if attr.has(type(event)):
        return {"type": type(event).__name__, **attr.asdict(event, recurse=False)}
    return {"type": type(event).__name__, "repr": repr(event)}


def event_from_dict(d: dict | None):
    """Inverse of :func:`event_to_dict` for the events this project writes (resume from a release)."""
    if d is None:
        return None
    if d["type"] == "ComposedDpEvent":
        return dp_event.ComposedDpEvent([event_from_dict(e) for e in d["events"]])
    known = {c.__name__: c for c in (LocalRandomizerDpEvent, ShuffledLocalDpEvent,
                                     MultiMessageShuffleDpEvent, ApproxDpEvent,
                                     dp_event.DiscreteLaplaceDpEvent, dp_event.LaplaceDpEvent)}
    if d["type"] not in known:
        raise ValueError(f"cannot rebuild event type {d['type']!r} from a saved release")
    return known[d["type"]](**{k: v for k, v in d.items() if k != "type"})

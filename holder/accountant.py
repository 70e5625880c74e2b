"""What a specification costs this holder, recomputed with the project's accountants.

The holder trusts no party's number: it builds the round's mechanism from the
specification's public parameters (``mechanism_params``: ``num_classes``, ``r``,
``max_records_per_client`` and the mechanism's options such as ``bound`` and
``honest_fraction``; k, the queries, eps0 and delta from the specification's own fields),
so the randomizer it runs is the one it costs, and asks the accountant for the round's
event at the specification's floor of senders (``min_senders``): the amplified eps if
the shuffler does not collude, and the local eps0 of its own report if it does (infinite
for a mechanism with no local guarantee: the multi-message protocol's true messages, or the
central model's plain vote).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rknn_ray.accounting.accountants import DEFAULT_COSTING, event_cost
from rknn_ray.accounting.events import LocalRandomizerDpEvent, event_to_dict
from rknn_ray.mechanisms import MechanismParams, build
from sealing.round_spec import RoundSpec

MECHANISM_FIELDS = ("num_classes", "r", "max_records_per_client")
SLACK = 1e-9


class SpecRefused(ValueError):
    """This holder does not answer the specification (one line: why, and what would do)."""


@dataclass(frozen=True)
class OwnCost:
    """The round's cost to this holder's records, by its own accountant."""
    eps: float                 # charged: amplified (trusting the shuffler) or eps0 (colluding)
    delta: float
    amplified_eps: float       # at the spec's floor of senders, the shuffler not colluding
    colluding_eps: float       # the shuffler colluding: its own report's local eps
    event: dict                # the event charged, as the ledger stores it
    costing: object            # the accountant's choices it was costed under
    note: str


def mechanism_of(spec: RoundSpec, check_length: bool = True):
    """The round's mechanism, built from the specification alone (SpecRefused if it cannot be,
    or if its messages are not the specification's ``payload_len`` bytes)."""
    params = dict(spec.mechanism_params)
    try:
        fields = {name: int(params.pop(name)) for name in MECHANISM_FIELDS if name in params}
        mp = MechanismParams(num_queries=int(spec.queries.shape[0]), k=spec.k, eps=spec.eps,
                             delta=spec.delta, num_clients=spec.min_senders, options=params,
                             local_eps0=spec.eps0 if spec.model == "shuffle" else None,
                             **{"num_classes": 0, **fields})
        if spec.model == "local":
            mp = MechanismParams(**{**mp.__dict__, "eps": float(spec.eps0)})
        mech = build(spec.model, spec.mechanism, mp)
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecRefused(f"the specification's mechanism {spec.model}/{spec.mechanism} with "
                          f"{spec.mechanism_params} cannot be built here ({text}); ask the "
                          "operator for a specification this program implements") from None
    if check_length and mech.message_size != spec.payload_len:
        raise SpecRefused(f"the specification says messages of {spec.payload_len} bytes, but its "
                          f"mechanism makes {mech.message_size}: it is inconsistent, not answered")
    return mech


def own_cost(spec: RoundSpec, mech, assume_collusion: bool = False) -> OwnCost:
    """The round's eps by this holder's accountant; SpecRefused if the specification claims less."""
    event, costing = mech.round_event(spec.min_senders, spec.min_senders), mech.costing()
    amplified, amp_delta = event_cost(event, costing)
    local = getattr(mech, "local_eps", None)
    colluding = float(local) if spec.model != "central" and local is not None else math.inf
    if local is not None and spec.model != "central" \
            and abs(colluding - float(spec.eps0)) > SLACK * max(1.0, spec.eps0):
        raise SpecRefused(f"the specification says eps0={spec.eps0:g} but its mechanism runs at "
                          f"local eps {colluding:.6g}: inconsistent, not answered")
    if amplified > spec.eps * (1 + SLACK):
        raise SpecRefused(f"the specification claims eps={spec.eps:g} but this holder's "
                          f"accountant computes eps={amplified:.6g} for {spec.model}/"
                          f"{spec.mechanism} at eps0={spec.eps0} with the floor of "
                          f"{spec.min_senders} senders: refused, nothing uploaded")
    bound = f", {costing.bound} bound" if spec.model == "shuffle" and local is not None else ""
    note = (f"{spec.model}/{spec.mechanism}: eps={amplified:.6g}, delta={amp_delta:.3g} if the "
            f"shuffler does not collude (at the floor of {spec.min_senders} senders{bound}); "
            f"eps0={colluding:.6g} if it colludes; the specification claimed eps={spec.eps:g}")
    eps, delta = amplified, amp_delta
    if assume_collusion and spec.model == "shuffle" and colluding == math.inf:
        raise SpecRefused(f"{spec.model}/{spec.mechanism} gives no guarantee if the shuffler "
                          "colludes, and this holder assumes it does (--assume-collusion)")
    if assume_collusion and spec.model == "shuffle":
        event, costing = LocalRandomizerDpEvent(spec.mechanism, colluding), DEFAULT_COSTING
        eps, delta = event_cost(event, costing)
        note += "; charged at eps0: this holder assumes the shuffler colludes"
    return OwnCost(float(eps), float(delta), float(amplified), colluding, event_to_dict(event),
                   costing, note)

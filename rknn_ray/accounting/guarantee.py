"""What a release promises: its event, the accountant's choices for it, and who it protects.

A :class:`Guarantee` holds no (eps, delta) of its own: ``eps`` and ``delta`` are the
accountant's cost of (``event``, ``accounting``) (rknn_ray.accounting.accountants.event_cost),
computed on first read. Whatever a file stores beside them (report.json, release.npz, a
ledger row) is a cache for readers of the file: reading it back recomputes the numbers from
the event, so one source holds by construction.

:func:`guarantee_of` is how a mechanism's release becomes a guarantee: a mechanism exposes
its event, its costing and what the guarantee shows (``guarantee_facts``), never a number.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

from rknn_ray.accounting.accountants import DEFAULT_COSTING, Costing, event_cost
from rknn_ray.accounting.events import costed_from_dict, event_to_dict
from rknn_ray.accounting.units import MODELS, NEIGHBOUR_REPLACE_ONE, UNITS


@dataclass(frozen=True)
class Guarantee:
    """(eps, delta)-DP for ``unit`` under ``neighbour``, as the cost of ``event``.

    ``model`` is the trust model (who must be trusted for the guarantee to hold);
    ``n`` is the number of distinct senders it was computed from where it depends on it
    (shuffle amplification), else None; ``accounting`` the accountant's choices for the
    event (the amplification bound, the delta a non-pure event is stated at, rdp/pld).
    """
    event: Any
    model: str
    mechanism: str
    unit: str = "record"
    neighbour: str = NEIGHBOUR_REPLACE_ONE
    n: int | None = None
    note: str = ""
    accounting: Costing = DEFAULT_COSTING

    def __post_init__(self):
        if self.event is None:
            raise ValueError("a guarantee is the cost of an event: give the release's event")
        if not isinstance(self.accounting, Costing):      # None, or a dict read back from a file
            object.__setattr__(self, "accounting", Costing.from_dict(self.accounting))
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    @functools.cached_property
    def cost(self) -> tuple[float, float]:
        """(eps, delta): the accountant's cost of the event under its choices."""
        return event_cost(self.event, self.accounting)

    @property
    def eps(self) -> float:
        return self.cost[0]

    @property
    def delta(self) -> float:
        return self.cost[1]

    def to_dict(self) -> dict:
        """report.json's and release.npz's form: the shown fields, the event and its costing,
        and (eps, delta) as a cache for readers of the file (:meth:`from_dict` recomputes them)."""
        out = {"eps": self.eps, "delta": self.delta}
        out.update({f.name: getattr(self, f.name) for f in fields(self)
                    if f.name not in ("event", "accounting")})
        return {**out, "accounting": self.accounting.shown_for(self.event),
                "event": event_to_dict(self.event)}

    @classmethod
    def from_dict(cls, d: dict, event: Any = None, accounting: Any = None) -> "Guarantee":
        """A guarantee read back from a file: :meth:`to_dict` output, or a file written before
        guarantees carried their event (then ``event`` and ``accounting`` come from beside it:
        release.npz's round, the ledger row). A stored eps or delta is never read."""
        legacy: dict = {}
        if event is None:
            event, legacy = costed_from_dict(d.get("event"))
        choices = accounting if accounting is not None else d.get("accounting")
        if isinstance(choices, Costing):
            choices = choices.to_dict()
        costing = Costing.from_dict({**legacy, **(choices or {})})
        shown = {f.name: d[f.name] for f in fields(cls)
                 if f.name not in ("event", "accounting") and f.name in d}
        return cls(event, accounting=costing, **shown)


def guarantee_of(mechanism, n: int | None = None, event: Any = None,
                 opened: int | None = None) -> Guarantee:
    """The guarantee of ``mechanism``'s release for ``n`` senders: its ``event(n)`` (or
    ``event``: a round's ``round_event(n, opened)`` once the server has opened ``opened``
    reports), costed under its ``costing()``, with what it shows (``guarantee_facts``)."""
    if event is None:
        event = mechanism.event(n)
    facts = mechanism.guarantee_facts(event, n, opened)
    return Guarantee(event, mechanism.model, mechanism.name, accounting=mechanism.costing(),
                     **facts)


__all__ = ["Guarantee", "guarantee_of"]

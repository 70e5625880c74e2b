"""The privacy ledger of one run: every release as an event, its guarantee, and the total.

Follows dp_accounting's split between *what happened* and *what it costs*: each entry
keeps the release's event (rknn_ray.accounting.events; a mechanism builds it with
``Mechanism.event(n)``) next to the guarantee the mechanism stated, and the total is
computed by an accountant (rknn_ray.accounting.accountants: ``basic`` sums, ``pld``
composes privacy-loss distributions with dp_accounting) from the events. An entry
recorded without an event counts as its stated (eps, delta). The PLD total is
reported at the ledger's delta (the budget delta, else twice the summed delta of the
entries, at least 1e-12) and never exceeds the basic total.

All entries must share one unit (record / client / label) and neighbour relation:
composing guarantees about different units is meaningless, so it is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rknn_ray.accounting.accountants import get_accountant
from rknn_ray.accounting.events import ApproxDpEvent, event_to_dict
from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms.base import Guarantee
from rknn_ray.runio import write_json

ACCOUNTANTS = ("basic", "pld")


@dataclass
class LedgerEntry:
    round_id: int
    guarantee: Guarantee
    event: Any = None
    extra: dict = field(default_factory=dict)

    @property
    def accounted_event(self):
        """(event, the accountant's choices for it) as the accountant composes it (the stated
        guarantee when no event was given)."""
        event = self.event if self.event is not None else \
            ApproxDpEvent(self.guarantee.eps, self.guarantee.delta)
        return event, self.guarantee.accounting

    def to_dict(self) -> dict:
        g = self.guarantee
        costing = g.accounting.to_dict() if g.accounting is not None else None
        return {"round": self.round_id, "model": g.model, "mechanism": g.mechanism,
                "eps": g.eps, "delta": g.delta, "unit": g.unit, "neighbour": g.neighbour,
                "n": g.n, "note": g.note, "event": event_to_dict(self.event),
                "accounting": costing, **self.extra}


class PrivacyLedger:
    """Per-job ledger with an optional (eps, delta) budget cap enforced *before* release."""

    def __init__(self, budget_eps: float | None = None, budget_delta: float | None = None,
                 accountant: str = "basic"):
        if accountant not in ACCOUNTANTS:
            raise ConfigError("privacy.accountant", f"unknown accountant {accountant!r}",
                              f"use one of {ACCOUNTANTS}")
        if budget_eps is not None and not budget_eps > 0:
            raise ConfigError("privacy.budget_eps", f"budget eps={budget_eps} must be > 0",
                              "set a positive budget or none")
        if budget_delta is not None and not 0 <= budget_delta < 1:
            raise ConfigError("privacy.budget_delta", f"budget delta={budget_delta} out of [0, 1)",
                              "set 0 <= delta < 1")
        self.budget_eps, self.budget_delta = budget_eps, budget_delta
        self.accountant = accountant
        self.entries: list[LedgerEntry] = []
        self._accountant = get_accountant(accountant)

    # ------------------------------------------------------------------ composition
    def _target_delta(self, entries: list[LedgerEntry]) -> float:
        if self.budget_delta is not None and self.budget_delta > 0:
            return self.budget_delta
        return max(1e-12, 2.0 * sum(e.guarantee.delta for e in entries))

    def _compose(self, entries: list[LedgerEntry]) -> tuple[float, float]:
        if not entries:
            return 0.0, 0.0
        return self._accountant.compose([e.accounted_event for e in entries],
                                        self._target_delta(entries))

    def spent(self) -> tuple[float, float]:
        """Composed (eps, delta) of everything recorded so far."""
        return self._compose(self.entries)

    def _check_unit(self, g: Guarantee) -> None:
        if self.entries:
            first = self.entries[0].guarantee
            if (g.unit, g.neighbour) != (first.unit, first.neighbour):
                raise PrivacyBudgetError(
                    f"cannot compose a {g.unit}-level ({g.neighbour}) guarantee with the "
                    f"ledger's {first.unit}-level ({first.neighbour}) ones; use one unit per "
                    "run (convert the guarantee) or start a new ledger")

    def check(self, guarantee: Guarantee, event: Any = None) -> tuple[float, float]:
        """Raise PrivacyBudgetError if recording ``guarantee`` would exceed the budget.

        Returns the composed (eps, delta) the ledger would show after recording it.
        Call it *before* starting a round: a refused round releases nothing.
        """
        self._check_unit(guarantee)
        eps, delta = self._compose(self.entries + [LedgerEntry(-1, guarantee, event)])
        over_eps = self.budget_eps is not None and eps > self.budget_eps * (1 + 1e-12)
        over_delta = self.budget_delta is not None and delta > self.budget_delta * (1 + 1e-12)
        if over_eps or over_delta:
            s_eps, s_delta = self.spent()
            raise PrivacyBudgetError(
                f"round refused: with this release ({guarantee.mechanism}, eps={guarantee.eps:g}, "
                f"delta={guarantee.delta:g}) the run would spend eps={eps:.6g}, delta={delta:.3g} "
                f"({self.accountant} composition), over the budget eps={self.budget_eps}, "
                f"delta={self.budget_delta}; already spent eps={s_eps:.6g}, delta={s_delta:.3g}. "
                "Fix: lower the per-round eps, run fewer rounds, or raise the budget")
        return eps, delta

    def record(self, guarantee: Guarantee, round_id: int, event: Any = None, **extra) -> LedgerEntry:
        """Check the budget, then append the release. Returns the new entry."""
        self.check(guarantee, event)
        entry = LedgerEntry(int(round_id), guarantee, event, dict(extra))
        self.entries.append(entry)
        return entry

    def record_spent(self, guarantee: Guarantee, round_id: int, event: Any = None,
                     **extra) -> LedgerEntry:
        """Append a release that has already happened, at its true cost, over budget or not.

        For a round the server has opened but that missed its target (too few reports
        hid each other): refusing to record it would understate what was spent.
        """
        self._check_unit(guarantee)
        entry = LedgerEntry(int(round_id), guarantee, event, dict(extra))
        self.entries.append(entry)
        return entry

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        eps, delta = self.spent()
        basic = get_accountant("basic").compose([e.accounted_event for e in self.entries])
        return {"accountant": self.accountant,
                "budget": {"eps": self.budget_eps, "delta": self.budget_delta},
                "entries": [e.to_dict() for e in self.entries],
                "total": {"eps": eps, "delta": delta},
                "total_basic": {"eps": basic[0], "delta": basic[1]},
                "rounds": len({e.round_id for e in self.entries})}

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (temp file in the same folder, then os.replace)."""
        atomic_write_json(path, self.to_dict())


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (the project's one implementation: rknn_ray.runio)."""
    write_json(os.fspath(path), obj)

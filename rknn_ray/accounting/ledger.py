"""The privacy ledger of one run: every release, its guarantee, and the composed total.

Follows dp_accounting's split between *what happened* (an event per release) and
*what it costs* (an accountant):

* ``basic``: pure sums, sum eps and sum delta (exact for pure DP, valid always).
* ``pld``: privacy-loss-distribution composition with Google's ``dp_accounting``
  (pessimistic discretisation, so the composed eps is an upper bound). A release
  whose guarantee comes with a ``LaplaceDpEvent`` / ``DiscreteLaplaceDpEvent`` is
  composed from its exact PLD; any other (eps, delta) release from the PLD of the
  generic (eps, delta) pair (the worst mechanism with that guarantee).  The PLD
  total is reported at the ledger's delta (the budget delta, else the summed delta of
  the entries, at least 1e-12) and never exceeds the basic total.

All entries must share one unit (record / client / label) and neighbour relation:
composing guarantees about different units is meaningless, so it is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms.base import Guarantee
from rknn_ray.runio import write_json

ACCOUNTANTS = ("basic", "pld")
PLD_DISCRETIZATION = 1e-4


def _event_dict(event: Any) -> dict | None:
    if event is None:
        return None
    if isinstance(event, dp_event.DpEvent):
        return {"type": type(event).__name__, **{k: v for k, v in event.__dict__.items()}} \
            if hasattr(event, "__dict__") else {"type": type(event).__name__}
    return {"type": "custom", "repr": repr(event)}


def _pld_of(g: Guarantee, event: Any):
    """PLD of one release: exact for (discrete) Laplace events, generic otherwise."""
    if isinstance(event, dp_event.LaplaceDpEvent):
        return pld_lib.from_laplace_mechanism(event.noise_multiplier, sensitivity=1,
                                              value_discretization_interval=PLD_DISCRETIZATION)
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
        return pld_lib.from_discrete_laplace_mechanism(
            event.noise_parameter, sensitivity=event.sensitivity,
            value_discretization_interval=PLD_DISCRETIZATION)
    if g.eps == 0 and g.delta == 0:
        return None
    params = pld_common.DifferentialPrivacyParameters(g.eps, g.delta)
    return pld_lib.from_privacy_parameters(params, value_discretization_interval=PLD_DISCRETIZATION)


@dataclass
class LedgerEntry:
    round_id: int
    guarantee: Guarantee
    event: Any = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        g = self.guarantee
        return {"round": self.round_id, "model": g.model, "mechanism": g.mechanism,
                "eps": g.eps, "delta": g.delta, "unit": g.unit, "neighbour": g.neighbour,
                "n": g.n, "note": g.note, "event": _event_dict(self.event), **self.extra}


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
        self._pld_total = None          # composed PLD of self.entries (cached)

    # ------------------------------------------------------------------ composition
    def _target_delta(self, entries: list[LedgerEntry]) -> float:
        if self.budget_delta is not None and self.budget_delta > 0:
            return self.budget_delta
        return max(1e-12, 2.0 * sum(e.guarantee.delta for e in entries))

    def _compose(self, entries: list[LedgerEntry]) -> tuple[float, float]:
        if not entries:
            return 0.0, 0.0
        eps_sum = sum(e.guarantee.eps for e in entries)
        delta_sum = min(1.0, sum(e.guarantee.delta for e in entries))
        if self.accountant == "basic" or len(entries) == 1 and entries[0].event is None:
            return eps_sum, delta_sum
        # entries == self.entries (+ at most one candidate): reuse the cached total
        cached = len(entries) >= len(self.entries) and entries[:len(self.entries)] == self.entries
        total = self._pld_total if cached else None
        for e in (entries[len(self.entries):] if cached else entries):
            pld = _pld_of(e.guarantee, e.event)
            if pld is None:
                continue
            total = pld if total is None else total.compose(pld)
        if total is None:
            return 0.0, 0.0
        target = self._target_delta(entries)
        eps = float(total.get_epsilon_for_delta(target))
        if eps_sum <= eps and delta_sum <= target:   # basic is tighter here: report it
            return eps_sum, delta_sum
        return eps, target

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
        if self.accountant == "pld":
            pld = _pld_of(guarantee, event)
            if pld is not None:
                self._pld_total = pld if self._pld_total is None else self._pld_total.compose(pld)
        self.entries.append(entry)
        return entry

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        eps, delta = self.spent()
        basic = (sum(e.guarantee.eps for e in self.entries),
                 min(1.0, sum(e.guarantee.delta for e in self.entries)))
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

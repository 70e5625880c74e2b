"""The privacy ledger of one run: a view over the one ledger, the store.

Every release is a row of a :class:`~rknn_ray.accounting.budget_store.BudgetStore`
holding the release's event (rknn_ray.accounting.events; a mechanism builds it with
``Mechanism.event(n)``), the accountant's choices beside it, and what the run shows of it
(its guarantee's unit, note, ...: rknn_ray.accounting.guarantee, whose eps is the cost of
the event). A job's ledger is the view over its own rows of the
persistent store (``store``, ``identity``, ``job_id``): each release is written there
once, into the job's reservation (``commit_round``). Without a store (compare, grid,
baselines, benchmarks) the ledger keeps its rows in a store in memory, gone when the run
ends. The store checks on writing that the guarantee's (eps, delta) is the accountant's
cost of the event; the totals are the composition of the events by the run's accountant
(``basic`` sums, ``pld`` composes privacy-loss distributions), at the ledger's delta (the
budget delta, else twice the summed delta of the entries, at least 1e-12), never above
the basic total. This class only adds the run's budget cap (checked before a release) and reads its
entries back.

The view reads each row once and composes it once (an incremental
:class:`~rknn_ray.accounting.accountants.Composition` keyed on the rows read), so a
check before a round costs that round's event, not every recorded event again.

All entries must share one unit (record / client / label) and neighbour relation:
composing guarantees about different units is meaningless, so it is refused.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rknn_ray.accounting.accountants import Composition
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.events import event_to_dict
from rknn_ray.accounting.guarantee import Guarantee
from rknn_ray.accounting.ledger_file import MEMORY
from rknn_ray.errors import ConfigError, LedgerError, PrivacyBudgetError
from rknn_ray.runio import write_json

ACCOUNTANTS = ("basic", "pld")
RUN = "run"                 # the identity and job id of a run's own in-memory ledger


@dataclass
class LedgerEntry:
    round_id: int
    guarantee: Guarantee
    extra: dict = field(default_factory=dict)

    @property
    def event(self):
        return self.guarantee.event

    @property
    def accounted_event(self):
        """(event, the accountant's choices for it) as the accountant composes it."""
        return self.guarantee.event, self.guarantee.accounting

    def to_dict(self) -> dict:
        g = self.guarantee
        return {"round": self.round_id, "model": g.model, "mechanism": g.mechanism,
                "eps": g.eps, "delta": g.delta, "unit": g.unit, "neighbour": g.neighbour,
                "n": g.n, "note": g.note, "event": event_to_dict(g.event),
                "accounting": g.accounting.shown_for(g.event), **self.extra}


class PrivacyLedger:
    """Per-job ledger with an optional (eps, delta) budget cap enforced *before* release.

    ``store``, ``identity``, ``job_id``: the persistent store and the job whose rows this
    ledger is (the job must hold a reservation there: every release is committed into
    it). Without them the ledger lives in memory."""

    def __init__(self, budget_eps: float | None = None, budget_delta: float | None = None,
                 accountant: str = "basic", *, store=None, identity: str | None = None,
                 job_id: str | None = None):
        if accountant not in ACCOUNTANTS:
            raise ConfigError("privacy.accountant", f"unknown accountant {accountant!r}",
                              f"use one of {ACCOUNTANTS}")
        if budget_eps is not None and not budget_eps > 0:
            raise ConfigError("privacy.budget_eps", f"budget eps={budget_eps} must be > 0",
                              "set a positive budget or none")
        if budget_delta is not None and not 0 <= budget_delta < 1:
            raise ConfigError("privacy.budget_delta", f"budget delta={budget_delta} out of [0, 1)",
                              "set 0 <= delta < 1")
        if (store is None) != (identity is None) or (store is None) != (job_id is None):
            raise ValueError("a ledger over a persistent store needs store, identity and job_id")
        self.budget_eps, self.budget_delta = budget_eps, budget_delta
        self.accountant = accountant
        self.persistent = store is not None
        if store is None:
            store, identity, job_id = BudgetStore(MEMORY), RUN, RUN
        self.store, self.identity, self.job_id = store, identity, job_id
        # the view so far: the rows read (up to row id _last), their entries, their composition
        self._last = 0
        self._entries: list[LedgerEntry] = []
        self._composed = Composition(accountant)
        self._delta_sum = 0         # the entries' stated deltas, summed (the default target)

    # ------------------------------------------------------------------ the view
    def _read(self) -> None:
        """Read the rows written since the last read; each is composed once, here (the
        guarantee's eps is the cost of the row's event, whatever number the row stores)."""
        for row in self.store.release_rows(self.identity, self.job_id, self._last):
            meta = row["meta"]
            if row["event"] is None:
                raise LedgerError(f"{self.store.path}: release {row['id']} of job {self.job_id} "
                                  "holds no event, so nothing can cost it. Fix: use a ledger "
                                  "written by this version (a fresh --ledger)")
            g = Guarantee.from_dict({**meta["guarantee"], "event": row["event"]},
                                    accounting=row["accounting"] or meta.get("accounting"))
            entry = LedgerEntry(int(row["round"]), g, meta.get("extra", {}))
            self._composed.add(entry.accounted_event)
            self._delta_sum += g.delta
            self._entries.append(entry)
            self._last = row["id"]

    @property
    def entries(self) -> list[LedgerEntry]:
        """Every release, read back from the store (rows are written only by record*)."""
        self._read()
        return list(self._entries)

    # ------------------------------------------------------------------ composition
    def _compose(self, extra: list | None = None) -> tuple[float, float]:
        """Composed (eps, delta) of the entries and the guarantees ``extra`` after them."""
        self._read()
        extra = [LedgerEntry(-1, g) for g in (extra or [])]
        if not self._entries and not extra:
            return 0.0, 0.0
        if self.budget_delta is not None and self.budget_delta > 0:
            target = self.budget_delta
        else:
            delta_sum = self._delta_sum
            for e in extra:
                delta_sum += e.guarantee.delta
            target = max(1e-12, 2.0 * delta_sum)
        composed = self._composed
        if extra:
            composed = composed.copy().extend(e.accounted_event for e in extra)
        return composed.result(target)

    def spent(self) -> tuple[float, float]:
        """Composed (eps, delta) of everything recorded so far."""
        return self._compose()

    def _check_unit(self, g: Guarantee) -> None:
        self._read()
        if self._entries:
            first = self._entries[0].guarantee
            if (g.unit, g.neighbour) != (first.unit, first.neighbour):
                raise PrivacyBudgetError(
                    f"cannot compose a {g.unit}-level ({g.neighbour}) guarantee with the "
                    f"ledger's {first.unit}-level ({first.neighbour}) ones; use one unit per "
                    "run (convert the guarantee) or start a new ledger")

    def check(self, guarantee: Guarantee) -> tuple[float, float]:
        """Raise PrivacyBudgetError if recording ``guarantee`` would exceed the budget.

        Returns the composed (eps, delta) the ledger would show after recording it.
        Call it *before* starting a round: a refused round releases nothing.
        """
        self._check_unit(guarantee)
        eps, delta = self._compose([guarantee])
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

    def record(self, guarantee: Guarantee, round_id: int, *, note: str = "released",
               **extra) -> LedgerEntry:
        """Check the budget, then append the release (its event is the guarantee's). Returns
        the new entry.

        ``note``: the store's word on the release (a seeded run: NOT PRIVATE); ``extra``:
        what the ledger shows beside it (messages, clients, ...)."""
        self.check(guarantee)
        return self._append(LedgerEntry(int(round_id), guarantee, _shown(extra)), note)

    def record_spent(self, guarantee: Guarantee, round_id: int, *, note: str = "released",
                     reserve_left: tuple | None = None, **extra) -> LedgerEntry:
        """Append a release that has already happened, at its true cost, over budget or not.

        For a round released after its check (a job records it once release.npz is on
        disk), or one the server has opened but that missed its target (too few reports
        hid each other): refusing to record it would understate what was spent.
        ``reserve_left``: what the job's reservation keeps for its later rounds
        (BudgetStore.commit_round's ``left``).
        """
        self._check_unit(guarantee)
        return self._append(LedgerEntry(int(round_id), guarantee, _shown(extra)), note,
                            reserve_left)

    def _append(self, entry: LedgerEntry, note: str, reserve_left: tuple | None = None
                ) -> LedgerEntry:
        """One row in the store (the only write of a release): the event, the accountant's
        choices, what the run shows. A job's row is committed into its reservation."""
        g = entry.guarantee
        shown = {k: v for k, v in g.to_dict().items() if k not in ("accounting", "event")}
        meta = {"guarantee": shown, "extra": entry.extra, "accounting": g.accounting.to_dict()}
        if self.persistent:
            self.store.commit_round(self.identity, self.job_id, entry.round_id, g.eps, g.delta,
                                    event_to_dict(g.event), note=note, accounting=g.accounting,
                                    meta=meta, left=reserve_left)
        else:
            self.store.append_release(self.identity, self.job_id, entry.round_id, g.eps, g.delta,
                                      event_to_dict(g.event), note=note, accounting=g.accounting,
                                      meta=meta)
        return entry

    # ------------------------------------------------------------------ output
    @classmethod
    def from_dict(cls, d: dict) -> "PrivacyLedger | None":
        """The ledger a :meth:`to_dict` form shows (report.json's ``privacy.ledger``, a run's
        ledger.json), rebuilt in memory from its entries' events under its accountant and at
        its delta target: its totals and entries are the cost of the events again, whatever
        numbers the file shows beside them. None when an entry lacks its event or what it
        shows (a file written before entries carried them) or there is none: nothing to cost."""
        entries = d.get("entries") or []
        if not entries or not all(e.get("event") and e.get("model") and e.get("mechanism")
                                  for e in entries):
            return None
        budget = d.get("budget") or {}
        ledger = cls(budget_delta=budget.get("delta"), accountant=d.get("accountant") or "basic")
        for e in entries:
            ledger.record_spent(Guarantee.from_dict(e), int(e.get("round", 0)))
        return ledger

    def to_dict(self) -> dict:
        entries = self.entries
        eps, delta = self._compose()
        basic = self._composed.basic()
        return {"accountant": self.accountant,
                "budget": {"eps": self.budget_eps, "delta": self.budget_delta},
                "entries": [e.to_dict() for e in entries],
                "total": {"eps": eps, "delta": delta},
                "total_basic": {"eps": basic[0], "delta": basic[1]},
                "rounds": len({e.round_id for e in entries})}

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (temp file in the same folder, then os.replace)."""
        atomic_write_json(path, self.to_dict())


def recosted(privacy: dict) -> dict:
    """report.json's ``privacy`` section as a reader of the file should see it: every
    (eps, delta) it shows beside an event (the total, each round, the ledger's entries and
    totals) recomputed from the events, under the ledger's accountant and delta target; the
    numbers stored beside them are a cache, never read. A section whose ledger holds no
    events (written before entries carried them) is returned as it is."""
    ledger = PrivacyLedger.from_dict(privacy.get("ledger") or {})
    if ledger is None:
        return privacy
    now = ledger.to_dict()
    entries = [{**old, "eps": new["eps"], "delta": new["delta"]}
               for old, new in zip(privacy["ledger"]["entries"], now["entries"])]
    rounds = []
    for r in privacy.get("rounds") or []:
        if r.get("event"):
            g = Guarantee.from_dict(r)
            r = {**r, "eps": g.eps, "delta": g.delta}
        rounds.append(r)
    return {**privacy, **now["total"], "rounds": rounds,
            "ledger": {**privacy["ledger"], "entries": entries, "total": now["total"],
                       "total_basic": now["total_basic"]}}


def _shown(extra: dict) -> dict:
    """What an entry shows beside its guarantee; never the event (it is the guarantee's)."""
    if "event" in extra:
        raise TypeError("a release's event is its guarantee's (Guarantee.event); "
                        "record the guarantee alone")
    return dict(extra)


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (the project's one implementation: rknn_ray.runio)."""
    write_json(os.fspath(path), obj)

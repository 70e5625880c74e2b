"""The holder's own budget: the project's SQLite ledger, charged before anything is uploaded.

The source is the holder's own records (rknn_ray.accounting.budget_store: fingerprints
under the ledger's key); its budget is the holder's policy total. A specification is
charged once, under the job id ``spec-<hash>``: answering it again (a retry) finds the
release and charges nothing. A refusal (above the per-round policy, or the total would
pass the budget) is written to the ledger too, with its reason, and nothing is spent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from holder.accountant import OwnCost, SpecRefused
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.source_identity import record_fingerprints
from rknn_ray.errors import PrivacyBudgetError
from sealing.round_spec import RoundSpec


@dataclass(frozen=True)
class Policy:
    """What this holder allows its records: eps per round, eps and delta in total."""
    eps_round: float = math.inf
    eps_total: float = 10.0
    delta_total: float = 1e-5


def job_id_of(spec: RoundSpec) -> str:
    return f"spec-{spec.content_hash().hex()}"


class HolderLedger:
    """This holder's records as one source of its ledger, under its policy."""

    def __init__(self, ledger: str, dataset: str, inputs: np.ndarray, policy: Policy):
        self.store, self.policy, self.records = BudgetStore(ledger), policy, len(inputs)
        self.identity, self.description = self.store.source_identity(
            f"holder:{dataset}", record_fingerprints(inputs))
        if self.store.budget(self.identity) != (policy.eps_total, policy.delta_total):
            self.store.set_budget(self.identity, policy.eps_total, policy.delta_total,
                                  self.description, allow_lower=True)   # the policy as given now

    def answered(self, spec: RoundSpec) -> bool:
        """Already charged for this specification (a retry charges nothing)."""
        return bool(self.store.release_rows(self.identity, job_id_of(spec)))

    def refuse(self, spec: RoundSpec, why: str) -> SpecRefused:
        """The refusal, written to the ledger with its reason (nothing spent)."""
        line = f"refused {spec.job_id} round {spec.round}: {why}; nothing uploaded"
        self.store.record_refusal(self.identity, job_id_of(spec), line)
        return SpecRefused(f"{line} (ledger {self.store.path})")

    def charge(self, spec: RoundSpec, cost: OwnCost) -> None:
        """Charge the round before upload; SpecRefused (and written) if the policy forbids it."""
        store, policy, job = self.store, self.policy, job_id_of(spec)
        if cost.eps > policy.eps_round * (1 + 1e-9):
            raise self.refuse(spec, f"eps={cost.eps:.6g} is above this holder's per-round "
                              f"policy {policy.eps_round:g} ({cost.note})")
        try:
            store.reserve(self.identity, self.description, job, cost.eps, cost.delta,
                          (policy.eps_total, policy.delta_total), records=self.records)
        except PrivacyBudgetError:
            spent = store.spent(self.identity)
            raise self.refuse(spec, f"eps={cost.eps:.6g} would bring this holder's total to "
                              f"{spent.eps + cost.eps:.6g}, above its policy total "
                              f"{policy.eps_total:g} ({spent.releases} rounds answered)") from None
        store.commit_round(self.identity, job, spec.round, cost.eps, cost.delta, cost.event,
                           accounting=cost.costing, note=cost.note,
                           meta={"unit": "record", "note": cost.note, "spec_job": spec.job_id,
                                 "amplified_eps": cost.amplified_eps,
                                 "colluding_eps": cost.colluding_eps})
        store.close_job(self.identity, job, "charged in full for one specification")

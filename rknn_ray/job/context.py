"""The job context: everything one job's phases share, in one object instead of 13 parameters.

Made once by :func:`rknn_ray.job.run.run` after the data is loaded and the budget is
known; the private rounds (:mod:`.rounds`) and the finishing step (:mod:`.finish`) read
it. Its fields are fixed for the job except the encoder and the first round's queries,
which are fitted after the budget is reserved.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from rknn_ray.job.session import Parties
from rknn_ray.mechanisms.base import Mechanism
from rknn_ray.labeling.stage import round_query_counts
from rknn_ray.mechanisms.composed_rounds import RoundShare, round_shares
from rknn_ray.mechanisms.stage import mechanism_for


@dataclass
class JobContext:
    cfg: object                     # the validated config (auto choices resolved)
    data: object                    # rknn_ray.data.prepared.PreparedData
    out_dir: str                    # the prepared run folder
    progress: object                # rknn_ray.job.progress.Progress
    store: object                   # the persistent budget store (BudgetStore)
    identity: str                   # the records' source in the store (its budget)
    described: str                  # that source in words
    release_key: str                # this job's private part, as release.npz names it
    budget: tuple = (float("nan"), float("nan"))   # the source's (eps, delta) budget
    job_id: str = ""
    key_file: str | None = None
    parties: Parties = field(default_factory=Parties)
    auto_choice: dict | None = None  # what queries.s / rknn.k: auto chose (public)
    encoder: object = None
    public_emb: np.ndarray | None = None
    first_queries: object = None     # round 1's QuerySet
    #: when this job began (wall clock): a release saved before it was an earlier attempt's
    #: (``--resume``), which report.json's ``resumed`` records
    started_at: float = field(default_factory=time.time)

    def __post_init__(self):
        # data.name: the user's name for the source, shown by `rknn-ray budget` (public)
        name = getattr(getattr(self.cfg, "data", None), "name", None)
        if name and hasattr(self.store, "named"):
            self.described = self.store.named(self.identity, self.cfg.data.dataset, name)

    def round_budgets(self) -> list[RoundShare]:
        """Each round's share of privacy.eps and privacy.delta (and, where the rounds are
        calibrated together, its local eps0): rknn_ray.mechanisms.composed_rounds."""
        return round_shares(self.cfg, self.data)

    def round_sizes(self) -> list[int]:
        """New queries per round."""
        return round_query_counts(self.cfg)

    def round_mechanism(self, t: int, num_queries: int) -> Mechanism:
        """Round ``t``'s mechanism, calibrated for its share of the budget and its s."""
        share = self.round_budgets()[t]
        return mechanism_for(self.cfg, self.data, eps=share.eps, delta=share.delta,
                             num_queries=num_queries, eps0=share.eps0)

    def say(self, message: str) -> None:
        self.progress.say(message)

"""NfdpShard: one Ray actor hosting several FedMD-NFDP parties' local models.

Thin: the parties' subsampling, training, predicting and digesting live in
:class:`rknn_ray.baselines.nfdp.NfdpParties`; the actor only holds it between rounds.
:class:`RayParties` is the host ``run_nfdp(..., hosts=RayParties)`` drives (the library's
in-process host has the same shape), so the library itself never imports Ray.
"""
from __future__ import annotations

import ray
import torch

from rknn_ray.baselines.nfdp import NfdpParties


@ray.remote(num_cpus=0.5)
class NfdpShard:
    def __init__(self, parties_kwargs: dict):
        torch.set_num_threads(1)
        self.parties = NfdpParties(**parties_kwargs)

    def revisit(self, steps):
        self.parties.revisit(steps)

    def predict(self, queries, mode="softmax"):
        return self.parties.predict(queries, mode)

    def digest(self, queries, consensus, steps, mode="softmax"):
        self.parties.digest(queries, consensus, steps, mode)


class RayParties:
    """One NfdpShard actor per party group (needs a running Ray; the job starts it). Each
    group's records go by reference (``ray.put``): an argument passed by value is inlined in
    the GCS's copy of the actor's creation task when small."""

    def __init__(self, groups: list[dict]):
        self.actors = [NfdpShard.remote(ray.put(g)) for g in groups]

    def call(self, method: str, *args) -> list:
        return ray.get([getattr(a, method).remote(*args) for a in self.actors])

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)
        self.actors = []

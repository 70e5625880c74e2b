"""NfdpShard: one Ray actor hosting several FedMD-NFDP parties' local models.

Thin: the parties' subsampling, training, predicting and digesting live in
:class:`rknn_ray.baselines.nfdp.NfdpParties`; the actor only holds it between rounds.
"""
from __future__ import annotations

import ray

from rknn_ray.baselines.nfdp import NfdpParties


@ray.remote(num_cpus=0.5)
class NfdpShard:
    def __init__(self, xs, ys, k, replacement, num_classes, seed, rng_kind="secure"):
        import torch
        torch.set_num_threads(1)
        self.parties = NfdpParties(xs, ys, k, replacement, num_classes, seed, rng_kind=rng_kind)

    def revisit(self, steps):
        self.parties.revisit(steps)

    def predict(self, queries, mode="softmax"):
        return self.parties.predict(queries, mode)

    def digest(self, queries, consensus, steps, mode="softmax"):
        self.parties.digest(queries, consensus, steps, mode)

"""The job layer's sequences of stages that the library's own packages may not run: they
chain the data, the encoder, the queries and the mechanism's noise (rknn_ray.pipeline), so
what builds on them (the baselines' shared setup, the non-private reference) is a job.
"""
from __future__ import annotations

import time

from rknn_ray.baselines.common import BaselineSetup
from rknn_ray.pipeline import prepare_stages


def prepare_baseline(cfg) -> BaselineSetup:
    """Data, split, partition, encoder and queries exactly as ``jobs.distill`` makes them
    (``prepare_stages``, ``auto`` s and k resolved at cfg's eps), for every baseline."""
    t0 = time.perf_counter()
    st = prepare_stages(cfg, resolve=True)
    return BaselineSetup.from_stages(st, time.perf_counter() - t0)

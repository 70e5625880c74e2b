"""The baselines' shared setup: the stages a private run starts from (:mod:`.stages`), in
the representation space every baseline works in. Its own module: the baselines load torch
at import, the job itself does not.
"""
from __future__ import annotations

import time

from rknn_ray.baselines.common import BaselineSetup
from rknn_ray.job.stages import prepare_stages


def prepare_baseline(cfg) -> BaselineSetup:
    """Data, split, partition, encoder and queries exactly as ``jobs.distill`` makes them
    (``prepare_stages``, ``auto`` s and k resolved at cfg's eps), for every baseline."""
    t0 = time.perf_counter()
    st = prepare_stages(cfg, resolve=True)
    return BaselineSetup.from_stages(st, time.perf_counter() - t0)

"""A training loop in this process: one worker, CPU or the local GPU, no Ray."""
from __future__ import annotations

import os
import time

import torch

from rknn_ray.errors import ConfigError
from rknn_ray.training.loop import LoopRun, resolve_loop


def local_device(use_gpu: bool | None) -> torch.device:
    """CUDA when asked for (``None``: when torch sees one), else the CPU."""
    gpu = torch.cuda.is_available() if use_gpu is None else bool(use_gpu)
    if gpu and not torch.cuda.is_available():
        raise ConfigError("student.use_gpu", "a GPU was requested but torch sees none",
                          "set student.use_gpu=false (or null for auto)")
    return torch.device("cuda" if gpu else "cpu")


def fit_local(loop, data, cfg: dict, *, use_gpu: bool | None = None, on_epoch=None,
              threads: int | None = None) -> LoopRun:
    """Run ``loop(data, cfg, device, on_epoch)`` here with ``threads`` torch threads
    (``RKNN_RAY_TORCH_THREADS`` overrides; on a CPU shared with other jobs fewer threads
    than cores avoid OpenMP spin contention); the thread count is restored afterwards."""
    device = local_device(use_gpu)
    fn = resolve_loop(loop)
    before = torch.get_num_threads()
    want = os.environ.get("RKNN_RAY_TORCH_THREADS") or threads
    torch.set_num_threads(max(1, int(want)) if want else before)
    t0 = time.perf_counter()
    try:
        payload = fn(data, cfg, device, on_epoch)
    finally:
        torch.set_num_threads(before)
    return LoopRun(payload, str(device), 1, {"loop": time.perf_counter() - t0})

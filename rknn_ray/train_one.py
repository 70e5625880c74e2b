"""Run one training loop in a Ray Train ``TorchTrainer`` with a single worker.

The contrastive encoder and the semi-supervised student train this way, like the
supervised student does: the worker gets the data through the object store, runs
``loop(data, config, device) -> payload`` (a dict of tensors and plain values),
and reports the payload as its checkpoint; the driver loads it back. On a GPU
cluster the worker takes a GPU; on CPU it takes the free CPUs of one node (at most
``max_cpus``) and as many torch threads (``RKNN_RAY_TORCH_THREADS`` overrides: on
a CPU shared with other jobs, 1 thread is often faster than 2 that contend).
"""
from __future__ import annotations

import importlib
import os
import tempfile
import uuid

import torch

from rknn_ray.errors import RknnError

PAYLOAD_FILE = "payload.pt"


def _worker(config: dict) -> None:
    import ray
    import ray.train
    import ray.train.torch
    torch.set_num_threads(max(1, int(os.environ.get("RKNN_RAY_TORCH_THREADS") or config["threads"])))
    module, name = config["loop"].rsplit(":", 1)
    loop = getattr(importlib.import_module(module), name)
    data = ray.get(config["data_ref"])
    payload = loop(data, config["loop_config"], ray.train.torch.get_device())
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(payload, os.path.join(tmp, PAYLOAD_FILE))
        ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def fit_one_worker(loop: str, data, loop_config: dict, name: str, use_gpu: bool | None = None,
                   max_cpus: int | None = None) -> dict:
    """Run ``loop`` ("module:function") on ``data`` in a one-worker TorchTrainer; returns its payload."""
    if not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    if not ray.is_initialized():
        ray.init() if os.environ.get("RAY_ADDRESS") else ray.init(include_dashboard=False)
    from rknn_ray.student.train import fit_off_main_thread, quiet_train_logs
    quiet_train_logs()
    free = ray.available_resources()
    gpu = free.get("GPU", 0) >= 1 if use_gpu is None else bool(use_gpu)
    cpus = max(1, int(min(free.get("CPU", 1), max_cpus or os.cpu_count() or 1)))
    config = {"loop": loop, "loop_config": loop_config, "threads": cpus,
              "data_ref": ray.put(data)}
    trainer = TorchTrainer(
        _worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=1, use_gpu=gpu, resources_per_worker={"CPU": cpus}),
        run_config=RunConfig(name=f"{name}-{uuid.uuid4().hex[:8]}",
                             storage_path=os.path.join(tempfile.gettempdir(), "rknn_ray_one_worker"),
                             failure_config=FailureConfig(max_failures=0)))
    result = fit_off_main_thread(trainer)      # the caller's signal handlers stay in charge
    if result.checkpoint is None:
        raise RknnError(f"Ray Train finished {name} without a checkpoint; see the worker logs above")
    with result.checkpoint.as_directory() as d:
        return torch.load(os.path.join(d, PAYLOAD_FILE), map_location="cpu", weights_only=False)

"""Every training loop of the project, run one way: in this process or on Ray Train.

A loop is a plain function ``loop(data, cfg, device, on_epoch) -> payload`` (the shape of
Ray Train's ``train_loop_per_worker`` examples): it trains on ``data`` as ``cfg`` says,
calls ``on_epoch(row)`` after each epoch (when given), and returns a dict of tensors and
plain values with the per-epoch rows under ``"history"``. The supervised student
(rknn_ray/student/train.py), the semi-supervised student (rknn_ray/student/semi.py) and the
SimCLR encoder (rknn_ray/representation/contrastive.py) are such loops.

:func:`run_loop` runs one where ``trainer`` says: :func:`.local.fit_local` (this process,
one worker) or :func:`.ray_train.fit_on_ray` (a ``TorchTrainer`` of ``num_workers``
workers, DDP when more than one). Neither starts Ray: on Ray Train the caller starts it
first (rknn_ray.job.ray_env.ensure_ray). A loop that runs on several workers asks
:func:`rank_and_world` for its shard and wraps its model with :func:`distribute`.

The package imports without torch: a process that needs only :mod:`.live` (the epoch
relay's actor, a process of its own per Ray Train fit) would otherwise import torch for
nothing (1.4 CPU s here), so torch is imported where it is used.
"""
from __future__ import annotations

from typing import Callable

from rknn_ray.errors import ConfigError
from rknn_ray.training.loop import LoopRun, resolve_loop

TRAINERS = ("ray", "local")
__all__ = ["TRAINERS", "LoopRun", "resolve_loop", "rank_and_world", "one_cycle", "distribute",
           "run_loop"]


def rank_and_world() -> tuple[int, int]:
    """(this worker's rank, the number of workers): (0, 1) outside a process group."""
    import torch  # defers torch: the package imports without it (see the note below)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def one_cycle(opt, max_lr, total_steps: int, pct_start: float):
    """torch's OneCycleLR, except where it cannot run: its warm-up phase ends at step
    ``pct_start * total_steps - 1``, and at exactly 0 it divides by zero (e.g. 1 epoch of 10
    steps at pct_start 0.1); there the warm-up takes 2 steps, and under 3 steps the rate is
    constant."""
    import torch  # defers torch
    total_steps = int(total_steps)
    if total_steps < 3:
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if float(pct_start * total_steps) - 1 == 0:
        pct_start = 2.0 / total_steps
    return torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lr, total_steps=total_steps,
                                               pct_start=pct_start)


def distribute(model, device):
    """``model`` on ``device``, wrapped in DDP when several workers train it (what
    ``ray.train.torch.prepare_model`` does, written so that the loop also runs in-process)."""
    import torch  # defers torch
    from torch.nn.parallel import DistributedDataParallel
    device = torch.device(device)
    if device.type == "cuda" and device.index is not None:   # a Ray Train worker's cuda:N
        torch.cuda.set_device(device)       # (in-process "cuda" is the current device already)
    model = model.to(device)
    if rank_and_world()[1] > 1:
        kw = {"device_ids": [device], "output_device": device} if device.type == "cuda" else {}
        model = DistributedDataParallel(model, **kw)
    return model


def run_loop(loop: str | Callable, data, cfg: dict, *, trainer: str = "local", name: str = "train",
             num_workers: int = 1, use_gpu: bool | None = None, on_epoch=None,
             storage_path: str | None = None, threads: int | None = None,
             trainer_key: str = "student.trainer") -> LoopRun:
    """Run ``loop`` on ``data`` with ``cfg``: on Ray Train (``trainer="ray"``) or here.

    ``on_epoch(row)`` gets each epoch's row as it ends (from rank 0 on Ray Train).
    ``threads``: torch threads in this process (local only; ``RKNN_RAY_TORCH_THREADS``
    overrides). ``trainer_key`` names the config key in the errors.
    """
    if trainer == "ray":
        from rknn_ray.training import ray_train  # defers torch and ray.train
        return ray_train.fit_on_ray(loop, data, cfg, name=name, num_workers=num_workers,
                                    use_gpu=use_gpu, on_epoch=on_epoch, storage_path=storage_path,
                                    trainer_key=trainer_key)
    if trainer != "local":
        raise ConfigError(trainer_key, f"unknown trainer {trainer!r}", f"use one of {TRAINERS}")
    from rknn_ray.training.local import fit_local  # defers torch
    return fit_local(loop, data, cfg, use_gpu=use_gpu, on_epoch=on_epoch, threads=threads)

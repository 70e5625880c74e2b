"""The supervised student: its training loop and the two ways to run it.

:func:`supervised_loop` is one :mod:`rknn_ray.training` loop: ``train_student`` runs it on
Ray Train (DDP over ``num_workers`` workers; GPU when the cluster has one),
``train_student_local`` in this process; both through :func:`rknn_ray.training.run_loop`,
so the same seed gives the same student on one worker either way. With several workers
each trains on a fixed, equal-size shard of the labelled rows (like Ray Data's shards),
so every rank takes the same number of steps; ``batch_size`` is the global batch, split
evenly over workers. Rank 0's weights come back as the payload; the driver writes
``student.pt`` and ``history.json`` and computes test accuracy from the written
checkpoint, which also proves it is usable.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from rknn_ray.errors import ConfigError, DataError
from rknn_ray.runio import save_torch, write_json
from rknn_ray.student.config import (CHECKPOINT_FILE, HISTORY_FILE,  # noqa: F401 - named here too
                                     StudentConfig)  # declared torch-free, with every student key
from rknn_ray.student.models import build_model, hard_label_loss, resolve_arch, soft_label_loss
from rknn_ray.training import distribute, rank_and_world, run_loop


@dataclass
class StudentResult:
    """What a training run produced; ``history`` has one dict per epoch."""

    test_accuracy: float
    train_loss: float
    epochs: int
    history: list[dict] = field(default_factory=list)
    checkpoint_path: str | None = None
    seconds: float = 0.0
    num_workers: int = 1
    device: str = "cpu"
    train_seconds: float = 0.0  # inside the epoch loop; seconds - train_seconds is setup/overhead
    timings: dict = field(default_factory=dict)  # stage -> seconds (Ray: startup, setup, train, shutdown...)

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- data checks

def _check_inputs(train_x, train_targets, test_x, test_y, image_shape, num_classes, label_type,
                  sample_weight):
    """Validate shapes/labels and drop zero-weight (unlabeled) rows; returns (x, t, w|None)."""
    shape = tuple(int(s) for s in image_shape)
    x = np.asarray(train_x, dtype=np.float32)
    if x.ndim < 1 or tuple(x.shape[1:]) != shape:
        raise DataError(f"train_x has shape {x.shape}, expected (N, *{shape}); "
                        "reshape the public data to the image_shape you pass")
    n = x.shape[0]
    t = np.asarray(train_targets)
    if t.shape[0] != n:
        raise DataError(f"train_targets has {t.shape[0]} rows but train_x has {n}; pass one target per row")
    if label_type == "hard":
        if t.ndim != 1:
            raise ConfigError("student.label_type", f"'hard' needs (N,) integer labels, got shape {t.shape}",
                              "pass argmax labels, or set student.label_type=soft for distributions")
        if not np.issubdtype(t.dtype, np.integer):
            raise DataError(f"hard labels must be integers, got dtype {t.dtype}; cast them with .astype(int64)")
        t = t.astype(np.int64)
    else:
        if t.ndim == 1:  # integer labels are one-hot distributions
            if not np.issubdtype(t.dtype, np.integer):
                raise DataError(f"soft targets need shape (N, {num_classes}) or integer labels, "
                                f"got {t.dtype} {t.shape}")
            t = np.eye(num_classes, dtype=np.float32)[np.clip(t, 0, num_classes - 1)] * \
                ((t >= 0) & (t < num_classes))[:, None]
        elif t.ndim != 2 or t.shape[1] != num_classes:
            raise DataError(f"soft targets have shape {t.shape}, expected (N, {num_classes})")
        t = t.astype(np.float32)
    if sample_weight is None:
        w = np.ones(n, dtype=np.float32)
    else:
        w = np.asarray(sample_weight, dtype=np.float32)
        if w.shape != (n,) or not np.all(np.isfinite(w)) or np.any(w < 0):
            raise DataError(f"sample_weight must be (N,)={n} finite, non-negative floats; got shape {w.shape}")
    keep = w > 0
    if not np.all(np.isfinite(x[keep])):
        raise DataError("train_x contains NaN or inf in labelled rows; clean or drop those rows")
    if label_type == "hard":
        bad = keep & ((t < 0) | (t >= num_classes))
        if bad.any():
            raise DataError(f"{int(bad.sum())} labelled rows have labels outside [0, {num_classes}); "
                            "give unlabeled rows sample_weight=0")
    else:
        sums = t.sum(axis=1)
        bad = keep & ((np.abs(sums - 1) > 1e-3) | np.any(t < 0, axis=1))
        if bad.any():
            raise DataError(f"{int(bad.sum())} labelled soft-target rows are not distributions (each "
                            "row must be >= 0 and sum to 1); give unlabeled rows sample_weight=0")
    if not keep.any():
        raise DataError("no labelled training rows (every sample_weight is 0); nothing to train on")
    x, t, w = x[keep], t[keep], w[keep]
    tx = np.asarray(test_x, dtype=np.float32)
    ty = np.asarray(test_y)
    if tuple(tx.shape[1:]) != shape or ty.shape != (tx.shape[0],):
        raise DataError(f"test_x {tx.shape} / test_y {ty.shape} do not match image_shape {shape}")
    return x, t, (None if np.all(w == 1) else w)


# ----------------------------------------------------------------------------- the loop

def random_shift(xb: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Translate each image by up to max(1, H//8) pixels (zero fill): cheap augmentation
    that helps a CNN trained on a few hundred labelled images generalize."""
    if xb.ndim != 4:
        return xb
    h, w = xb.shape[-2:]
    m = max(1, h // 8)
    padded = torch.nn.functional.pad(xb, (m, m, m, m))
    dy = torch.randint(0, 2 * m + 1, (xb.shape[0],), generator=gen)
    dx = torch.randint(0, 2 * m + 1, (xb.shape[0],), generator=gen)
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(xb.device)       # (B, H)
    cols = (dx[:, None] + torch.arange(w)[None, :]).to(xb.device)       # (B, W)
    b = torch.arange(xb.shape[0], device=xb.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[b, rows[:, :, None], cols[:, None, :]]
    # a real copy in NCHW order: with one channel, .contiguous() keeps the channels-last
    # strides, the conv weight grads follow them and DDP warns about bucket view strides
    return out.permute(0, 3, 1, 2).clone(memory_format=torch.contiguous_format)

def _shard_indices(n: int, seed: int, rank: int, world: int) -> np.ndarray:
    """Rank's fixed shard of a seeded permutation, padded so every rank has ceil(n/world) rows."""
    perm = np.random.default_rng([seed, 7]).permutation(n)
    per = -(-n // world)
    perm = np.resize(perm, per * world)   # wraps around: pads with the first rows, like DistributedSampler
    return perm[rank::world]


def _run_epochs(model, x, t, w, cfg: dict, device, rank: int, world: int,
                on_epoch: Callable[[dict], None] | None = None) -> list[dict]:
    """Adam over shuffled mini-batches of this rank's rows; returns the per-epoch history."""
    loss_fn = soft_label_loss if cfg["label_type"] == "soft" else hard_label_loss
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    xs = torch.as_tensor(x, device=device)
    ts = torch.as_tensor(t, device=device)
    ws = None if w is None else torch.as_tensor(w, device=device)
    hard_t = ts if ts.ndim == 1 else ts.argmax(dim=1)
    n = xs.shape[0]
    bs = max(1, int(cfg["batch_size"]) // world)
    dist = torch.distributed.is_available() and torch.distributed.is_initialized() and world > 1
    history = []
    augment = cfg.get("augment", "none") == "shift"
    gen = torch.Generator().manual_seed(int(cfg["seed"]) * 1000 + rank)
    for epoch in range(int(cfg["epochs"])):
        model.train()
        order = torch.as_tensor(np.random.default_rng([cfg["seed"], epoch, rank]).permutation(n), device=device)
        stats = torch.zeros(3, dtype=torch.float64, device=device)  # loss*weight, weight, correct*weight
        for start in range(0, n, bs):
            idx = order[start:start + bs]
            wb = None if ws is None else ws[idx]
            xb = random_shift(xs[idx], gen) if augment else xs[idx]
            logits = model(xb)
            loss = loss_fn(logits, ts[idx], wb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                wsum = torch.tensor(float(idx.numel()), device=device) if wb is None else wb.sum()
                correct = (logits.argmax(1) == hard_t[idx]).to(torch.float64)
                csum = correct.sum() if wb is None else (correct * wb).sum()
                stats += torch.stack([loss.detach().double() * wsum, wsum.double(), csum])
        if dist:
            torch.distributed.all_reduce(stats)
        denom = max(float(stats[1]), 1e-12)
        row = {"epoch": epoch + 1, "train_loss": float(stats[0]) / denom,
               "train_accuracy": float(stats[2]) / denom}
        history.append(row)
        if on_epoch is not None:
            on_epoch(row)
    return history


def _checkpoint_payload(model, meta: dict) -> dict:
    inner = model.module if hasattr(model, "module") else model
    return {"state_dict": {k: v.detach().cpu() for k, v in inner.state_dict().items()}, **meta}


def supervised_loop(data: tuple, cfg: dict, device, on_epoch=None) -> dict:
    """The supervised student's loop on ``data`` = (x, targets, weights|None), in-process or
    on each Ray Train worker. With several workers each trains on its rank's shard under DDP
    (one worker keeps every row in the given order). Returns {"checkpoint": what student.pt
    holds, "history", "train_seconds"} (rank 0's is the one kept)."""
    x, t, w = data
    rank, world = rank_and_world()
    seed = int(cfg["seed"])
    if world > 1:
        idx = _shard_indices(x.shape[0], seed, rank, world)
        x, t = np.ascontiguousarray(x[idx]), np.ascontiguousarray(t[idx])
        w = None if w is None else np.ascontiguousarray(w[idx])
    torch.manual_seed(seed)                 # same init on all ranks (DDP also broadcasts rank 0's)
    model = distribute(build_model(cfg["image_shape"], cfg["num_classes"], cfg["arch"]), device)
    torch.manual_seed(seed * 1000 + rank)   # per-rank dropout and augmentation streams
    t0 = time.perf_counter()
    history = _run_epochs(model, x, t, w, cfg, device, rank, world, on_epoch=on_epoch)
    return {"checkpoint": _checkpoint_payload(model, cfg["meta"]), "history": history,
            "train_seconds": time.perf_counter() - t0}


# ----------------------------------------------------------------------------- public API

def load_student(path: str) -> torch.nn.Module:
    """The trained student (eval mode, CPU) from a ``student.pt`` file or a checkpoint folder."""
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_FILE)
    if not os.path.isfile(path):
        raise DataError(f"no student checkpoint at {path}; pass the student.pt a training run wrote")
    return _model_from(torch.load(path, map_location="cpu", weights_only=True))


def _model_from(payload: dict) -> torch.nn.Module:
    model = build_model(tuple(payload["image_shape"]), int(payload["num_classes"]), payload["arch"])
    model.load_state_dict(payload["state_dict"])
    return model.eval()


@torch.no_grad()
def predict(model: torch.nn.Module, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
    """Argmax class per row of ``x`` (CPU, batched)."""
    model.eval()
    xs = torch.as_tensor(np.asarray(x, dtype=np.float32))
    out = [model(xs[i:i + batch_size]).argmax(1) for i in range(0, xs.shape[0], batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


def accuracy(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of rows of ``x`` the model labels as ``y`` (Acc_pc)."""
    y = np.asarray(y)
    return float(np.mean(predict(model, x) == y)) if y.size else float("nan")


def _meta(image_shape, num_classes, arch, config: StudentConfig) -> dict:
    return {"image_shape": [int(s) for s in image_shape], "num_classes": int(num_classes),
            "arch": resolve_arch(image_shape, arch), "config": asdict(config)}


def _loop_config(config: StudentConfig, image_shape, num_classes, meta: dict) -> dict:
    return {"epochs": int(config.epochs), "batch_size": int(config.batch_size), "lr": float(config.lr),
            "weight_decay": float(config.weight_decay), "label_type": config.label_type,
            "seed": int(config.seed), "arch": meta["arch"], "augment": config.augment, "image_shape": tuple(int(s) for s in image_shape),
            "num_classes": int(num_classes), "meta": meta}


def train_student_local(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                        config: StudentConfig | None = None, storage_path: str | None = None,
                        checkpoint_dir: str | None = None, progress: Callable[[dict], None] | None = None,
                        sample_weight: np.ndarray | None = None) -> StudentResult:
    """Train in this process with the loop the Ray Train workers run (one worker, CPU or local GPU).

    ``progress(row)`` is called after every epoch with ``{"epoch", "train_loss", "train_accuracy"}``.
    The checkpoint goes to ``checkpoint_dir`` (else ``storage_path``) as ``student.pt``.
    """
    return _train("local", train_x, train_targets, test_x, test_y, image_shape, num_classes,
                  config, storage_path, checkpoint_dir, progress, sample_weight)


def train_student(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                  config: StudentConfig | None = None, storage_path: str | None = None,
                  checkpoint_dir: str | None = None, progress: Callable[[dict], None] | None = None,
                  sample_weight: np.ndarray | None = None) -> StudentResult:
    """Train with Ray Train (``TorchTrainer``, DDP over ``config.num_workers`` workers).

    Needs a running Ray (rknn_ray.job.ray_env.ensure_ray first; none is started here).
    ``storage_path`` is Ray Train's storage (the run folder; Train's own folder there is
    removed afterwards); ``student.pt`` and ``history.json`` go to ``checkpoint_dir`` (else
    ``storage_path``). ``progress(row)`` is called for each epoch while training runs
    (:mod:`rknn_ray.training.live`).
    """
    return _train("ray", train_x, train_targets, test_x, test_y, image_shape, num_classes,
                  config, storage_path, checkpoint_dir, progress, sample_weight)


def _train(trainer, train_x, train_targets, test_x, test_y, image_shape, num_classes, config,
           storage_path, checkpoint_dir, progress, sample_weight) -> StudentResult:
    config = (config or StudentConfig()).validate()
    t_start = time.perf_counter()
    x, t, w = _check_inputs(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                            config.label_type, sample_weight)
    meta = _meta(image_shape, num_classes, config.arch, config)
    # in-process: small nets on shared CPUs, fewer threads than cores avoid OpenMP spin contention
    threads = max(1, min(torch.get_num_threads(), (os.cpu_count() or 2) // 2))
    run = run_loop(supervised_loop, (x, t, w), _loop_config(config, image_shape, num_classes, meta),
                   trainer=trainer, name="student", use_gpu=config.use_gpu, on_epoch=progress,
                   num_workers=config.num_workers if trainer == "ray" else 1,
                   storage_path=storage_path, threads=threads, trainer_key="student.trainer")
    out, history = run.payload, run.payload["history"]
    ckpt_path = None
    out_dir = checkpoint_dir or storage_path
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
        save_torch(ckpt_path, out["checkpoint"])            # never a truncated student.pt
        write_json(os.path.join(out_dir, HISTORY_FILE), history)
        model = load_student(ckpt_path)
    else:
        model = _model_from(out["checkpoint"])
    t_eval = time.perf_counter()
    test_acc = accuracy(model, test_x, test_y)
    timings = {**{k: v for k, v in run.timings.items() if k != "loop"},
               "train": float(out["train_seconds"]), "evaluate": time.perf_counter() - t_eval}
    return StudentResult(test_accuracy=test_acc, train_loss=history[-1]["train_loss"],
                         epochs=len(history), history=history, checkpoint_path=ckpt_path,
                         seconds=time.perf_counter() - t_start, num_workers=run.num_workers,
                         device=run.device, train_seconds=float(out["train_seconds"]),
                         timings={k: round(v, 3) for k, v in timings.items()})

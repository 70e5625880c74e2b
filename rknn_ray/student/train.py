"""Training the student: one loop, run by Ray Train workers or in-process.

``train_student`` runs the loop in a Ray Train ``TorchTrainer`` (DDP over
``num_workers`` workers; GPU when the cluster has one); ``train_student_local``
runs the very same loop in this process, for tests and machines without a cluster.
Each worker trains on a fixed, equal-size shard of the labelled rows (like Ray
Data's shards), so every rank takes the same number of steps; ``batch_size`` is the
global batch, split evenly over workers. Rank 0 saves the final weights as a
checkpoint and reports the metrics with it (Train V2 keeps metrics only when a
checkpoint rides along). Test accuracy is computed on the driver after loading that
checkpoint, which also proves the checkpoint is usable. Per-epoch metrics reach the
driver while training runs through :mod:`rknn_ray.student.live`.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from rknn_ray.errors import ConfigError, DataError, RknnError
from rknn_ray.runio import atomic_path, copy_file, write_json
from rknn_ray.student.config import StudentConfig     # declared torch-free, with every student key
from rknn_ray.student.models import build_model, hard_label_loss, resolve_arch, soft_label_loss

CHECKPOINT_FILE = "student.pt"
HISTORY_FILE = "history.json"
_STATE_API_NOISE = "State API may be temporarily unavailable"


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


def _train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point: each worker trains its shard under DDP; rank 0 checkpoints."""
    import ray
    import ray.train
    import ray.train.torch

    entered = time.time()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if world >= 2:
        torch.set_num_threads(1)
    x, t, w = ray.get(config["data_ref"])
    idx = _shard_indices(x.shape[0], int(config["seed"]), rank, world)
    x, t = np.ascontiguousarray(x[idx]), np.ascontiguousarray(t[idx])
    w = None if w is None else np.ascontiguousarray(w[idx])
    torch.manual_seed(int(config["seed"]))  # same init on all ranks (DDP also broadcasts rank 0's)
    model = build_model(config["image_shape"], config["num_classes"], config["arch"])
    torch.manual_seed(int(config["seed"]) * 1000 + rank)  # per-rank dropout streams
    model = ray.train.torch.prepare_model(model)
    device = ray.train.torch.get_device()
    t0 = time.perf_counter()
    started = time.time()
    from rknn_ray.student.live import quiet_worker_console, relay_pusher
    quiet_worker_console()          # Train's INFO lines go to Ray's log folder, not the console
    history = _run_epochs(model, x, t, w, config, device, rank, world,      # live epochs (rank 0)
                          on_epoch=relay_pusher(config.get("epoch_relay") if rank == 0 else None))
    metrics = {"train_loss": history[-1]["train_loss"], "train_accuracy": history[-1]["train_accuracy"],
               "epochs": len(history), "train_seconds": time.perf_counter() - t0, "device": str(device),
               "world_size": world, "entered_at": entered, "started_at": started, "ended_at": time.time()}
    if rank == 0:  # the per-epoch history rides in the checkpoint, keeping Train's metric logs short
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(_checkpoint_payload(model, config["meta"]), os.path.join(tmp, CHECKPOINT_FILE))
            with open(os.path.join(tmp, HISTORY_FILE), "w") as f:
                json.dump(history, f)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
    else:
        ray.train.report(metrics, checkpoint=None)


# ----------------------------------------------------------------------------- public API

def load_student(path: str) -> torch.nn.Module:
    """The trained student (eval mode, CPU) from a ``student.pt`` file or a checkpoint folder."""
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_FILE)
    if not os.path.isfile(path):
        raise DataError(f"no student checkpoint at {path}; pass the student.pt a training run wrote")
    payload = torch.load(path, map_location="cpu", weights_only=True)
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
    """Train in this process with the same loop as the Ray workers (one worker, CPU or local GPU).

    ``progress(row)`` is called after every epoch with ``{"epoch", "train_loss", "train_accuracy"}``.
    The checkpoint goes to ``checkpoint_dir`` (else ``storage_path``) as ``student.pt``.
    """
    config = (config or StudentConfig()).validate()
    t_start = time.perf_counter()
    x, t, w = _check_inputs(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                            config.label_type, sample_weight)
    meta = _meta(image_shape, num_classes, config.arch, config)
    cfg = _loop_config(config, image_shape, num_classes, meta)
    use_gpu = torch.cuda.is_available() if config.use_gpu is None else bool(config.use_gpu)
    if use_gpu and not torch.cuda.is_available():
        raise ConfigError("student.use_gpu", "a GPU was requested but torch sees none",
                          "set student.use_gpu=false (or null for auto)")
    device = torch.device("cuda" if use_gpu else "cpu")
    torch.manual_seed(config.seed)
    model = build_model(image_shape, num_classes, meta["arch"]).to(device)
    torch.manual_seed(config.seed * 1000)
    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    # small nets on shared CPUs: fewer threads than cores avoids OpenMP spin contention
    torch.set_num_threads(max(1, min(threads, (os.cpu_count() or 2) // 2)))
    try:
        history = _run_epochs(model, x, t, w, cfg, device, rank=0, world=1, on_epoch=progress)
    finally:
        torch.set_num_threads(threads)
    train_seconds = time.perf_counter() - t0
    ckpt_path = None
    out_dir = checkpoint_dir or storage_path
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        ckpt_path = os.path.join(out_dir, CHECKPOINT_FILE)
        with atomic_path(ckpt_path) as tmp:
            torch.save(_checkpoint_payload(model, meta), tmp)
        write_json(os.path.join(out_dir, HISTORY_FILE), history)
        model = load_student(ckpt_path)
    else:
        model = model.cpu()
    t_eval = time.perf_counter()
    test_acc = accuracy(model, test_x, test_y)
    timings = {"train": train_seconds, "evaluate": time.perf_counter() - t_eval}
    return StudentResult(test_accuracy=test_acc, train_loss=history[-1]["train_loss"],
                         epochs=len(history), history=history, checkpoint_path=ckpt_path,
                         seconds=time.perf_counter() - t_start, num_workers=1, device=str(device),
                         train_seconds=train_seconds, timings={k: round(v, 3) for k, v in timings.items()})


class _DropStateApiNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _STATE_API_NOISE not in record.getMessage()


def quiet_train_logs() -> None:
    """Hide Train V2's harmless 'State API may be temporarily unavailable' warnings.

    With the dashboard off, Train's detached ``PlacementGroupCleaner`` actor (logger
    ``ray.train.v2._internal.execution.controller.placement_group_cleaner``) polls the
    State API every second and warns each time. Those lines reach the driver through
    Ray's log forwarding, so the filter goes in two places: on that logger in this
    process (which is what a ``worker_process_setup_hook`` calling this does in every
    worker), and on the forwarded worker output this driver prints.
    """
    logger = logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner")
    if not any(isinstance(f, _DropStateApiNoise) for f in logger.filters):
        logger.addFilter(_DropStateApiNoise())
    _filter_forwarded_worker_logs()


def _filter_forwarded_worker_logs() -> None:
    """Drop the noise lines from the worker output the driver prints (cosmetic; Ray-internal API).

    Ray hands each batch of forwarded worker lines to the handlers of
    ``ray._private.ray_logging.global_worker_stdstream_dispatcher``; we wrap them once.
    If a future Ray moves that object, nothing breaks: the warnings simply show again.
    """
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        with dispatcher._lock:
            wrapped = []
            for name, handler in dispatcher.handlers:
                if not getattr(handler, "_rknn_quiet", False):
                    handler = _without_noise(handler)
                wrapped.append((name, handler))
            dispatcher.handlers = wrapped
    except Exception:  # noqa: BLE001 - purely cosmetic
        logging.getLogger(__name__).debug("could not filter forwarded Ray worker logs", exc_info=True)


def _without_noise(handler: Callable[[dict], None]) -> Callable[[dict], None]:
    from rknn_ray.student.live import CleanerTracebackFilter
    cleaner = CleanerTracebackFilter()      # the same cleaner's known traceback (see there)

    def emit(data: dict) -> None:
        lines = data.get("lines")
        if lines and data.get("actor_name") == "PlacementGroupCleaner":
            lines = cleaner(data)
            if not lines:
                return
            data = {**data, "lines": lines}
        if lines and any(_STATE_API_NOISE in line for line in lines):
            lines = [line for line in lines if _STATE_API_NOISE not in line]
            if not lines:
                return
            data = {**data, "lines": lines}
        handler(data)
    emit._rknn_quiet = True  # type: ignore[attr-defined]
    return emit


#: fit() threads (their "done" events) the driver stopped waiting for: an interrupt reached it.
ABANDONED_FITS: list = []


def join_abandoned_fits(timeout: float = 30.0) -> bool:
    """After ``ray.shutdown()``: wait for the fit() threads an interrupt left running (their
    Ray calls fail once Ray is down). A process that exits while one is still inside Ray's
    native code can crash in interpreter shutdown (SIGSEGV instead of the job's 130/143).
    True when none is left."""
    import time
    end = time.monotonic() + timeout
    while ABANDONED_FITS:               # events, not Thread.is_alive: on 3.11 a join that an
        if not ABANDONED_FITS[0].wait(max(0.0, end - time.monotonic())):  # interrupt cut
            return False                # short marks the thread stopped while it still runs
        ABANDONED_FITS.pop(0)
    return True


def fit_off_main_thread(trainer):
    """``trainer.fit()`` in a helper thread, the main thread waiting on it.

    Ray Train v2 installs its own SIGINT handler when ``fit()`` runs on the main thread
    (it calls ``sys.exit`` and stays installed after ``fit()`` returns). Off the main
    thread it installs none, so the caller's SIGINT/SIGTERM handlers stay in charge: an
    interrupt reaches the driver as its own exception, and ending the driver's Ray
    (``ray.shutdown``) ends the run.
    """
    import threading
    box: dict = {}
    done = threading.Event()

    def target():
        try:
            box["result"] = trainer.fit()
        except BaseException as exc:          # handed to the main thread as it is
            box["error"] = exc
        finally:
            done.set()
    thread = threading.Thread(target=target, name="ray-train-fit", daemon=True)
    thread.start()
    try:
        while not done.wait(0.2):             # short waits: signals run between them
            pass
    except BaseException:
        ABANDONED_FITS.append(done)           # still inside fit(): see join_abandoned_fits
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]


def train_student(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                  config: StudentConfig | None = None, storage_path: str | None = None,
                  checkpoint_dir: str | None = None, progress: Callable[[dict], None] | None = None,
                  sample_weight: np.ndarray | None = None) -> StudentResult:
    """Train with Ray Train (``TorchTrainer``, DDP over ``config.num_workers`` workers).

    Needs a running Ray (``ray.init`` first; a local one is started if none is).
    ``storage_path`` is Ray Train's storage (the run folder); the final checkpoint is
    also copied to ``checkpoint_dir/student.pt`` when given. ``progress(row)`` is called
    for each epoch while training runs (rank 0 pushes every epoch to a relay actor
    that a driver thread polls: :mod:`rknn_ray.student.live`), once per epoch. Train's
    own INFO lines stay in Ray's log folder.
    """
    if "ray" not in sys.modules and not os.environ.get("RAY_ADDRESS"):
        # a Ray we may start below stays on loopback; Ray reads this once, at import
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    config = (config or StudentConfig()).validate()
    t_start = time.perf_counter()
    x, t, w = _check_inputs(train_x, train_targets, test_x, test_y, image_shape, num_classes,
                            config.label_type, sample_weight)
    if not ray.is_initialized():  # normally the pipeline has called ray.init already
        ray.init() if os.environ.get("RAY_ADDRESS") else ray.init(include_dashboard=False)
    quiet_train_logs()
    resources = ray.cluster_resources()
    use_gpu = resources.get("GPU", 0) > 0 if config.use_gpu is None else bool(config.use_gpu)
    need, kind = (config.num_workers, "GPU" if use_gpu else "CPU")
    if resources.get(kind, 0) < need:
        raise ConfigError("student.num_workers", f"{need} workers need {need} {kind}s but the Ray cluster "
                          f"has {resources.get(kind, 0):g}", f"set student.num_workers<={int(resources.get(kind, 0))}"
                          " or add nodes" + ("" if kind == "CPU" else " (or student.use_gpu=false)"))
    meta = _meta(image_shape, num_classes, config.arch, config)
    loop_cfg = _loop_config(config, image_shape, num_classes, meta)
    loop_cfg["data_ref"] = ray.put((x, t, w))
    storage = os.path.abspath(storage_path or os.path.join(tempfile.gettempdir(), "rknn_ray_train"))
    from rknn_ray.student.live import LiveEpochs
    live = LiveEpochs(progress) if progress is not None else None
    loop_cfg["epoch_relay"] = live.relay if live else None
    trainer_name = f"student-{uuid.uuid4().hex[:8]}"
    trainer = TorchTrainer(
        _train_loop_per_worker,
        train_loop_config=loop_cfg,
        scaling_config=ScalingConfig(num_workers=config.num_workers, use_gpu=use_gpu),
        run_config=RunConfig(name=trainer_name, storage_path=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=0),
                             logging_config=LoggingConfig(log_level="WARNING")),
    )
    fit_start = time.time()
    if live:
        with live:
            result = fit_off_main_thread(trainer)
    else:
        result = fit_off_main_thread(trainer)
    fit_end = time.time()
    if result.checkpoint is None or result.metrics is None:
        raise RknnError("Ray Train finished without a checkpoint or metrics; see the worker logs above")
    metrics = result.metrics
    with result.checkpoint.as_directory() as ckpt_dir:
        src = os.path.join(ckpt_dir, CHECKPOINT_FILE)
        ckpt_path = os.path.join(result.checkpoint.path, CHECKPOINT_FILE)  # in Train's storage
        if checkpoint_dir:
            os.makedirs(checkpoint_dir, exist_ok=True)
            ckpt_path = os.path.join(checkpoint_dir, CHECKPOINT_FILE)
            copy_file(src, ckpt_path)           # atomic: never a truncated student.pt
            copy_file(os.path.join(ckpt_dir, HISTORY_FILE), os.path.join(checkpoint_dir, HISTORY_FILE))
        model = load_student(src)
        with open(os.path.join(ckpt_dir, HISTORY_FILE)) as f:
            history = json.load(f)
    if checkpoint_dir:       # the checkpoint lives in checkpoint_dir now: drop Train's copy
        shutil.rmtree(os.path.join(storage, trainer_name), ignore_errors=True)
    if live:
        live.finish(history)     # any epoch that did not arrive live (never twice)
    t_eval = time.perf_counter()
    test_acc = accuracy(model, test_x, test_y)
    timings = {"workers_start": metrics["entered_at"] - fit_start,      # controller + worker processes
               "worker_setup": metrics["started_at"] - metrics["entered_at"],  # data, DDP model
               "train": float(metrics["train_seconds"]),
               "checkpoint_and_shutdown": fit_end - metrics["ended_at"],
               "evaluate": time.perf_counter() - t_eval}
    return StudentResult(test_accuracy=test_acc, train_loss=float(metrics["train_loss"]),
                         epochs=int(metrics["epochs"]), history=history,
                         checkpoint_path=ckpt_path,
                         seconds=time.perf_counter() - t_start, num_workers=config.num_workers,
                         device=str(metrics["device"]), train_seconds=float(metrics["train_seconds"]),
                         timings={k: round(v, 3) for k, v in timings.items()})

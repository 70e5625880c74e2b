"""The one Ray Train launcher: a ``TorchTrainer`` of N workers running a training loop.

Each worker runs :func:`train_loop_per_worker` (Ray Train's entry point): it takes the data
from the object store, runs ``loop(data, cfg, device, on_epoch)`` (DDP over the workers when
there are several; the loop shards its data by rank), and rank 0 reports the loop's payload
as the run's only checkpoint (Train V2 keeps metrics only when a checkpoint rides along).
Per-epoch rows reach the driver while training runs (:mod:`.live`). One worker takes the
free CPUs of a node (as many torch threads; ``RKNN_RAY_TORCH_THREADS`` overrides); several
take Ray's default of one CPU (or one GPU) each and one thread.

``fit()`` runs off the main thread (:func:`fit_off_main_thread`), so the caller's signal
handlers stay in charge; a job interrupted inside it waits for the abandoned thread after
``ray.shutdown`` (:func:`join_abandoned_fits`). Ray is never started here.
"""
from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
import time
import uuid
import warnings
import threading

import torch

from rknn_ray.errors import NO_SPACE, ConfigError, OutOfSpaceError, RknnError
from rknn_ray.training.loop import LoopRun, resolve_loop
from rknn_ray.training.logs import quiet_train_logs, quiet_worker_console
from rknn_ray import interrupts

PAYLOAD_FILE = "payload.pt"


def train_loop_per_worker(config: dict) -> None:
    """Ray Train entry point: run the loop on this worker; rank 0 reports its payload."""
    import ray  # defers ray
    import ray.train
    import ray.train.torch

    from rknn_ray.training.live import relay_pusher
    entered = time.time()
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.set_num_threads(int(config["threads"]))
    loop = resolve_loop(config["loop"])
    data = ray.get(config["data_ref"])
    # the object store hands out read-only numpy views (zero copy); the loops never write to
    # their inputs, so torch's warning about tensors made from them is noise here
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    device = ray.train.torch.get_device()
    quiet_worker_console()          # Train's INFO lines go to Ray's log folder, not the console
    started = time.time()
    payload = loop(data, config["loop_config"], device,
                   relay_pusher(config["epoch_relay"] if rank == 0 else None))   # live epochs
    metrics = {"device": str(device), "world_size": world, "entered_at": entered,
               "started_at": started, "ended_at": time.time()}
    if rank == 0:
        with tempfile.TemporaryDirectory() as tmp:
            torch.save(payload, os.path.join(tmp, PAYLOAD_FILE))
            try:         # Train copies it into its storage (the run folder's student-*/)
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
            except Exception as exc:
                if disk_full(exc):       # one line at the driver, not Train's traceback
                    raise OutOfSpaceError(config["storage"], os.strerror(errno.ENOSPC)) from None
                raise
    else:
        ray.train.report(metrics, checkpoint=None)


#: seconds between Train's controller's looks at its workers. Ray's default of 2 s kept a
#: student's fit() 3.5-4 s past its last epoch here (each step waits up to one look); 0.87 s
#: at 0.5 s.
HEALTH_CHECK_INTERVAL_S = 0.5


def ray_is_running() -> bool:
    ray = sys.modules.get("ray")            # not imported: certainly not running
    return ray is not None and ray.is_initialized()


def fit_on_ray(loop, data, cfg: dict, *, name: str = "train", num_workers: int = 1,
               use_gpu: bool | None = None, on_epoch=None, storage_path: str | None = None,
               trainer_key: str = "student.trainer") -> LoopRun:
    """Run ``loop`` ("module:function" or a callable) on ``num_workers`` Ray Train workers;
    returns rank 0's payload. ``use_gpu``: None takes a GPU per worker when the cluster has
    one. ``storage_path``: Train's storage (default a temp folder); the run's folder there
    is removed once the payload is read back. Needs a running Ray."""
    if not ray_is_running():
        raise RknnError(f"Ray is not running, and the {name} trains on Ray Train ({trainer_key}: "
                        "ray); library code does not start Ray by surprise. Fix: call "
                        "rknn_ray.job.ray_env.ensure_ray() first or use trainer=local "
                        f"({trainer_key}=local)")
    import ray  # defers ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from rknn_ray.training.live import LiveEpochs  # defers ray
    quiet_train_logs()
    total = ray.cluster_resources()
    gpu = total.get("GPU", 0) > 0 if use_gpu is None else bool(use_gpu)
    kind, have = ("GPU" if gpu else "CPU"), int(total.get("GPU" if gpu else "CPU", 0))
    if have < num_workers:
        raise ConfigError("student.num_workers", f"{num_workers} workers need {num_workers} {kind}s "
                          f"but the Ray cluster has {have}", f"set student.num_workers<={have} or "
                          "add nodes" + ("" if kind == "CPU" else " (or student.use_gpu=false)"))
    per_worker, threads = None, 1                    # several workers: Ray's 1 CPU (or GPU) each
    if num_workers == 1:
        free = ray.available_resources().get("CPU", 1)
        # one worker lives on one node: never ask for more CPUs than the largest node has (a
        # cluster of 1-CPU nodes with 2 free in all would leave the worker pending forever)
        largest = max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes()
                       if n.get("Alive")), default=1)
        threads = max(1, int(min(free, largest, os.cpu_count() or 1)))
        per_worker = {"CPU": threads}
    # read when the trainer starts (HEALTH_CHECK_INTERVAL_S); a user's setting wins
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", str(HEALTH_CHECK_INTERVAL_S))
    storage = os.path.abspath(storage_path or os.path.join(tempfile.gettempdir(), "rknn_ray_train"))
    run_name = f"{name}-{uuid.uuid4().hex[:8]}"
    live = LiveEpochs(on_epoch) if on_epoch is not None else None
    config = {"loop": loop, "loop_config": cfg, "data_ref": ray.put(data),
              "threads": int(os.environ.get("RKNN_RAY_TORCH_THREADS") or threads),
              "epoch_relay": live.relay if live else None,
              "storage": os.path.join(storage, run_name)}
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=gpu,
                                     resources_per_worker=per_worker),
        run_config=RunConfig(name=run_name, storage_path=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=1),
                             failure_config=FailureConfig(max_failures=0),
                             logging_config=LoggingConfig(log_level="WARNING")))
    fit_start = time.time()
    try:
        if live:
            with live:
                result = fit_off_main_thread(trainer)
        else:
            result = fit_off_main_thread(trainer)
    except Exception as exc:
        if not disk_full(exc):
            raise
        # a checkpoint cut short by a full disk (checkpoint_*/payload.pt): nothing of it is kept
        shutil.rmtree(os.path.join(storage, run_name), ignore_errors=True)
        raise OutOfSpaceError(os.path.join(storage, run_name),
                              os.strerror(errno.ENOSPC)) from None
    fit_end = time.time()
    if result.checkpoint is None or result.metrics is None:
        raise RknnError(f"Ray Train finished the {name} without a checkpoint or metrics; "
                        "see the worker logs above")
    with result.checkpoint.as_directory() as folder:
        payload = torch.load(os.path.join(folder, PAYLOAD_FILE), map_location="cpu",
                             weights_only=True)
    shutil.rmtree(os.path.join(storage, run_name), ignore_errors=True)  # the payload is read
    if live:
        live.finish(payload.get("history", []))     # any epoch that did not arrive live
    m = result.metrics
    timings = {"workers_start": m["entered_at"] - fit_start,         # controller + worker processes
               "worker_setup": m["started_at"] - m["entered_at"],   # threads, data
               "loop": m["ended_at"] - m["started_at"],
               "checkpoint_and_shutdown": fit_end - m["ended_at"]}
    return LoopRun(payload, str(m["device"]), int(m["world_size"]), timings)


def disk_full(exc: BaseException) -> bool:
    """Whether a failed fit() ran out of disk: an OSError of a full disk (or quota) anywhere
    in its causes or its workers' failures (Train's WorkerGroupError), else the words of one
    in its text (an error that crossed processes may arrive as text only)."""
    seen, todo = set(), [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OutOfSpaceError) or (isinstance(e, OSError) and e.errno in NO_SPACE):
            return True
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
        failures = getattr(e, "worker_failures", None)
        if isinstance(failures, dict):
            todo += [f for f in failures.values() if isinstance(f, BaseException)]
    text = str(exc)
    return any(os.strerror(code) in text for code in NO_SPACE)


#: fit() threads (their "done" events) the driver stopped waiting for: an interrupt reached it.
ABANDONED_FITS: list = []


def join_abandoned_fits(timeout: float = 30.0) -> bool:
    """After ``ray.shutdown()``: wait for the fit() threads an interrupt left running (their
    Ray calls fail once Ray is down). A process that exits while one is still inside Ray's
    native code can crash in interpreter shutdown (SIGSEGV instead of the job's 130/143).
    True when none is left."""
    end = time.monotonic() + timeout
    while ABANDONED_FITS:               # events, not Thread.is_alive: on 3.11 a join that an
        if not ABANDONED_FITS[0].wait(max(0.0, end - time.monotonic())):  # interrupt cut
            return False                # short marks the thread stopped while it still runs
        ABANDONED_FITS.pop(0)
    return True


#: seconds an interrupted run gets to end (its controller killed) before it is left behind
FIT_STOP_WAIT = 15.0


def _stop_fit(thread, done, wait: float | None = None) -> bool:
    """End an interrupted ``fit()`` on its helper thread; True when it ended.

    Ray Train ends a run on SIGINT itself only when ``fit()`` runs on the main thread. Ours
    runs on a helper thread blocked in ``ray.get(controller.run.remote())``; left there, it
    is still inside Ray's native code when the job shuts Ray down, and the process can crash
    (SIGSEGV, not the job's 130/143: 3 of 5 SIGINT probes here). So the run's controller
    actor, found in that thread's frames, is killed: the blocked get raises, the thread ends
    while Ray is up, and the controller's training workers die with their owner. A run
    interrupted while ``fit()`` still sets up is watched until its controller exists (on a
    busy machine that can take seconds, and shutting Ray down before it does can crash),
    and killed then. Only a run still going after ``wait`` is left to
    :func:`join_abandoned_fits`."""
    import ray  # defers ray
    end = time.monotonic() + (FIT_STOP_WAIT if wait is None else wait)
    killed = False
    while True:
        if not killed and (controller := _controller_of(thread)) is not None:
            killed = True
            try:
                ray.kill(controller)
            except Exception:  # noqa: BLE001 - already dead, or Ray going down: the wait decides
                pass
        if done.wait(0.05):
            return True
        if time.monotonic() >= end:
            ABANDONED_FITS.append(done)       # still inside fit(): see join_abandoned_fits
            return False


def _controller_of(thread):
    """The Train controller actor a ``fit()`` thread started, once it exists (else None)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None:
        if frame.f_code.co_name == "_initialize_and_run_controller":
            return frame.f_locals.get("controller")
        frame = frame.f_back
    return None


def fit_off_main_thread(trainer):
    """``trainer.fit()`` in a helper thread, the main thread waiting on it.

    Ray Train v2 installs its own SIGINT handler when ``fit()`` runs on the main thread
    (it calls ``sys.exit`` and stays installed after ``fit()`` returns). Off the main
    thread it installs none, so the caller's SIGINT/SIGTERM handlers stay in charge: an
    interrupt reaches the driver as its own exception, and ending the driver's Ray
    (``ray.shutdown``) ends the run.
    """

    interrupts.raise_pending()                # one Python dropped on the way here
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
            interrupts.raise_pending()
    except BaseException:
        _stop_fit(thread, done)               # end the run while Ray is still up
        raise
    if "error" in box:
        raise box["error"]
    return box["result"]

"""One experiment runner for jobs.compare, jobs.grid and benchmarks.adaptive_rounds.

An experiment runs a list of cells (:class:`Job`) with :class:`Runner`. Each cell that must
run is a Ray Tune trial that runs the whole cell where Tune schedules it: a jobs.distill
cell's client shards, shuffler and server are placed in the trial's placement group (its
bundles: :func:`cell_bundles`), its Ray Train student gets the workers' own placement
group (Train V2 makes one per fit; Tune cannot hold them, see :func:`concurrency`).
``concurrent`` cells run at once (default: what the cluster's CPUs fit), cell after cell in
one trial process per reservation (Tune's ``reuse_actors``). Privacy goes to an
isolated ledger in the experiment's folder (jobs.cells); every trial writes its row to its
cell file (``runs/<cell>/<cell_file>``) before it reports, so a killed experiment run again
reads the finished cells back and runs only the rest (a cell whose spec changed runs
again); a failed cell is a row with its error (and runs again next time). The caller's
writer is called after every cell, so an interrupted experiment keeps every finished row.

Per trial, Tune gets the student's per-epoch loss and accuracy (``epoch``, ``student_loss``,
``student_train_accuracy``), then the cell's ``accuracy``, ``label_accuracy``, ``eps``,
``delta``, ``n_opened`` (reports the server opened) and ``wall_s``; with ``tensorboard`` its
TensorBoard event files are written under ``<out>/tune/<stamp>/<trial>/``; with ``mlflow`` (a
tracking URI; the optional extra ``rknn-ray[mlflow]``) each trial is an MLflow run of the
experiment named after ``<out>``, with the cell's name as its ``cell`` parameter.

Every row holds the fields of the one report-row schema (rknn_ray.report_row, re-exported
here: :class:`ReportRow`, :func:`report_row`); the files are written by jobs.writers.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

from jobs import signals
from jobs.cells import error_text, isolated_ledger, run_distill
from jobs.writers import fmt, markdown_table, print_result, rows_to_csv  # noqa: F401 (shared names)
from rknn_ray.errors import ConfigError
from rknn_ray.report_row import (NAN, ROW_FIELDS, ROW_SCHEMA, STAGES, ReportRow,  # noqa: F401
                                 empty_row, report_row, stage_seconds)
from rknn_ray.runio import write_json

CELL_FILE = "cell.json"
#: a cell's fields in its result that Tune gets besides the per-epoch curves
TUNE_METRICS = ("accuracy", "label_accuracy", "eps", "delta", "n_opened", "wall_s")


# ----------------------------------------------------------------------------- one cell

@dataclass
class Job:
    """One cell of an experiment.

    ``keys``: what names the cell in its row (method, target_eps, seed, ...).
    A jobs.distill cell has ``cfg`` (a validated Config) and runs into ``runs/<name>``.
    Any other cell (an in-process baseline, a simulation) has ``call`` returning its row's
    fields (and, under ``"_side"``, what the producer keeps beside the row: ledgers, NOT
    PRIVATE diagnostics); it is resumable when it has a ``spec`` (what it depends on),
    else it runs every time. A finished cell (its cell file with the same spec, keys and
    row schema) is read back, not run again. ``extra(report)`` adds producer-specific
    fields read from a run's report. ``bundles``: the Ray resources the cell's trial
    reserves (its placement group; the first bundle is the trial's own process, {} for
    none); None: :func:`cell_bundles` of ``cfg``, else one CPU.
    """
    name: str
    keys: dict
    cfg: object = None
    call: Callable[[], dict] | None = None
    extra: Callable[[dict], dict] | None = None
    spec: dict | None = None
    bundles: list | None = None


def spec_digest(d: dict) -> str:
    """A stable digest of a JSON-able spec (sorted keys)."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def job_digest(job: Job) -> str | None:
    """What a finished cell must match to be read back (None: the cell always runs)."""
    if job.cfg is not None:
        return spec_digest({"config": job.cfg.to_dict(), "keys": job.keys})
    if job.spec is not None:
        return spec_digest({"spec": job.spec, "keys": job.keys})
    return None


def cell_row(job: Job, report: dict, wall: float, run_dir: str | None) -> dict:
    """A finished distill cell's row: its keys, the schema's fields, the producer's extras."""
    row = {**job.keys, **report_row(report).to_dict(), "run": run_dir, "wall_s": wall,
           "error": ""}
    row.update(job.keys)                # the cell's own names win over the report's ...
    if job.extra:
        row.update(job.extra(report))   # ... and what the producer reads from it over both
    return row


def run_dir(out: str, job: Job) -> str:
    return os.path.join(out, "runs", job.name)


def load_done(out: str, job: Job, cell_file: str = CELL_FILE) -> tuple[dict, dict] | None:
    """(row, side) of a finished cell with this spec and row schema, else None."""
    digest = job_digest(job)
    folder = run_dir(out, job)
    path = os.path.join(folder, cell_file)
    if digest is None or not os.path.isfile(path) or (
            job.cfg is not None and not os.path.isfile(os.path.join(folder, "report.json"))):
        return None
    try:
        with open(path) as fh:
            saved = json.load(fh)
    except (OSError, ValueError):
        return None
    if saved.get("spec") != digest or saved.get("schema") != ROW_SCHEMA:
        return None
    return saved.get("row"), saved.get("side") or {}


def execute(job: Job, out: str, ledger_path: str | None,
            cell_file: str = CELL_FILE) -> tuple[dict, dict]:
    """Run one cell here: (row, side); a failure is a row with ``error`` set, never an
    exception. A finished cell's row is saved (atomically) to its cell file."""
    t0 = time.perf_counter()
    row = {**empty_row(), **job.keys, "run": None, "wall_s": NAN, "error": ""}
    side: dict = {}
    try:
        if job.cfg is not None:
            folder = run_dir(out, job)
            row["run"] = folder
            report, wall = run_distill(job.cfg, folder, ledger_path)
            row = cell_row(job, report, wall, folder)
        else:
            fields = dict(job.call())
            side = fields.pop("_side", None) or {}
            row.update(fields)
            row.update(job.keys)
            wall = row.get("wall_s")
            if not isinstance(wall, (int, float)) or math.isnan(wall):   # call did not time it
                row["wall_s"] = time.perf_counter() - t0
    except Exception as exc:            # one failed cell must not lose the table
        return ({**empty_row(), **job.keys, "run": row["run"],     # the cell's names kept
                 "wall_s": time.perf_counter() - t0, "error": error_text(exc)}, {})
    digest = job_digest(job)
    if digest is not None:
        write_json(os.path.join(run_dir(out, job), cell_file),
                   {"spec": digest, "schema": ROW_SCHEMA, "keys": job.keys, "row": row,
                    "side": side})
    return row, side


# ----------------------------------------------------------------------------- resources

def cell_bundles(cfg) -> list[dict]:
    """A jobs.distill cell's placement group: an empty bundle for the trial's process (the
    job's driver), then the CPUs of its server and shuffler hops, one bundle per distinct
    node requirement (the custom resources ``cluster.placement`` asks of that party's node;
    without any: one bundle: one bundle per actor fragments, a 0.25-CPU actor in a 0.5-CPU
    bundle leaves the next 0.5 nowhere). Not in it, placed by Ray beside the group: the
    client shards (the job spreads them over the client nodes: ``scheduling_strategy=SPREAD``
    is not captured by a placement group; measured in docs/experiments.md) and the Ray Train
    student's workers (Train V2 makes a placement group of its own); :func:`concurrency`
    counts both."""
    cl = cfg.cluster
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    groups: dict = {}
    for party, cpus in (("server", cl.server_cpus), ("shuffler", hops * cl.shuffler_cpus)):
        if not cpus:
            continue
        res = dict(((cl.placement or {}).get(party) or {}).get("resources") or {})
        key = tuple(sorted(res.items()))
        bundle = groups.setdefault(key, {"CPU": 0.0, **res})
        bundle["CPU"] = round(bundle["CPU"] + float(cpus), 6)
    return [{}] + list(groups.values())


def shard_cpus(cfg) -> float:
    """CPUs of a cell's client shards (outside its trial's placement group)."""
    from rknn_ray.job.resources import shard_count
    return shard_count(cfg) * float(cfg.cluster.shard_cpus)


def student_cpus(cfg) -> float:
    """CPUs a cell's Ray Train student asks for outside its trial's placement group."""
    st = cfg.student
    if st.trainer in ("ray", "auto") and st.method != "semi" and not st.use_gpu:
        return float(st.num_workers)
    return 0.0


def job_bundles(job: Job) -> list[dict]:
    if job.bundles is not None:
        return [dict(b) for b in job.bundles]
    if job.cfg is not None:
        return cell_bundles(job.cfg)
    return [{"CPU": 1.0}]


def _cpus(bundles: list[dict]) -> float:
    return sum(float(b.get("CPU", 0.0)) for b in bundles)


def concurrency(jobs: list[Job], cpus: float, asked: int | None = None) -> int:
    """How many cells run at once. Each trial holds its placement group for its whole life
    and its client shards while its rounds run; a Ray Train student asks for its CPUs beside
    them. With ``asked`` trials holding theirs, one student must still fit, or every trial
    waits on the others' CPUs forever (measured: Train's worker group start timed out after
    60 s, docs/experiments.md).
    Default: the cells whose groups and students all fit at once (at least 1)."""
    if asked is not None and asked < 1:
        raise ConfigError("--concurrent", f"{asked} is not a positive number of cells",
                          "write --concurrent 1 or more, or leave it out")
    if not jobs:
        return 1
    held = max(_cpus(job_bundles(j)) + (shard_cpus(j.cfg) if j.cfg is not None else 0.0)
               for j in jobs)
    train = max((student_cpus(j.cfg) for j in jobs if j.cfg is not None), default=0.0)
    if asked is None:
        return max(1, min(len(jobs), int((cpus + 1e-9) // max(held + train, 1.0))))
    asked = min(asked, len(jobs))                       # never more than the cells
    if asked > 1 and asked * held + train > cpus + 1e-9:
        fits = max(1, int((cpus - train + 1e-9) // held)) if held else 1
        raise ConfigError("--concurrent", f"{asked} cells at once hold {asked} x {held:g} CPUs "
                          f"for their protocol actors and leave {max(cpus - asked * held, 0):g} "
                          f"of {cpus:g} for a Ray Train student that needs {train:g}: the cells "
                          "would wait on each other forever",
                          f"use --concurrent {fits}, or lower cluster.shard_cpus / "
                          "student.num_workers")
    return asked


# ----------------------------------------------------------------------------- Tune trial

def _history(row: dict) -> list[dict]:
    run = row.get("run")
    if not run or row.get("error"):
        return []
    from rknn_ray.student.config import HISTORY_FILE  # Ray-free, torch-free constants
    try:
        with open(os.path.join(run, HISTORY_FILE)) as fh:
            history = json.load(fh)
    except (OSError, ValueError):
        return []
    return history if isinstance(history, list) else []


def tune_metrics(row: dict) -> dict:
    """The cell's result as Tune metrics (numbers; NaN where the cell has none)."""
    out = {}
    for key in TUNE_METRICS:
        value = row.get(key)
        if key == "n_opened" and value is None:
            value = row.get("messages")
        out[key] = float(value) if isinstance(value, (int, float)) and value is not None else NAN
    return out


def run_trial(config: dict, jobs: dict, out: str, ledger_path: str | None,
              cell_file: str) -> None:
    """The Tune trainable: one whole cell in this trial's process and placement group; the
    student's epochs and then the cell's result are reported to Tune."""
    from ray import tune
    job = jobs[config["cell"]]
    if ledger_path:
        os.environ["RKNN_RAY_LEDGER"] = ledger_path     # the isolated ledger, in this process too
    row, side = execute(job, out, ledger_path, cell_file)
    for h in _history(row):
        tune.report({"epoch": int(h.get("epoch", 0)), "student_loss": float(h["train_loss"]),
                     "student_train_accuracy": float(h["train_accuracy"])})
    tune.report({**tune_metrics(row), "error": row.get("error") or "",
                 "row_json": json.dumps(row, default=str), "side_json": json.dumps(side, default=str)})


def add_runner_arguments(ap, unit: str) -> None:
    """``--concurrent``, ``--tensorboard`` and ``--mlflow`` (grid and compare: ``unit`` is
    what they call one trial, "cell" or "row")."""
    ap.add_argument("--concurrent", type=int, default=None, metavar="N",
                    help=f"{unit}s run at once, each a Ray Tune trial (default: what the "
                         "cluster's CPUs fit)")
    ap.add_argument("--tensorboard", action="store_true",
                    help=f"TensorBoard event files per {unit} under OUT/tune/ (per-epoch curves)")
    ap.add_argument("--mlflow", default=None, metavar="URI",
                    help=f"log every {unit} as an MLflow run at this tracking URI (a folder, "
                         "file:///..., http://...) in the experiment named after OUT; needs "
                         "the optional extra rknn-ray[mlflow]")


def check_mlflow(uri: str | None) -> None:
    """A ConfigError, before anything runs, when ``--mlflow`` is asked for without mlflow."""
    if uri is None:
        return
    try:
        import mlflow  # noqa: F401 - defers mlflow (an optional extra), only asked if used
    except ImportError:
        raise ConfigError("--mlflow", "mlflow is not installed here",
                          "pip install 'rknn-ray[mlflow]', or leave --mlflow out") from None


def mlflow_callback(uri: str, experiment: str):
    """Ray Tune's MLflow logger: every trial an MLflow run in ``experiment`` at ``uri``."""
    check_mlflow(uri)
    from ray.air.integrations.mlflow import MLflowLoggerCallback  # defers ray.tune, mlflow
    return MLflowLoggerCallback(tracking_uri=uri, experiment_name=experiment)


def run_command(out: str, work: Callable[[], object], show: Callable[[object], None]) -> int:
    """grid's and compare's main: ``show(work())`` and 0; a config or data error is one line
    and 2; SIGINT or SIGTERM end it the way a job is ended (jobs.signals): one line that says
    what is kept and how to go on, and the shell's exit code (130, 143), not Ray's native
    stack dump (its handler is replaced once Ray is up, :meth:`Runner.ensure_ray`)."""
    from rknn_ray.errors import RknnError  # defers the library (--help stays fast)
    with signals.handled():
        try:
            result = work()
        except RknnError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            got = signals.as_interrupt(exc)
            print(f"error: interrupted by {got.name}; the cells that finished are kept in "
                  f"{out}. Fix: run the same command again: it skips them and runs the rest",
                  file=sys.stderr)
            return got.exit_code
        show(result)
        return 0


# ----------------------------------------------------------------------------- the runner

class Runner:
    """Runs an experiment's cells once each as Ray Tune trials; see the module docstring.

    ``write(rows, meta)`` is called after every cell (rows in the jobs' order, the cells
    finished so far) and at the end, with ``meta["complete"] = True``; it writes the
    experiment's files atomically. ``log(i, n, job, row, skipped)`` reports progress.
    ``concurrent``: cells at once (None: what the CPUs fit); ``tensorboard``: Tune writes
    TensorBoard event files; ``mlflow``: an MLflow tracking URI Tune logs to. ``ray=False``:
    cells that need no Ray run here, in order.
    After :meth:`run`: ``by_name`` (cell name -> row), ``side`` (cell name -> what the cell
    kept beside its row), ``results`` (Tune's ResultGrid, None when nothing ran) and
    :meth:`frame` (the rows as a pandas DataFrame).
    """

    CELL_FILE = CELL_FILE

    def __init__(self, out: str, write: Callable[[list, dict], None] | None = None,
                 log: Callable | None = None, meta: dict | None = None,
                 cell_file: str | None = None, ray: bool = True, sample_load: bool = False,
                 concurrent: int | None = None, tensorboard: bool = False,
                 mlflow: str | None = None):
        check_mlflow(mlflow)                # said before any cell runs
        self.out = os.path.abspath(out)
        self.write = write or (lambda rows, meta: None)
        self.log = log or (lambda *a: None)
        self.meta = meta if meta is not None else {}
        self.cell_file = cell_file or self.CELL_FILE
        self.ray = ray
        self.sample_load = sample_load
        self.concurrent = concurrent
        self.tensorboard = tensorboard
        self.mlflow = mlflow
        self.ledger_path: str | None = None
        self.by_name: dict = {}
        self.side: dict = {}
        self.results = None
        self._ray_started: bool | None = None   # None: not asked for yet
        self._jobs: list = []

    def load_done(self, job: Job) -> dict | None:
        """The saved row of a finished cell with this spec and row schema, else None."""
        done = load_done(self.out, job, self.cell_file)
        return None if done is None else done[0]

    # -- bookkeeping shared by every way a cell ends
    def _rows(self) -> list[dict]:
        return [self.by_name[j.name] for j in self._jobs if j.name in self.by_name]

    def _finished(self, job: Job, row: dict, side: dict, skipped: bool) -> None:
        self.by_name[job.name] = row
        self.side[job.name] = side or {}
        self.log(len(self.by_name), len(self._jobs), job, row, skipped)
        self.meta["wall_s"] = time.perf_counter() - self._t_all
        if self.sample_load:       # how shared the machine was
            self.meta["load_average_1min"].append(round(os.getloadavg()[0], 2))
        self.write(self._rows(), self.meta)

    # -- all cells
    def run(self, jobs: list[Job], then: Callable[[list], None] | None = None) -> list[dict]:
        """Every cell once; returns the rows (one per job, in order). ``then(rows)`` runs
        after the cells, in the same Ray session and ledger (the grid's reference runs)."""
        os.makedirs(self.out, exist_ok=True)
        self.meta.setdefault("wall_s", 0.0)
        self.meta["complete"] = False
        if self.sample_load:
            self.meta.setdefault("load_average_1min", [])
        self._jobs, self.by_name, self.side = list(jobs), {}, {}
        self._t_all = time.perf_counter()
        with isolated_ledger(self.out) as ledger_path:   # nothing here touches the user's budgets
            self.ledger_path = ledger_path
            self._ray_started = None        # Ray starts with the first cell that must run
            try:
                todo = []
                for job in self._jobs:
                    done = load_done(self.out, job, self.cell_file)
                    if done is not None:
                        self._finished(job, done[0], done[1], True)
                    else:
                        todo.append(job)
                if todo and self.ray:
                    self._tune(todo)
                else:
                    for job in todo:        # no Ray: in-process cells, here
                        row, side = execute(job, self.out, ledger_path, self.cell_file)
                        self._finished(job, row, side, False)
                rows = self._rows()
                if then is not None:
                    then(rows)
            finally:
                if self._ray_started:
                    import ray  # defers ray, tqdm
                    ray.shutdown()
        self.meta["complete"] = True
        self.meta["wall_s"] = time.perf_counter() - self._t_all
        self.write(rows, self.meta)
        return rows

    def frame(self):
        """The rows as a pandas DataFrame (one per cell, in the jobs' order)."""
        import pandas as pd  # defers pandas
        return pd.DataFrame(self._rows())

    def _tune(self, todo: list[Job]) -> None:
        """The cells not done yet, as Tune trials (``concurrent`` at once)."""
        self.ensure_ray()
        # the files written after every cell (a plot) take a few seconds in Tune's loop: not
        # a "performance bottleneck" line per cell (read when ray.tune is first imported)
        os.environ.setdefault("TUNE_WARN_THRESHOLD_S", "60")
        import ray
        from ray import tune

        from rknn_ray.job.ray_env import variables_set_while
        cpus = float(ray.cluster_resources().get("CPU", 0))
        n = concurrency(todo, cpus, self.concurrent)
        self.meta["concurrent"] = n
        by = {j.name: j for j in todo}
        runner = self

        class CellDone(tune.Callback):
            """In this process: every cell's row as its trial ends (files written at once)."""
            def on_trial_result(self, iteration, trials, trial, result, **info):
                if "row_json" in result:
                    name = trial.config["cell"]
                    runner._finished(by[name], json.loads(result["row_json"]),
                                     json.loads(result["side_json"]), False)

            def on_trial_error(self, iteration, trials, trial, **info):
                name = trial.config["cell"]
                if name not in runner.by_name:
                    job = by[name]      # the trial's process died (a cell's own failure is a row)
                    try:
                        exc = trial.get_error()
                    except Exception:   # noqa: BLE001 - its error file may be unreadable
                        exc = None
                    text = error_text(exc) if exc is not None else "TrialError: the trial failed"
                    runner._finished(job, {**empty_row(), **job.keys, "run": run_dir(runner.out, job),
                                           "wall_s": NAN, "error": text}, {}, False)

        trainable = tune.with_resources(
            tune.with_parameters(run_trial, jobs=by, out=self.out, ledger_path=self.ledger_path,
                                 cell_file=self.cell_file),
            lambda config: tune.PlacementGroupFactory(job_bundles(by[config["cell"]])))
        from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
        callbacks = [CellDone(), JsonLoggerCallback(), CSVLoggerCallback()]  # per-trial metrics
        if self.tensorboard:
            callbacks.append(TBXLoggerCallback())
        if self.mlflow:
            callbacks.append(mlflow_callback(self.mlflow, os.path.basename(self.out)))
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        self.meta["tune"] = os.path.join(self.out, "tune", stamp)
        # TUNE_DISABLE_SIGINT_HANDLER: a Ctrl-C ends the command (interruptible()), not only
        # Tune's loop, after which the command would go on as if every cell had run
        with variables_set_while(TUNE_DISABLE_AUTO_CALLBACK_LOGGERS="1", RAY_AIR_NEW_OUTPUT="0",
                                  TUNE_DISABLE_SIGINT_HANDLER="1",
                                  TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S="1e9"):
            tuner = tune.Tuner(
                trainable, param_space={"cell": tune.grid_search([j.name for j in todo])},
                # one trial process runs cell after cell (a fresh one cost ~4 s of Ray worker
                # and placement group start and ~2.5 s of imports per cell, docs/experiments.md);
                # a job ends its actors and keeps no state between jobs (tests/test_experiments)
                tune_config=tune.TuneConfig(max_concurrent_trials=n, reuse_actors=True),
                run_config=tune.RunConfig(
                    name=stamp, storage_path=os.path.join(self.out, "tune"), verbose=0,
                    callbacks=callbacks, failure_config=tune.FailureConfig(max_failures=0),
                    checkpoint_config=tune.CheckpointConfig(num_to_keep=1)))
            self.results = tuner.fit()

    def ensure_ray(self) -> None:
        """Start Ray (once per run, only if this runner uses it and a cell must run): a
        re-run whose cells are all done starts nothing."""
        if self.ray and self._ray_started is None:
            # defers cryptography, dp_accounting, faiss, ray, tqdm
            from rknn_ray.job.ray_env import ensure_ray
            self._ray_started = ensure_ray()
            signals.install()       # again: ray.init put its own SIGTERM handler in place

    def elapsed(self) -> None:
        """Bring ``meta["wall_s"]`` up to now (for a ``then`` step that writes outputs)."""
        self.meta["wall_s"] = time.perf_counter() - self._t_all

"""One experiment runner for jobs.compare, jobs.grid and benchmarks.adaptive_rounds.

An experiment runs a list of cells (:class:`Job`) with :class:`Runner`: Ray is started
once (with the first cell that must run), privacy goes to an isolated ledger in the
experiment's folder (jobs.cells), a cell finished before with the same spec is read back
instead of run again, a failed cell becomes a row with its error (and runs again next
time), and the caller's writer is called after every cell, so an interrupted experiment
keeps every finished row.

Every row holds the fields of the one report-row schema (rknn_ray.report_row, re-exported
here: :class:`ReportRow`, :func:`report_row`); the files are written by jobs.writers.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from jobs.cells import error_text, isolated_ledger, run_distill
from jobs.writers import fmt, markdown_table, print_result, rows_to_csv  # noqa: F401 (shared names)
from rknn_ray.report_row import (NAN, ROW_FIELDS, ROW_SCHEMA, STAGES, ReportRow,  # noqa: F401
                                 empty_row, report_row, stage_seconds)
from rknn_ray.runio import write_json


# ----------------------------------------------------------------------------- the runner

@dataclass
class Job:
    """One cell of an experiment.

    ``keys``: what names the cell in its row (method, target_eps, seed, ...).
    A jobs.distill cell has ``cfg`` (a validated Config) and runs into ``runs/<name>``;
    a finished one (report.json and the same spec, keys and row schema in its cell file)
    is read back, not run again. Any other cell (an in-process baseline, a simulation)
    has ``call`` returning its row's fields and always runs. ``extra(report)`` adds
    producer-specific fields read from a run's report.
    """
    name: str
    keys: dict
    cfg: object = None
    call: Callable[[], dict] | None = None
    extra: Callable[[dict], dict] | None = None


def spec_digest(d: dict) -> str:
    """A stable digest of a JSON-able spec (sorted keys)."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def cell_row(job: Job, report: dict, wall: float, run_dir: str | None) -> dict:
    """A finished distill cell's row: its keys, the schema's fields, the producer's extras."""
    row = {**job.keys, **report_row(report).to_dict(), "run": run_dir, "wall_s": wall,
           "error": ""}
    row.update(job.keys)                # the cell's own names win over the report's ...
    if job.extra:
        row.update(job.extra(report))   # ... and what the producer reads from it over both
    return row


class Runner:
    """Runs an experiment's cells once each; see the module docstring.

    ``write(rows, meta)`` is called after every cell (and at the end, with
    ``meta["complete"] = True``); it writes the experiment's files atomically.
    ``log(i, n, job, row, skipped)`` reports progress.
    """

    CELL_FILE = "cell.json"

    def __init__(self, out: str, write: Callable[[list, dict], None] | None = None,
                 log: Callable | None = None, meta: dict | None = None,
                 cell_file: str | None = None, ray: bool = True, sample_load: bool = False):
        self.out = os.path.abspath(out)
        self.write = write or (lambda rows, meta: None)
        self.log = log or (lambda *a: None)
        self.meta = meta if meta is not None else {}
        self.cell_file = cell_file or self.CELL_FILE
        self.ray = ray
        self.sample_load = sample_load
        self.ledger_path: str | None = None
        self._ray_started: bool | None = None   # None: not asked for yet

    def run_dir(self, job: Job) -> str:
        return os.path.join(self.out, "runs", job.name)

    def digest(self, job: Job) -> str:
        return spec_digest({"config": job.cfg.to_dict(), "keys": job.keys})

    # -- done before?
    def load_done(self, job: Job) -> dict | None:
        """The saved row of a finished cell with this spec and row schema, else None."""
        run_dir = self.run_dir(job)
        path = os.path.join(run_dir, self.cell_file)
        if not (job.cfg is not None and os.path.isfile(path)
                and os.path.isfile(os.path.join(run_dir, "report.json"))):
            return None
        try:
            with open(path) as fh:
                saved = json.load(fh)
        except (OSError, ValueError):
            return None
        if saved.get("spec") != self.digest(job) or saved.get("schema") != ROW_SCHEMA:
            return None
        return saved.get("row")

    # -- one cell
    def run_one(self, job: Job) -> tuple[dict, bool]:
        """(row, was_skipped); a failure is a row with ``error`` set, never an exception."""
        done = self.load_done(job)
        if done is not None:
            return done, True
        self.ensure_ray()
        t0 = time.perf_counter()
        row = {**empty_row(), **job.keys, "run": None, "wall_s": NAN, "error": ""}
        try:
            if job.cfg is not None:
                run_dir = self.run_dir(job)
                row["run"] = run_dir
                report, wall = run_distill(job.cfg, run_dir, self.ledger_path)
                row = cell_row(job, report, wall, run_dir)
                write_json(os.path.join(run_dir, self.cell_file),
                           {"spec": self.digest(job), "schema": ROW_SCHEMA, "keys": job.keys,
                            "row": row})
            else:
                row.update(job.call())
                row.update(job.keys)
                wall = row.get("wall_s")
                if not isinstance(wall, (int, float)) or math.isnan(wall):   # call did not time it
                    row["wall_s"] = time.perf_counter() - t0
        except Exception as exc:            # one failed cell must not lose the table
            row = {**empty_row(), **job.keys, "run": row["run"],     # the cell's names kept
                   "wall_s": time.perf_counter() - t0, "error": error_text(exc)}
        return row, False

    # -- all cells
    def run(self, jobs: list[Job], then: Callable[[list], None] | None = None) -> list[dict]:
        """Every cell in order; returns the rows (one per job, in order). ``then(rows)`` runs
        after the cells, in the same Ray session and ledger (the grid's reference runs)."""
        os.makedirs(self.out, exist_ok=True)
        self.meta.setdefault("wall_s", 0.0)
        self.meta["complete"] = False
        if self.sample_load:
            self.meta.setdefault("load_average_1min", [])
        rows: list[dict] = []
        t_all = self._t_all = time.perf_counter()
        with isolated_ledger(self.out) as ledger_path:   # nothing here touches the user's budgets
            self.ledger_path = ledger_path
            self._ray_started = None        # Ray starts with the first cell that must run
            try:
                for i, job in enumerate(jobs, 1):
                    row, skipped = self.run_one(job)
                    rows.append(row)
                    self.log(i, len(jobs), job, row, skipped)
                    self.meta["wall_s"] = time.perf_counter() - t_all
                    if self.sample_load:       # how shared the machine was
                        self.meta["load_average_1min"].append(round(os.getloadavg()[0], 2))
                    self.write(rows, self.meta)
                if then is not None:
                    then(rows)
            finally:
                if self._ray_started:
                    import ray  # defers ray, tqdm
                    ray.shutdown()
        self.meta["complete"] = True
        self.meta["wall_s"] = time.perf_counter() - t_all
        self.write(rows, self.meta)
        return rows

    def ensure_ray(self) -> None:
        """Start Ray (once per run, only if this runner uses it and a cell must run): a
        re-run whose cells are all done starts nothing."""
        if self.ray and self._ray_started is None:
            # defers cryptography, dp_accounting, faiss, ray, tqdm
            from rknn_ray.job.ray_env import ensure_ray
            self._ray_started = ensure_ray()

    def elapsed(self) -> None:
        """Bring ``meta["wall_s"]`` up to now (for a ``then`` step that writes outputs)."""
        self.meta["wall_s"] = time.perf_counter() - self._t_all

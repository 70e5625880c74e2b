"""One report-row schema and one experiment runner for jobs.compare, jobs.grid,
benchmarks.adaptive_rounds (and the rows of ``rknn-ray report`` on a folder of runs).

Why one: four places read report.json into a table row, each a little differently
(student accuracy was ``accuracy`` in one, ``student`` or ``student_accuracy`` in
others; the stage total counted the adaptive selection in one and not another). Now
:func:`report_row` is the only reader and :class:`ReportRow` names every field once.

An experiment runs a list of cells (:class:`Job`) with :class:`Runner`: Ray is started
once (with the first cell that must run), privacy goes to an isolated ledger in the experiment's folder (jobs.cells), a cell
finished before with the same spec is read back instead of run again, a failed cell
becomes a row with its error (and runs again next time), and the caller's writer is
called after every cell, so an interrupted experiment keeps every finished row.

The shared table writers are here too: :func:`fmt` (a cell's text), :func:`rows_to_csv`,
:func:`markdown_table` and :func:`print_result`.
"""
from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

from jobs.cells import error_text, isolated_ledger, run_distill
from rknn_ray.runio import write_json

NAN = float("nan")
#: bump when ReportRow's fields change: a saved row of another version is not "done"
ROW_SCHEMA = 1
#: the timings that add up to a run's stage total (``stage_s``), in order
STAGES = ("data", "queries", "actors", "labels", "student")


# ----------------------------------------------------------------------------- the schema

@dataclass(frozen=True)
class ReportRow:
    """What one private run's report.json says, as one flat table row.

    Fields (a run that failed, or a report that lacks one, gives NaN / None / ""):

    - ``model``, ``mechanism``: the trust model (central, local, shuffle) and mechanism.
    - ``dataset``: ``config.data.dataset``.
    - ``eps``, ``delta``: the guarantee the run's accountant reports, all rounds composed.
    - ``unit``, ``neighbour``: what it protects (``record`` / ``label``) and the neighbour
      relation (``replace-one``, ``add-remove``).
    - ``private``: False only for a simulation (``run.rng=seeded``) or a reference.
    - ``accuracy``: the student on the evaluation split; ``label_accuracy``: the released
      labels on the public set (Acc_pl); ``query_label_accuracy``: the labels of the queries.
    - ``nonprivate_label_accuracy``: the same labels from exact counts (diagnostics only,
      NOT private; None unless ``run.diagnostics``).
    - ``rounds``: private rounds; ``round_eps``: each round's eps; ``ledger_events``: the
      events recorded.
    - ``clients``, ``queries`` (labeled, all rounds), ``k_used`` (``rknn.k``), ``messages``
      (accepted by the server), ``bytes_per_client`` (messages x message bytes / clients).
    - ``stage_s``: the sum of the run's stage, round and selection timings (seconds).
    """
    model: str | None = None
    mechanism: str | None = None
    dataset: str | None = None
    eps: float = NAN
    delta: float = NAN
    unit: str = ""
    neighbour: str | None = None
    private: bool | None = None
    accuracy: float = NAN
    label_accuracy: float = NAN
    query_label_accuracy: float | None = None
    nonprivate_label_accuracy: float | None = None
    rounds: int = 0
    round_eps: tuple = ()
    ledger_events: int = 0
    clients: int | None = None
    queries: int | None = None
    k_used: int | None = None
    messages: int | None = None
    bytes_per_client: float = NAN
    stage_s: float | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["round_eps"] = list(self.round_eps)
        return d


#: the schema's field names, in order (every producer's rows hold all of them)
ROW_FIELDS = tuple(f.name for f in dataclasses.fields(ReportRow))


def _num(v, default=NAN):
    return default if v is None else v


def stage_seconds(timings: dict) -> float:
    """The stages plus every round and selection (``round_0``, ``select_1``; not their parts)."""
    return float(sum(timings.get(k, 0.0) for k in STAGES) + sum(
        v for k, v in timings.items() if k.startswith(("round_", "select_")) and k.count("_") == 1))


def report_row(report: dict | None) -> ReportRow:
    """The one reader of report.json for tables; ``None`` (a failed run) gives the empty row."""
    if report is None:
        return ReportRow()
    p = report.get("privacy") or {}
    acc = report.get("accuracy") or {}
    c = report.get("counts") or {}
    cfg = report.get("config") or {}
    details = p.get("details") or [{}]
    msg_bytes = (details[-1] or {}).get("message_bytes") or 0
    rounds = p.get("rounds") or []
    clients = c.get("clients")
    return ReportRow(
        model=p.get("model"), mechanism=p.get("mechanism"),
        dataset=(cfg.get("data") or {}).get("dataset"),
        eps=_num(p.get("eps")), delta=_num(p.get("delta")), unit=p.get("unit") or "",
        neighbour=p.get("neighbour"), private=p.get("private", True),
        accuracy=_num(acc.get("student")), label_accuracy=_num(acc.get("labels")),
        query_label_accuracy=acc.get("query_labels"),
        nonprivate_label_accuracy=(report.get("diagnostics") or {}).get("nonprivate_labels"),
        rounds=int(c.get("rounds") or len(rounds)), round_eps=tuple(r.get("eps") for r in rounds),
        ledger_events=len((p.get("ledger") or {}).get("entries") or []),
        clients=clients, queries=c.get("queries"), k_used=(cfg.get("rknn") or {}).get("k"),
        messages=c.get("messages"),
        bytes_per_client=(float(c.get("messages") or 0) * msg_bytes / max(1, clients or 0)
                          if "messages" in c else NAN),
        stage_s=stage_seconds(report.get("timings_s") or {}) if report.get("timings_s") else None)


def empty_row() -> dict:
    """Every schema field at its 'nothing known' value: the base of a failed cell's row."""
    return ReportRow().to_dict()


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


# ----------------------------------------------------------------------------- writers

def fmt(v, nd: int = 4) -> str:
    """A table cell: floats to ``nd`` significant digits, NaN as n/a, None as empty."""
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.{nd}g}"
    return "" if v is None else str(v)


def rows_to_csv(rows: list[dict], columns) -> str:
    """CSV text of ``rows`` with exactly ``columns`` (other keys are left out)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def markdown_table(header, rows, tails=None) -> list[str]:
    """Markdown table lines: ``header`` names, ``rows`` lists of cell texts; ``tails[i]``
    (optional) is appended after row i's closing bar (a failed cell's error)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, r in enumerate(rows):
        lines.append("| " + " | ".join(str(c) for c in r) + " |" + (tails[i] if tails else ""))
    return lines


def print_result(doc, as_json: bool, markdown_path: str) -> None:
    """An experiment job's answer on stdout: its JSON (``--json``) or its markdown table."""
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        with open(markdown_path) as fh:
            print(fh.read())

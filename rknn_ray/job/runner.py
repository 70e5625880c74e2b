"""``run(config) -> RunResult``: one whole job for a library user, no CLI needed.

    from rknn_ray.config import load_config
    from rknn_ray.job import run
    result = run(load_config("jobs/configs/digits_central.yaml"), "runs/mine")
    result.report["accuracy"], result.guarantee, result.paths["labels"]

Loads and partitions the data, reserves the job's budget in the persistent ledger before
anything randomizes, fits the encoder and the first queries, starts (or joins) Ray (before
the encoder when it trains on Ray Train: the library never starts Ray itself), runs
the private rounds (:mod:`.rounds`) and finishes labels, student and run folder
(:mod:`.finish`). ``resume=True`` finishes from a saved release.npz without a new private
round. The CLI (jobs/distill.py) adds argument parsing, the console and incomplete.json.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import yaml
import pyarrow.parquet as pq
import ray

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.ledger import recosted
from rknn_ray.accounting.budget_store import BudgetStore, job_default_budget, mark_driver
from rknn_ray.accounting.source_identity import job_source, legacy_release_name
from rknn_ray.errors import DataError, first_line
from rknn_ray.job.context import JobContext
from rknn_ray.job.finish import finish
from rknn_ray.job.private_scan import complete_scan
from rknn_ray.job.progress import Progress
from rknn_ray.job.ray_env import ensure_ray
from rknn_ray.job.resources import validate_resources
from rknn_ray.job.release_file import check_release, load_release, release_tag_key
from rknn_ray.job.rounds import check_dropout, private_rounds
from rknn_ray.job.session import Parties, new_job_id
from rknn_ray.remote.preflight import check_remote_parties
from rknn_ray.accounting.guarantee import Guarantee
import rknn_ray.job.stages as stages  # looked up at call time (tests replace them)
from rknn_ray.data import prepared      # the same: prepared.prepare_data
from rknn_ray.runio import clear_old_run, write_text
from rknn_ray.student.config import CHECKPOINT_FILE, HISTORY_FILE
from rknn_ray.config import Config

__all__ = ["RUN_FILES", "RunResult", "encoder_trains_on_ray", "run", "run_paths", "validated"]

#: the run folder's files (report.json last: it marks a complete run); ``RunResult.paths``
#: names each one the folder holds (diagnostics/ and report.html only once written)
RUN_FILES = {"config": "config.yaml", "release": "release.npz", "ledger": "ledger.json",
             "labels": "labels.parquet", "student": CHECKPOINT_FILE, "history": HISTORY_FILE,
             "summary": "summary.png", "report": "report.json", "diagnostics": "diagnostics",
             "report_html": "report.html", "predictor": "predictor.json"}


@dataclass(frozen=True)
class RunResult:
    """What one job produced: the report (report.json), the public samples' labels
    (labels.parquet's ``label``), the last round's guarantee, the ledger, the run folder and
    ``paths``: name -> path of each file in it (:data:`RUN_FILES`).

    :meth:`from_path` reads a finished run folder back (a notebook, another process)."""
    report: dict
    labels: np.ndarray
    guarantee: Guarantee
    ledger: dict
    out_dir: str
    paths: dict

    @classmethod
    def from_path(cls, run_dir: str) -> "RunResult":
        """The result of the finished run in ``run_dir`` (its report.json, labels.parquet,
        ledger.json), as :func:`run` returned it."""
        report_path = os.path.join(run_dir, RUN_FILES["report"])
        if not os.path.isfile(report_path):
            released = os.path.exists(os.path.join(run_dir, "release.npz"))
            why = ("the run did not finish (incomplete.json says why; rknn-ray run --resume "
                   f"{run_dir} finishes its saved release)"
                   if os.path.exists(os.path.join(run_dir, "incomplete.json")) and released
                   else "the run did not finish and released nothing (incomplete.json says "
                   "why), so there is no student to resume: run the job again"
                   if os.path.exists(os.path.join(run_dir, "incomplete.json"))
                   else "it is not a run folder")
            raise DataError(f"{run_dir} has no report.json: {why}")
        report = _read_json(report_path)
        # what it shows beside its events is a cache: recomputed from them
        report = {**report, "privacy": recosted(report["privacy"])}
        labels = pq.read_table(os.path.join(run_dir, RUN_FILES["labels"]),
                               columns=["label"]).column("label").to_numpy()
        ledger = recosted({"ledger": _read_json(os.path.join(run_dir, RUN_FILES["ledger"]))})[
            "ledger"]
        last = report["privacy"]["rounds"][-1]
        # a report written before its rounds carried their event: the ledger's last release
        # is that round (rounds are recorded in order); its eps is recomputed from the event
        source = last if "event" in last else ledger["entries"][-1]
        guarantee = Guarantee.from_dict({**last, "event": source["event"]},
                                        accounting=source.get("accounting"))
        return cls(report, labels, guarantee, ledger, run_dir, run_paths(run_dir))

    def labels_frame(self):
        """labels.parquet as a pandas DataFrame: the public row's id (the user's id column, its
        name in the schema's ``id_column``; else ``id``), ``label``, ``class``,
        ``margin``, ``query``, ``weight``, ``soft``; ``true_label`` only where public rows carry
        labels (rknn_ray.job.labels_file)."""
        return _parquet_frame(self.paths["labels"])

    def student(self):
        """The trained student (a torch module in eval mode, on the CPU) from student.pt."""
        from rknn_ray.student import load_student  # defers torch
        if "student" not in self.paths:
            raise DataError(f"{self.out_dir} holds no {CHECKPOINT_FILE}")
        return load_student(self.paths["student"])

    def predict(self, data, allow_pickle: bool = False):
        """The student's predictions for new rows: a pandas DataFrame with the id column
        (when ``data`` has the public part's), ``class`` (the class name) and
        ``probability``. ``data``: a DataFrame / Arrow table / dict with the table's feature
        columns, or a numpy array (rknn_ray.predictor.Predictor). ``allow_pickle``: a
        student on the encoder's features needs its pickled encoder (trust the folder)."""
        return self.predictor(allow_pickle).predict(data)

    def predictor(self, allow_pickle: bool = False):
        """The run's rknn_ray.predictor.Predictor (``predict_proba`` for every class)."""
        from rknn_ray.predictor import Predictor  # defers pandas, torch: on use
        return Predictor.from_run(self.out_dir, allow_pickle=allow_pickle)


def run_paths(run_dir: str) -> dict:
    """name -> path of each :data:`RUN_FILES` entry that ``run_dir`` holds."""
    paths = {k: os.path.join(run_dir, v) for k, v in RUN_FILES.items()}
    return {k: p for k, p in paths.items() if os.path.exists(p)}


def _read_json(path: str):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _parquet_frame(path: str):
    try:
        import pandas  # noqa: F401 - pyarrow's to_pandas needs it
    except ImportError:
        raise DataError("labels_frame() needs pandas. Fix: pip install pandas "
                        "(or read labels.parquet with pyarrow)") from None
    return pq.read_table(path).to_pandas()


def validated(cfg) -> "Config":
    """``cfg`` checked again as a whole: a Config changed in code (``dataclasses.replace``)
    gets the validation :func:`load_config` gives a file, before any work starts."""
    if not isinstance(cfg, Config):
        raise TypeError(f"run() takes a Config, not {type(cfg).__name__}: build one with "
                        "rknn_ray.config.load_config(path or dict)")
    return Config.from_dict(cfg.to_dict())


def run(cfg, out_dir: str, *, key_file: str | None = None, progress=None,
        ledger_path: str | None = None, resume: bool = False, parties: Parties | None = None,
        start_ray: Callable[[], bool] = ensure_ray, replace_old_run: bool = False,
        inputs: dict | None = None) -> RunResult:
    """Run the job for ``cfg`` (a :class:`~rknn_ray.config.Config`, validated again here: a
    bad value is a ConfigError before any work) into the prepared ``out_dir``.

    ``cfg.rounds.count`` rounds on one set of actors (shards, server key, shufflers live
    for the whole job); each round spends its share of ``privacy.eps``, is one ledger
    entry, and is saved to ``release.npz`` the moment it is released. ``parties``: the
    code each party's actor runs (tests inject faulty ones). ``start_ray`` starts or joins
    Ray and says whether it started it (then the job shuts it down). ``replace_old_run``:
    ``out_dir`` still holds the run ``--overwrite`` replaces (``prepare_run_dir(...,
    replace_at_start=True)``); its files are deleted once this job's budget is reserved.
    ``inputs``: data given in memory for data.dataset=table (rknn_ray.job.api).
    """

    cfg = validated(cfg)
    progress = progress or Progress.for_library(cfg.run.progress)
    # the ledger (a regular file) and its release key, before the data, Ray and the scan: a
    # missing key is named, never replaced; --resume checks its release's tag here too
    store = BudgetStore(ledger_path)
    tag_key = release_tag_key(store)
    if resume:
        check_release(out_dir, tag_key)          # unchanged since it was saved, this ledger's
    elif cfg.cluster.holders == "remote":        # its key, CA and service: before budget and Ray
        check_remote_parties(cfg)
    ray_up = _RayStart(start_ray, progress, cfg)
    try:
        ctx = _context(cfg, out_dir, progress, store, key_file, parties, inputs, ray_up)
    except BaseException:
        if ray_up.started:         # a table's scan started Ray, then refused the private rows
            ray.shutdown()
        raise
    try:
        if resume:
            if encoder_trains_on_ray(cfg):
                ray_up()                  # the encoder may train again, on Ray Train
            rounds, query_sets, ledger = _saved_rounds(ctx)
            mechanisms = None
            ray_up()
        else:
            _reserve(ctx, ray_up, replace_old_run)
            try:
                ray_up()
            except BaseException as exc:  # no client has randomized yet: nothing was released
                _return_reservation(ctx, exc)
                raise
            rounds, query_sets, ledger, mechanisms = private_rounds(ctx)
        last = mechanisms[-1] if mechanisms else None
        if last is None and rounds[-1].guarantee.model == "central":   # resumed: the plots' bound
            last = ctx.round_mechanism(len(rounds) - 1, query_sets[-1].size)
        report, labels = finish(ctx, rounds, query_sets, ledger, last)
    finally:
        if ray_up.started:
            ray.shutdown()
            training = sys.modules.get("rknn_ray.training.ray_train")  # loaded only if it trained
            if training is not None:
                training.join_abandoned_fits()
    return RunResult(report, labels, rounds[-1].guarantee, ledger.to_dict(), out_dir,
                     run_paths(out_dir))


def encoder_trains_on_ray(cfg) -> bool:
    """The SimCLR encoder trains on Ray Train (``represent.trainer: ray``): then the job starts
    Ray before fitting it (after the reservation), since the library never starts Ray."""
    return cfg.represent.encoder == "simclr" and cfg.represent.trainer == "ray"


class _RayStart:
    """Starts (or joins) Ray once, when the job first needs it; ``started``: this job started
    it (then the job shuts it down). A start is a stage of its own (``ray_start``): a local
    Ray takes 10-30 s, which the console otherwise spent without a line."""

    def __init__(self, start_ray: Callable[[], bool], progress: Progress | None = None,
                 cfg=None):
        self.start_ray, self.progress, self.cfg = start_ray, progress, cfg
        self.up = self.started = False

    def __call__(self) -> None:
        if self.up:
            return
        if self.progress is None or ray.is_initialized():      # a Ray of the caller's: no wait
            self.started = bool(self.start_ray())
        else:
            address = os.environ.get("RAY_ADDRESS")
            with self.progress.stage("ray_start", f"joining Ray at {address}" if address
                                     else "starting Ray"):
                self.started = bool(self.start_ray())
        self.up = True
        if self.started and self.cfg is not None:
            # a Ray this job started has no autoscaler: actors beyond its CPUs would wait
            # forever (the CLI checks os.cpu_count() before Ray; rknn_ray.run did not)
            validate_resources(self.cfg, float(ray.cluster_resources().get("CPU", 0)))


def _context(cfg, out_dir, progress, store, key_file, parties, inputs=None,
             ray_up=None) -> JobContext:
    with progress.stage("data", f"loading {cfg.data.dataset} and partitioning"):
        # fails fast on missing files / bad data, writes nothing
        data = prepared.prepare_data(cfg, inputs) if inputs else prepared.prepare_data(cfg)
    # a user's table: its private rows are scanned where the shards run (Ray starts for it)
    data = complete_scan(cfg, data, store, ray_up or (lambda: None), progress)
    if getattr(data, "holders", None) and data.holders.get("column"):
        h = data.holders
        progress.say(f"private part: {h['records']} records of {h['holders']} holders (at "
                     f"most {h['bound']} kept each: {h['kept']} records report; holders and "
                     "their record counts are public under the job's relation)")
        for name, site in (h.get("sites") or {}).items():     # public: which site holds whom
            progress.say(f"  site {name}: {site['records']} records of {site['holders']} "
                         f"holders, {site['shards']} shard(s) on its own nodes")
    if getattr(data, "domain", None):     # public: bounds from the public rows or the config
        cols = data.domain["columns"]
        given = sum(c["from"] != "public" for c in cols.values())
        progress.say(f"private values: clipped to their column's bounds ({len(cols) - given} "
                     f"from the public range widened by data.clip.margin="
                     f"{data.domain['margin']:g}, {given} from "
                     "data.clip.bounds; report.json privacy.domain); NaN / infinite refused")
    cfg, auto_choice = stages.resolve_auto(cfg, data)       # queries.s / rknn.k: auto (public info only)
    if auto_choice:
        progress.say(f"auto: s = {auto_choice['s']}, k = {auto_choice['k']} "
                     f"({auto_choice['reason']})")
    # the budget is the records' source's (any split / seed / partition); the release is this
    # job's private part as split and partitioned (resume must find the same one)
    identity, described, release_key = job_source(store, cfg, data)
    return JobContext(cfg, data, out_dir, progress, store, identity, described, release_key,
                      key_file=key_file, parties=parties or Parties(), auto_choice=auto_choice)


def _saved_rounds(ctx: JobContext) -> tuple:
    """--resume: the rounds saved in release.npz (no private round, no budget spent)."""
    cfg = ctx.cfg        # the release's tag was checked before any work (run)
    ctx.encoder, ctx.public_emb, _ = stages.fit_queries(cfg, ctx.data, ctx.say)  # public, deterministic
    job_id, saved_identity, rounds, query_sets = load_release(ctx.out_dir, ctx.public_emb)
    # run folders from before keyed names hold the bare digest: still recognized
    if saved_identity not in (ctx.release_key, legacy_release_name(cfg, ctx.data)):
        raise DataError(f"{ctx.out_dir}/release.npz was released from other private data than "
                        f"this config loads, or recorded in another ledger ({saved_identity} vs "
                        f"{ctx.release_key}). Fix: resume with the run folder's own config.yaml, "
                        "unchanged, and the ledger the job ran with (--ledger)")
    ctx.job_id = job_id
    ledger = PrivacyLedger(accountant=cfg.privacy.accountant)
    for t, r in enumerate(rounds):
        ledger.record(r.guarantee, round_id=t, messages=r.messages, clients=r.clients)
    ctx.budget = ctx.store.budget(ctx.identity) or (float("nan"), float("nan"))
    ctx.say(f"resuming from release.npz: {len(rounds)} round(s) already released; "
            "no new private round, no budget spent")
    return rounds, query_sets, ledger


def _reserve(ctx: JobContext, ray_up: Callable[[], None], replace_old_run: bool = False) -> None:
    """Reserve the job's whole spend before anything randomizes, then the public work
    (the old run's files out, config.yaml, Ray if the encoder trains on it, encoder, first
    queries); a failure here returns the reservation."""
    cfg, data, progress = ctx.cfg, ctx.data, ctx.progress
    sp = data.splits
    check_dropout(cfg, data)             # a round sure to be refused costs no budget
    ctx.job_id = new_job_id()
    p = cfg.privacy
    # the budget lasts across jobs: reserve this job's whole spend before anything randomizes
    ctx.budget = ctx.store.reserve(ctx.identity, ctx.described, ctx.job_id, p.eps, p.delta,
                                   job_default_budget(p, len(sp.private_y)),
                                   accountant=p.accountant, records=len(sp.private_y))
    try:
        mark_driver(ctx.store, ctx.identity, ctx.job_id)     # not settled while this job runs
        if replace_old_run:           # the new job starts work: only now is the old run replaced
            clear_old_run(ctx.out_dir)
        progress.say(f"privacy budget of {ctx.described}: eps={ctx.budget[0]:g}, "
                     f"delta={ctx.budget[1]:g}; this job reserved eps={p.eps:g} "
                     f"(ledger {ctx.store.path})")
        write_text(os.path.join(ctx.out_dir, "config.yaml"),
                   yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        progress.say(f"private {len(sp.private_y)} records in {data.num_clients} clients, "
                     f"public {len(sp.public_y)}, evaluation {len(sp.eval_y)}")
        for line in multi_record_lines(cfg, data):
            progress.say(line)
        if encoder_trains_on_ray(cfg):
            ray_up()
        fit_s = ctx.round_sizes()[0]
        with progress.stage("queries", f"encoder + k-means: s = {fit_s} queries"
                            + (f" (of {cfg.queries.s}, split over {cfg.rounds.count} rounds)"
                               if cfg.rounds.split_queries else "")):
            ctx.encoder, ctx.public_emb, ctx.first_queries = stages.fit_queries(cfg, data,
                                                                                   progress.say)
    except BaseException as exc:
        _return_reservation(ctx, exc)
        raise


def multi_record_lines(cfg, data) -> list[str]:
    """What privacy.multi_record means for this job's holders, from public counts only (the
    holders, the records they keep, the bound): under ``each`` the holder-level cost beside
    the record-level eps; under ``sample`` with holders of several records, that ``each``
    would send a report per kept record (issue 57: a 0.61 student under sample, 0.89 under
    each, and nothing said so)."""
    p, h = cfg.privacy, getattr(data, "holders", None) or {}
    if p.model == "central" or not h.get("column"):
        return []
    bound, kept, holders = int(h["bound"]), int(h["kept"]), int(h["holders"])
    if p.multi_record == "each":
        larger_delta = " and a delta m e^((m-1) eps) times larger" if p.delta > 0 else ""
        return [f"privacy.multi_record=each: each of the {kept} kept records is a client of "
                f"its own ({holders} holders): eps={p.eps:g} per record; a holder of m kept "
                f"records is protected at m x eps (group privacy{larger_delta}), at most "
                f"{bound} x {p.eps:g} = {bound * p.eps:g}"]
    if p.multi_record == "sample" and kept >= 2 * holders and p.mechanism != "multi":
        return [f"privacy.multi_record=sample: each of the {holders} holders reports one of "
                f"its records ({kept} kept); privacy.multi_record=each would send {kept} "
                "reports, one per kept record (eps per record, m x eps for a holder of m), "
                "often far more accurate labels"]
    return []


def _return_reservation(ctx: JobContext, exc: BaseException) -> None:
    ctx.store.close_job(ctx.identity, ctx.job_id, f"job ended before any client randomized "
                        f"({type(exc).__name__}: {first_line(exc)}); reservation returned")

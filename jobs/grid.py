"""An experiment grid: private runs over (encoder, s, k, model, eps, seed), one table.

    python -m jobs.grid --config jobs/configs/digits_central.yaml --out runs/grid-digits \\
        [--encoder pca hog:64] [--s 30 60] [--k 1 3] [--model central shuffle/collision] \\
        [--eps 0.1 1] [--seeds 0 1 2] [--set KEY=VALUE ...] [--student-epochs N] \\
        [--delta 1e-5] [--no-reference] [--json] [--insecure-seeded] [--concurrent N]
        [--tensorboard] [--mlflow URI]
    rknn-ray grid ...                        # the same

Every cell is a real ``jobs.distill`` run of the base config with the cell's values
(``represent.encoder[/dim]``, ``queries.s``, ``rknn.k``, ``privacy.model[/mechanism]``,
``privacy.eps``, ``run.seed``) in ``--out``/runs/<cell>/, its release recorded as an
event in an isolated ledger (``--out``/ledger.sqlite), so the user's budgets are
neither spent nor in the way. An axis left out takes the base config's value.

* ``--encoder NAME[:DIM]``: pca, hog, simclr, raw (``hog:64`` also sets represent.dim).
* ``--model MODEL[/MECHANISM]``: the trust model and its mechanism (central/laplace,
  local/rr, local/collision, shuffle/collision, shuffle/multi, ...); without a
  mechanism: the config's if its model matches, else laplace (central) or collision.
  Shuffle cells need delta: ``--delta`` (default: the config's, else 1e-5).
* ``--s`` / ``--k``: numbers or ``auto`` (rknn_ray.labeling.autotune picks them per cell).

Per (encoder, resolved s, resolved k, seed) the grid also runs the NON-PRIVATE reference
of the same pipeline (rknn_ray.job.reference: exact counts, same labels and student) in
``--out``/reference/ (a README there says NOT PRIVATE); ``--no-reference`` skips it.
Private run folders never hold it.

Outputs (atomic, rewritten after every cell): grid.json (cells, per-seed rows; summary,
the median over seeds per (encoder, s, k, model, eps); reference, marked private:
false; paper, paper 000 Table 1's "Ours" rows at the same dataset), grid.csv (the
summary table), grid.md (summary + per-seed tables), grid.png (student accuracy vs eps:
one line per (encoder, s, k, model), the reference dashed, the paper's numbers as
stars), meta.json. The cells run through jobs.experiments.Runner, each a Ray Tune trial
running the whole job (``--concurrent N`` at once, default what the CPUs fit;
``--tensorboard``: per-epoch curves under ``--out``/tune/; ``--mlflow URI``: one MLflow run per
cell), so it is resumable after a kill:
a cell whose run folder holds report.json and the same cell spec (grid_cell.json) is not
run again; a failed cell is a row with its error and runs again next time. Cell rows hold
the jobs.experiments.ReportRow fields (``model`` the trust model, ``mechanism`` beside it).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field

from jobs.cells import ISOLATED_BUDGET, error_text
from jobs.config_files import resolve_config
from jobs.experiments import (Job, Runner, add_runner_arguments, concurrency, run_command,
                              spec_digest)
from jobs.writers import accuracy_vs_eps_png, fmt, markdown_table, print_result, write_tables
from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.paper_numbers import matching, paper_rows
# the job layer (Ray, torch: ~2-5 s) loads where it is used: ``rknn-ray grid --help`` stays fast
from rknn_ray.rng import NOT_PRIVATE as SEEDED_NOT_PRIVATE
from rknn_ray.rng import check_consent
from rknn_ray.runio import write_json

DEFAULT_MECHANISM = {"central": "laplace", "local": "collision", "shuffle": "collision"}
CELL_FILE = "grid_cell.json"
REFERENCE_FILE = "reference.json"
SUMMARY_COLUMNS = ("encoder", "s", "k", "model", "target_eps", "eps", "delta", "unit", "seeds",
                   "accuracy", "label_accuracy", "accuracy_per_seed", "s_used", "k_used",
                   "reference_accuracy", "reference_label_accuracy", "paper_accuracy",
                   "paper_label_accuracy", "paper_nonprivate_accuracy", "paper_setting", "errors")
NOT_PRIVATE_NOTE = ("reference_* columns are NOT PRIVATE: the same pipeline on the exact private "
                    "counts (no noise), computed in reference/; leave them out (--no-reference) "
                    "before sharing this table with anyone who may not see the private data")


# ----------------------------------------------------------------------------- the grid

@dataclass(frozen=True)
class GridSpec:
    """What a grid runs: the base config (a file or a packaged name), ``sets`` on every cell,
    the axes (None: the config's value; ``s`` / ``k``: numbers or "auto"; ``models``:
    MODEL[/MECHANISM]; ``encoders``: NAME[:DIM]), the shuffle cells' ``delta``, the
    students' epochs, whether the NOT PRIVATE reference runs, and the consent a seeded
    (NOT private) config needs."""
    config: str
    sets: tuple = ()
    encoders: list | None = None
    s: list | None = None
    k: list | None = None
    models: list | None = None
    eps: list | None = None
    seeds: list | None = None
    delta: float | None = None
    student_epochs: int | None = None
    reference: bool = True
    insecure_seeded: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "GridSpec":
        return cls(args.config, tuple(args.sets), args.encoder, args.s, args.k, args.model,
                   args.eps, args.seeds, args.delta, args.student_epochs,
                   reference=not args.no_reference, insecure_seeded=args.insecure_seeded)


@dataclass(frozen=True)
class Cell:
    encoder: str            # "pca" or "hog:64"
    s: object               # int or "auto"
    k: object
    model: str              # "central/laplace"
    eps: float
    seed: int
    overrides: tuple = field(default=(), compare=False)

    @property
    def name(self) -> str:
        return (f"{self.encoder.replace(':', '-')}_s{self.s}_k{self.k}_"
                f"{self.model.replace('/', '-')}_eps{self.eps:g}_seed{self.seed}")

    @property
    def group(self) -> tuple:
        """What the median runs over seeds for."""
        return (self.encoder, self.s, self.k, self.model, self.eps)


def _axis(values, default, what: str, parse):
    vals = list(default if values is None else values)
    if not vals:
        raise ConfigError(what, "is empty: the grid would have no cells",
                          f"give {what} at least one value, or leave it out to use the config's")
    out = []
    for v in vals:
        v = parse(v)
        if v not in out:
            out.append(v)
    return out


def _int_or_auto(what: str):
    def parse(v):
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise ConfigError(what, f"{v!r} is not a whole number or 'auto'",
                              f"write {what} 60 200 or {what} auto") from None
        if f != int(f) or f < 1:
            raise ConfigError(what, f"{v!r} is not a whole number >= 1", f"write {what} 60 200")
        return int(f)
    return parse


def _eps(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError("--eps", f"{v!r} is not a number", "write --eps 0.1 1 4") from None
    if not math.isfinite(f) or f <= 0:
        raise ConfigError("--eps", f"{v!r}: eps must be a finite number > 0",
                          "write --eps 0.1 1 4 (the non-private reference is computed "
                          "separately; no eps = 0 or inf cell is needed)")
    return f


def _seed(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        f = -1.0
    if f != int(f) or f < 0:
        raise ConfigError("--seeds", f"{v!r} is not a whole number >= 0", "write --seeds 0 1 2")
    return int(f)


def _encoder(v):
    name, _, dim = str(v).strip().partition(":")
    if not name or (dim and not dim.isdigit()):
        raise ConfigError("--encoder", f"{v!r} is not NAME or NAME:DIM", "write --encoder pca hog:64")
    return f"{name}:{int(dim)}" if dim else name


def _model(base):
    def parse(v):
        model, _, mech = str(v).strip().partition("/")
        if not mech:
            mech = base.privacy.mechanism if model == base.privacy.model \
                else DEFAULT_MECHANISM.get(model, "")
        return f"{model}/{mech}"
    return parse


def plan(spec: GridSpec):
    """The base config and every cell, each validated as a full config (a bad key or value
    fails here, before anything runs). Returns (base Config, [(Cell, Config)], axes)."""
    config = resolve_config(spec.config)
    sets, delta, student_epochs = spec.sets, spec.delta, spec.student_epochs
    base = load_config(config, list(sets))
    axes = {
        "encoder": _axis(spec.encoders, [base.represent.encoder], "--encoder", _encoder),
        "s": _axis(spec.s, [base.queries.s], "--s", _int_or_auto("--s")),
        "k": _axis(spec.k, [base.rknn.k], "--k", _int_or_auto("--k")),
        "model": _axis(spec.models, [base.privacy.model], "--model", _model(base)),
        "eps": _axis(spec.eps, [base.privacy.eps], "--eps", _eps),
        "seed": _axis(spec.seeds, [base.run.seed], "--seeds", _seed),
    }
    if delta is not None and not (0 < float(delta) < 1):
        raise ConfigError("--delta", f"{delta!r} is not in (0, 1)", "write --delta 1e-5")
    cells = []
    for enc, s_, k_, model, e, seed in itertools.product(*axes.values()):
        name, _, dim = enc.partition(":")
        m, mech = model.split("/", 1)
        over = list(sets) + [f"represent.encoder={name}"] + ([f"represent.dim={dim}"] if dim else [])
        over += [f"queries.s={s_}", f"rknn.k={k_}", f"privacy.model={m}",
                 f"privacy.mechanism={mech}", f"privacy.eps={e!r}", f"run.seed={seed}",
                 "run.progress=false", "run.diagnostics=false", *ISOLATED_BUDGET]
        if m == "shuffle":
            d = delta if delta is not None else (base.privacy.delta or 1e-5)
            over.append(f"privacy.delta={float(d)!r}")
        else:                 # central and local are pure: a base config's delta is not theirs
            over.append("privacy.delta=0")
        if student_epochs:
            over.append(f"student.epochs={int(student_epochs)}")
        cell = Cell(enc, s_, k_, model, e, seed, tuple(over))
        try:
            cfg = load_config(config, over)
        except ConfigError as exc:
            raise ConfigError(exc.key, f"{exc.problem} (in grid cell {cell.name})", exc.fix) from None
        cells.append((cell, cfg))
    return base, cells, axes


_digest = spec_digest


# ----------------------------------------------------------------------------- one cell

def cell_job(cell: Cell, cfg) -> Job:
    """A grid cell as a runner job: a jobs.distill run in runs/<cell>, resumable by its
    spec (grid_cell.json). Its row: the cell's names, the report-row schema (``model`` is
    the trust model, ``mechanism`` beside it), and ``s_used`` / ``k_used`` (what ``auto``
    resolved to)."""
    model, mechanism = cell.model.split("/", 1)
    keys = {"kind": "private", "encoder": cell.encoder, "s": cell.s, "k": cell.k,
            "model": model, "mechanism": mechanism, "target_eps": cell.eps, "seed": cell.seed,
            "s_used": None}
    return Job(cell.name, keys, cfg=cfg,
               extra=lambda report: {"s_used": report["counts"]["queries"],
                                     "k_used": report["config"]["rknn"]["k"]})


# ----------------------------------------------------------------------------- reference

def reference_config(cell_cfg, row: dict):
    """The cell's config with the s and k its private run used (``auto`` resolved)."""
    if row.get("s_used") is None:
        if "auto" in (cell_cfg.queries.s, cell_cfg.rknn.k):
            return None
        return cell_cfg
    return cell_cfg.with_overrides([f"queries.s={row['s_used']}", f"rknn.k={row['k_used']}"])


def reference_key(cell: Cell, ref_cfg) -> tuple[str, str]:
    """(folder name, spec digest): everything but the privacy section and run flags matters."""
    d = ref_cfg.to_dict()
    d.pop("privacy")
    d["run"] = {"seed": d["run"]["seed"]}
    digest = _digest(d)
    name = (f"{cell.encoder.replace(':', '-')}_s{ref_cfg.queries.s}_k{ref_cfg.rknn.k}_"
            f"seed{cell.seed}_{digest[:8]}")
    return name, digest


def run_reference(name: str, digest: str, ref_cfg, out: str,
                  before_run=None) -> tuple[dict, bool]:
    """The NON-PRIVATE reference in ``out``/reference/<name> (or the saved one);
    ``before_run()`` is called only when it must be computed (the runner starts Ray)."""
    folder = os.path.join(out, "reference", name)
    path = os.path.join(folder, REFERENCE_FILE)
    if os.path.isfile(path):
        try:
            with open(path) as fh:
                saved = json.load(fh)
            if saved.get("spec") == digest:
                return saved["row"], True
        except (OSError, ValueError):
            pass
    from rknn_ray.job.reference import NOT_PRIVATE, nonprivate_reference  # deferred (Ray)
    base = {"kind": "reference", "private": False, "warning": NOT_PRIVATE, "name": name,
            "folder": folder, "s": ref_cfg.queries.s, "k": ref_cfg.rknn.k,
            "encoder": ref_cfg.represent.encoder, "seed": ref_cfg.run.seed}
    if before_run is not None:
        before_run()
    t0 = time.perf_counter()
    try:
        res = nonprivate_reference(ref_cfg, folder)
    except Exception as exc:
        return {**base, "accuracy": float("nan"), "label_accuracy": float("nan"),
                "wall_s": time.perf_counter() - t0, "error": error_text(exc)}, False
    row = {**base, "accuracy": res["student_accuracy"], "label_accuracy": res["label_accuracy"],
           "query_accuracy": res["query_accuracy"], "wall_s": res["wall_s"], "error": ""}
    write_json(path, {"spec": digest, "row": row, "result": res,
                      "config": ref_cfg.to_dict()})
    return row, False


# ----------------------------------------------------------------------------- tables

def _median(vals):
    vals = sorted(v for v in vals if isinstance(v, (int, float)) and not math.isnan(v))
    if not vals:
        return float("nan")
    n = len(vals)
    return vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])


def summarize(cells: list[Cell], rows: dict, refs: dict, ref_of: dict, dataset: str) -> list[dict]:
    """One row per (encoder, s, k, model, eps): medians over seeds, the reference (NOT
    PRIVATE) of the same cells, the paper's numbers at the same dataset and eps."""
    groups: dict = {}
    for c in cells:
        groups.setdefault(c.group, []).append(c)
    out = []
    for (enc, s, k, model, eps), members in groups.items():
        got = [rows[c.name] for c in members if c.name in rows]
        ok = [r for r in got if not r["error"]]
        ref = [refs[ref_of[c.name]] for c in members if ref_of.get(c.name) in refs]
        paper = matching(dataset, eps, s if isinstance(s, int) else None)
        p0 = paper[0] if paper else None
        out.append({
            "encoder": enc, "s": s, "k": k, "model": model, "target_eps": eps,
            "eps": max((r["eps"] for r in ok), default=float("nan")),
            "delta": max((r["delta"] for r in ok), default=float("nan")),
            "unit": ok[0]["unit"] if ok else "", "seeds": len(ok),
            "accuracy": _median(r["accuracy"] for r in ok),
            "label_accuracy": _median(r["label_accuracy"] for r in ok),
            "accuracy_per_seed": " / ".join(f"{r['accuracy']:.4f}" for r in ok),
            "s_used": " ".join(sorted({str(r["s_used"]) for r in ok})),
            "k_used": " ".join(sorted({str(r["k_used"]) for r in ok})),
            "reference_accuracy": _median(r["accuracy"] for r in ref),
            "reference_label_accuracy": _median(r["label_accuracy"] for r in ref),
            "paper_accuracy": p0.test_accuracy if p0 else None,
            "paper_label_accuracy": p0.label_accuracy if p0 else None,
            "paper_nonprivate_accuracy": p0.nonprivate_accuracy if p0 else None,
            "paper_setting": "; ".join(f"{p.label} (k={p.k}, T={p.rounds}, {p.representation})"
                                       for p in paper),
            "errors": "; ".join(r["error"] for r in got if r["error"]),
        })
    return out


def _model_name(row: dict) -> str:
    """``central/laplace``: a cell row's trust model and mechanism, as the --model axis names it."""
    m, mech = row.get("model") or "", row.get("mechanism")
    return f"{m}/{mech}" if mech and "/" not in m else m


def _pct(v) -> str:
    return "" if v is None else fmt(v)


def to_markdown(summary: list[dict], cell_rows: list[dict], refs: list[dict], meta: dict) -> str:
    ref_on = meta.get("reference", True)
    head = ["encoder", "s", "k", "model", "eps (target / spent)", "delta", "seeds",
            "student acc (median)", "label acc (median)", "student acc per seed", "s, k used"]
    if ref_on:
        head += ["NOT PRIVATE ref. student", "NOT PRIVATE ref. labels"]
    head += ["paper student", "paper labels", "paper non-private", "paper setting"]
    lines = [f"# Experiment grid on {meta['dataset']} ({meta['config']})", "",
             f"{meta['cells']} private runs, median over {len(meta['axes']['seed'])} seed(s); "
             f"wall time {meta['wall_s']:.0f} s on {meta['cpus']} CPU cores"
             + ("" if meta.get("complete") else " (INCOMPLETE: still running or interrupted)")
             + ".", ""]
    if not meta.get("private", True):
        lines += [f"**NOT PRIVATE: run.rng = seeded. {SEEDED_NOT_PRIVATE}**", ""]
    table = []
    for r in summary:
        cells = [r["encoder"], str(r["s"]), str(r["k"]), r["model"],
                 f"{fmt(r['target_eps'])} / {fmt(r['eps'])}", fmt(r["delta"]), str(r["seeds"]),
                 fmt(r["accuracy"]), fmt(r["label_accuracy"]), r["accuracy_per_seed"],
                 f"{r['s_used']}, {r['k_used']}"]
        if ref_on:
            cells += [fmt(r["reference_accuracy"]), fmt(r["reference_label_accuracy"])]
        cells += [_pct(r["paper_accuracy"]), _pct(r["paper_label_accuracy"]),
                  _pct(r["paper_nonprivate_accuracy"]), r["paper_setting"]]
        table.append(cells)
    lines += markdown_table(head, table, [f" errors: {r['errors']}" if r["errors"] else ""
                                          for r in summary])
    lines += ["", "Student accuracy: the student on the evaluation split; label accuracy: the "
              "released labels propagated to the public set (Acc_pl). eps spent and delta are "
              "what the run's accountant reports (record level, replace-one)."]
    if ref_on:
        lines += ["", f"**{NOT_PRIVATE_NOTE}.**"]
    lines += ["", "paper: paper 000 Table 1 \"Ours\" rows at the same dataset and eps "
              "(rknn_ray/paper_numbers.py); its representation and student differ from ours "
              "(see the setting column and jobs/configs/<dataset>_*.yaml).", "",
              "## Per seed", ""]
    lines += markdown_table(
        ("cell", "seed", "student acc", "label acc", "eps spent", "delta", "s, k used", "wall s",
         "error"),
        [[f"{r['encoder']} s={r['s']} k={r['k']} {_model_name(r)} eps={fmt(r['target_eps'])}",
          r["seed"], fmt(r["accuracy"]), fmt(r["label_accuracy"]), fmt(r["eps"]), fmt(r["delta"]),
          f"{r.get('s_used')}, {r.get('k_used')}", f"{r['wall_s']:.0f}", r["error"]]
         for r in cell_rows])
    if refs:
        lines += ["", "## NOT PRIVATE reference (exact counts, same pipeline; reference/)", ""]
        lines += markdown_table(
            ("encoder", "s", "k", "seed", "student acc", "label acc", "wall s", "error"),
            [[r["encoder"], r["s"], r["k"], r["seed"], fmt(r["accuracy"]),
              fmt(r["label_accuracy"]), f"{r['wall_s']:.0f}", r["error"]] for r in refs])
    return "\n".join(lines) + "\n"


def plot(summary: list[dict], path: str, dataset: str) -> None:
    """Student accuracy vs eps per (encoder, s, k, model); reference dashed; paper as stars."""
    groups: dict = {}
    for r in summary:
        groups.setdefault((r["encoder"], r["s"], r["k"], r["model"]), []).append(r)
    eps_all = [r["target_eps"] for r in summary]
    lines = []
    for i, (key, rs) in enumerate(groups.items()):
        color = f"C{i % 10}"
        rs = sorted(rs, key=lambda r: r["target_eps"])
        pts = [(r["target_eps"], r["accuracy"]) for r in rs if not math.isnan(r["accuracy"])]
        enc, s, k, model = key
        if pts:
            lines.append(([p[0] for p in pts], [p[1] for p in pts],
                          {"marker": "o", "color": color, "label": f"{enc} s={s} k={k} {model}"}))
        ref = [(r["target_eps"], r["reference_accuracy"]) for r in rs
               if not math.isnan(r["reference_accuracy"])]
        if ref:
            xs = [p[0] for p in ref]
            ys = [p[1] for p in ref]
            if len(ref) == 1:       # a level, drawn across the eps range
                xs, ys = [min(eps_all), max(eps_all)], ys * 2
            lines.append((xs, ys, {"ls": "--", "color": color, "alpha": 0.8,
                                   "label": f"NOT PRIVATE reference ({enc} s={s} k={k})"}))
    paper = paper_rows(dataset)
    for j, p in enumerate(paper):
        lines.append(([p.eps], [p.test_accuracy],
                      {"marker": "*", "ms": 13, "ls": "none", "color": "k", "alpha": 0.75,
                       "label": "paper 000 Table 1 (Ours)" if j == 0 else None}))
    accuracy_vs_eps_png(path, lines, f"{dataset}: accuracy vs eps (median over seeds)",
                        size=(8.5, 5.2), xlabel="eps (target)", top=1.02,
                        legend_loc="lower right",
                        notes=[(f"{p.setting} s={p.queries}", (p.eps, p.test_accuracy))
                               for p in paper])


def write_outputs(out: str, cells: list[Cell], rows: dict, refs: dict, ref_of: dict,
                  meta: dict) -> dict:
    cell_rows = [rows[c.name] for c in cells if c.name in rows]
    ref_rows = list(refs.values())
    summary = summarize(cells, rows, refs, ref_of, meta["dataset"])
    doc = {"meta": meta, "summary": summary, "cells": cell_rows, "reference": ref_rows,
           "paper": [p.to_dict() for p in paper_rows(meta["dataset"])],
           "reference_note": NOT_PRIVATE_NOTE if meta.get("reference", True) else None}
    write_tables(out, "grid", doc, table=summary, columns=SUMMARY_COLUMNS,
                 markdown=to_markdown(summary, cell_rows, ref_rows, meta), meta=meta,
                 plot=lambda path: plot(summary, path, meta["dataset"]))
    return doc


# ----------------------------------------------------------------------------- driver

def grid(spec: GridSpec, out: str, log=None, concurrent: int | None = None,
         tensorboard: bool = False, mlflow: str | None = None) -> dict:
    """Plan ``spec`` (validating every cell), run what is not done yet in ``out`` as Ray Tune
    trials (``concurrent`` at once; None: what the CPUs fit; ``tensorboard``: event files
    under ``out``/tune/; ``mlflow``: an MLflow tracking URI), write the outputs; returns the
    grid.json document."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    config, sets, reference = spec.config, spec.sets, spec.reference
    base, planned, axes = plan(spec)
    check_consent(base, spec.insecure_seeded)       # run.rng=seeded: only when asked, marked
    if not os.environ.get("RAY_ADDRESS"):
        for _, cfg in planned:
            from rknn_ray.job.resources import validate_resources  # deferred (Ray)
            validate_resources(cfg, float(os.cpu_count() or 1))
        # --concurrent N: N cells' reservations and a student must fit, checked before Ray
        concurrency([cell_job(c, cfg) for c, cfg in planned], float(os.cpu_count() or 1),
                     concurrent)
    elif concurrent is not None and concurrent < 1:
        concurrency([], 1.0, concurrent)
    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    cells = [c for c, _ in planned]
    meta = {"config": config, "dataset": base.data.dataset, "sets": list(sets),
            "axes": axes, "student_epochs": spec.student_epochs, "reference": reference,
            "cells": len(cells), "cpus": os.cpu_count(), "wall_s": 0.0, "complete": False,
            "private": base.run.rng == "secure",
            "ledger": os.path.join(out, "ledger.sqlite")}
    log(f"grid: {len(cells)} private cells ({' x '.join(f'{len(v)} {a}' for a, v in axes.items())})"
        f" of {config} into {out}" + (" + the NOT PRIVATE reference per (encoder, s, k, seed)"
                                      if reference else ""))
    refs, ref_of = {}, {}
    result: dict = {}

    def named(rows: list) -> dict:
        return dict(runner.by_name)        # the cells finished so far (any order)

    def write(rows: list, m: dict) -> None:
        result["doc"] = write_outputs(out, cells, named(rows), refs, ref_of, m)

    def progress(i, n, job, row, skipped):
        log(f"[{i}/{n}] {job.name}: " + (
            "done before, skipped" if skipped else
            f"ERROR {row['error']}" if row["error"] else
            f"student {row['accuracy']:.4f}, labels {row['label_accuracy']:.4f}, "
            f"eps {fmt(row['eps'])}, delta {fmt(row['delta'])}, s={row['s_used']}, "
            f"k={row['k_used']} ({row['wall_s']:.0f} s)"))

    def references(rows: list) -> None:
        """The NOT PRIVATE reference per (encoder, resolved s, k, seed), after the cells."""
        if not reference:
            return
        by_name = named(rows)
        todo: dict = {}
        for cell, cfg in planned:
            ref_cfg = reference_config(cfg, by_name[cell.name])
            if ref_cfg is None:
                continue
            name, digest = reference_key(cell, ref_cfg)
            ref_of[cell.name] = name
            todo.setdefault(name, (digest, ref_cfg))
        for j, (name, (digest, ref_cfg)) in enumerate(todo.items(), 1):
            row, skipped = run_reference(name, digest, ref_cfg, out, runner.ensure_ray)
            refs[name] = row
            log(f"[reference {j}/{len(todo)}, NOT PRIVATE] {name}: " + (
                "done before, skipped" if skipped else
                f"ERROR {row['error']}" if row["error"] else
                f"student {row['accuracy']:.4f}, labels {row['label_accuracy']:.4f} "
                f"({row['wall_s']:.0f} s)"))
            runner.elapsed()
            write(rows, meta)

    runner = Runner(out, write=write, log=progress, meta=meta, cell_file=CELL_FILE,
                    concurrent=concurrent, tensorboard=tensorboard, mlflow=mlflow)
    runner.run([cell_job(cell, cfg) for cell, cfg in planned], then=references)
    return result["doc"]


EXAMPLES = """\
examples:
  rknn-ray grid --config digits_central --eps 0.1 1 --s 30 60 --out runs/grid-digits
  rknn-ray grid --config digits_central --model central shuffle/collision --seeds 0 1 --out g2
  python -m jobs.grid --config jobs/configs/digits_central.yaml --eps 1 --out g3"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray grid", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(os.path.dirname(__file__), "configs",
                                                     "digits_central.yaml"),
                    help="a YAML file, or a packaged config by name (rknn-ray run --list-configs)")
    ap.add_argument("--out", required=True, help="grid folder (resumable)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value in every cell (repeatable)")
    ap.add_argument("--encoder", nargs="+", default=None, help="NAME[:DIM] ... (pca hog:64)")
    ap.add_argument("--s", nargs="+", default=None, help="queries s ... (numbers or auto)")
    ap.add_argument("--k", nargs="+", default=None, help="neighbours k ... (numbers or auto)")
    ap.add_argument("--model", nargs="+", default=None,
                    help="MODEL[/MECHANISM] ... (central, local/rr, shuffle/collision, ...)")
    ap.add_argument("--eps", nargs="+", default=None, help="target eps ... (> 0)")
    ap.add_argument("--seeds", nargs="+", default=None, help="run.seed values (median over them)")
    ap.add_argument("--delta", type=float, default=None,
                    help="delta of shuffle cells (default: the config's, else 1e-5)")
    ap.add_argument("--student-epochs", type=int, default=None)
    ap.add_argument("--no-reference", action="store_true",
                    help="skip the NOT PRIVATE reference (a table safe to share)")
    ap.add_argument("--json", action="store_true", help="print grid.json instead of grid.md")
    add_runner_arguments(ap, "cell")
    ap.add_argument("--insecure-seeded", action="store_true",
                    help="allow run.rng=seeded (a reproducible simulation, NOT private)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    return run_command(args.out, lambda: grid(GridSpec.from_args(args), args.out,
                                              concurrent=args.concurrent,
                                              tensorboard=args.tensorboard, mlflow=args.mlflow),
                       lambda doc: print_result(doc, args.json,
                                                os.path.join(args.out, "grid.md")))


if __name__ == "__main__":
    sys.exit(main())

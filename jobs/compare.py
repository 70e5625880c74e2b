"""Every private distillation method side by side, on the same data, at the same eps.

    python -m jobs.compare --dataset digits --eps 0.1 1 4 --out runs/compare-digits [--json]
        [--methods rknn_central pate_gnmax ...] [--delta 1e-5] [--student-epochs N]
        [--diagnostics] [--concurrent N] [--tensorboard] [--mlflow URI]

Runs reverse k-NN (jobs.distill with jobs/configs/<dataset>_{central,local,shuffle}.yaml)
and the baselines of rknn_ray.baselines at each eps, on the dataset's split,
partition, public encoder and queries, with the same student. Writes into ``--out``
(atomically): compare.json (a list of rows ``{method, dataset, eps, delta, unit,
accuracy, label_accuracy, rounds, bytes_per_client, wall_s, ...}``), compare.csv,
compare.md, compare.png (accuracy vs eps), meta.json (total wall time, settings),
the baselines' ledgers (ledgers.json) and the rknn run folders (runs/). Privacy is
recorded in an isolated SQLite ledger, ``--out``/ledger.sqlite (every release of
every method as an event), so the comparison neither spends nor is blocked by the
user's budgets.

Every rknn row is a full jobs.distill run (actors, sealed reports, ledger events) with
``RKNN_OVERRIDES``: its student is trained in the driver by the same loop the baselines'
students use (``student.trainer=local``; no Ray Train start-up per row). Only with
``--diagnostics`` do the rknn runs also label from exact counts (``run.diagnostics``): that
NOT PRIVATE figure (``nonprivate_label_accuracy``, the same labels without the noise) goes to
``--out``/diagnostics/ (a README there says NOT PRIVATE), never into compare.json/csv/md,
which hold private results only. The rows run through
jobs.experiments.Runner: every row a Ray Tune trial (``--concurrent N`` at once, default
what the CPUs fit; ``--tensorboard``: event files under ``--out``/tune/; ``--mlflow URI``: one
MLflow run per row), a failed row kept
with its error, a row finished before with the same spec read back (a killed comparison run
again runs only the rest); every row holds the jobs.experiments.ReportRow fields; meta.json
samples the load average after every row.

Columns: ``eps``/``delta`` are what each method's accountant reports for the run
(``target_eps`` is what was asked); ``unit`` is what the guarantee protects:
``record`` (one private record, add/remove or replace-one: see ``neighbour``) or
``label`` (one query's label: DP-DFD; not comparable with record-level rows).
``rounds``: private interactions (rknn / NFDP rounds, DP-DFD stages, DP-SGD steps).
``bytes_per_client``: what one data holder uploads (rknn: its messages; NFDP:
predictions up and consensus down; PATE: one vote per query per teacher silo;
central methods whose server needs the records: the records themselves).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys
import uuid

from rknn_ray.baselines import BASELINE_NAMES

# torch, Ray, the baselines and the job layer (~5-10 s) load where they are used, after the
# arguments are parsed: ``rknn-ray compare --help`` answers in well under a second

RKNN_METHODS = ("rknn_central", "rknn_local", "rknn_shuffle")
BASELINE_METHODS = BASELINE_NAMES
METHODS = RKNN_METHODS + BASELINE_METHODS
CONFIG_PREFIX = {"digits": "digits", "fashion_mnist": "fmnist"}
CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")
COLUMNS = ("method", "dataset", "eps", "delta", "unit", "accuracy", "label_accuracy", "rounds",
           "bytes_per_client", "wall_s", "target_eps", "neighbour", "model", "error")
#: row fields computed from the exact private counts: NOT PRIVATE, only in diagnostics/
NOT_PRIVATE_FIELDS = ("nonprivate_label_accuracy",)
DIAGNOSTICS_COLUMNS = ("method", "target_eps", "label_accuracy", "nonprivate_label_accuracy")
DIAGNOSTICS_README = """NOT PRIVATE. `rknn-ray compare --diagnostics` wrote this folder: for every
rknn row, the labels the same queries and label pipeline give from the EXACT, noise-free private
counts (nonprivate_label_accuracy; label_accuracy minus it is what the noise costs). No privacy
guarantee covers these numbers. Do not share this folder with anyone who may not see the
private data; compare.json, compare.csv and compare.md beside it hold private results only.
"""
# Every rknn row runs jobs.distill with these on top of its config: the student is trained by
# the same loop in the driver process that every baseline's student uses (student.trainer=local:
# no Ray Train start-up per row). --diagnostics adds DIAGNOSTICS_OVERRIDES: the run's
# diagnostics give the labels the same queries get from EXACT counts (NOT private).
RKNN_OVERRIDES = ("student.trainer=local",)
DIAGNOSTICS_OVERRIDES = ("run.diagnostics=true",)
# per dataset: digits' ~1,000 clients fit one client shard, and their reports are opened by the
# Server itself (no opener processes to spawn per row); Fashion-MNIST's 60,000 keep the configs'
# 2 shards and the default opener pool
DATASET_OVERRIDES = {"digits": ("cluster.shards=1", "cluster.openers=0"), "fashion_mnist": ()}
# FedMD-NFDP's 10 parties are one batched torch model; one NfdpShard actor hosts them on digits
NFDP_SHARDS = {"digits": 1, "fashion_mnist": 2}
#: Ray CPUs of one NfdpShard actor (actors/nfdp_shard.py)
NFDP_SHARD_CPUS = 0.5


EXAMPLES = """\
examples:
  rknn-ray compare --dataset digits --eps 0.1 1 4 --out runs/compare-digits
  rknn-ray compare --dataset digits --eps 1 --methods rknn_central pate_gnmax --out runs/c1
  python -m jobs.compare --dataset digits --eps 1 --out runs/c1 --json
  rknn-ray compare --dataset digits --eps 1 --diagnostics --out runs/c1   # + NOT PRIVATE diagnostics/"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray compare", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", choices=sorted(CONFIG_PREFIX), default="digits")
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0, 4.0])
    ap.add_argument("--delta", type=float, default=1e-5, help="delta where a method needs one")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--student-epochs", type=int, default=None,
                    help="override every student's epochs (default: the dataset config's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--diagnostics", action="store_true",
                    help="NOT PRIVATE: also label every rknn row from the exact counts, into "
                         "OUT/diagnostics/ (never into compare.json/csv/md)")
    ap.add_argument("--baseline-s", type=int, default=None,
                    help="queries the labeling baselines label (default: the central config's s, "
                         "resolved as jobs.distill resolves it; Fashion-MNIST's auto s at eps 1 "
                         "is every public sample)")
    from jobs.experiments import add_runner_arguments  # deferred (module comment; 0.2 s, no Ray)
    add_runner_arguments(ap, "row")
    return ap.parse_args(argv)


def config_path(dataset: str, model: str) -> str:
    return os.path.join(CONFIG_DIR, f"{CONFIG_PREFIX[dataset]}_{model}.yaml")


def _overrides(seed: int, student_epochs: int | None) -> list[str]:
    out = ["run.progress=false", f"run.seed={seed}"]
    if student_epochs:
        out.append(f"student.epochs={student_epochs}")
    return out


# ----------------------------------------------------------------------------- reverse k-NN

def rknn_config(dataset: str, model: str, eps: float, delta: float, seed: int = 0,
                student_epochs: int | None = None, diagnostics: bool = False):
    """The validated config of one rknn row: the dataset's config with the comparison's
    overrides (isolated budget, driver-trained student; the NOT PRIVATE diagnostics only
    when asked)."""
    from rknn_ray.config import load_config  # deferred (module comment)
    from jobs.cells import ISOLATED_BUDGET
    over = _overrides(seed, student_epochs) + [f"privacy.eps={eps}", *ISOLATED_BUDGET,
                                                "student.num_workers=1", *RKNN_OVERRIDES,
                                                *(DIAGNOSTICS_OVERRIDES if diagnostics else ()),
                                                *DATASET_OVERRIDES[dataset]]
    if model == "shuffle":
        over += [f"privacy.delta={delta}"]
    return load_config(config_path(dataset, model), over)


def rknn_job(dataset: str, model: str, eps: float, delta: float, seed: int = 0,
             student_epochs: int | None = None, diagnostics: bool = False) -> Job:
    """One rknn row as a runner cell (a full jobs.distill run in runs/<method>-eps<eps>)."""
    from jobs.experiments import Job  # deferred (module comment)
    method = f"rknn_{model}"
    return Job(f"{method}-eps{eps:g}", {"method": method, "dataset": dataset, "target_eps": eps},
               cfg=rknn_config(dataset, model, eps, delta, seed, student_epochs, diagnostics))


def run_rknn(dataset: str, model: str, eps: float, delta: float, out_dir: str, ledger_path: str,
             seed: int = 0, student_epochs: int | None = None, diagnostics: bool = False) -> dict:
    """One jobs.distill run outside a runner; returns its comparison row (with the NOT
    PRIVATE ``nonprivate_label_accuracy`` set only when ``diagnostics``)."""
    from jobs.cells import run_distill  # deferred (module comment)
    from jobs.experiments import cell_row
    job = rknn_job(dataset, model, eps, delta, seed, student_epochs, diagnostics)
    report, wall = run_distill(job.cfg, out_dir, ledger_path)
    return cell_row(job, report, wall, out_dir)


# ----------------------------------------------------------------------------- baselines

def baseline_setup(dataset: str, seed: int = 0, student_epochs: int | None = None,
                   baseline_s: int | None = None):
    """The baselines' shared data (the central config's data, encoder and queries; ``s``
    overridden by ``baseline_s``), with FedMD-NFDP's parties on Ray actors."""
    from rknn_ray.config import load_config  # deferred (module comment)
    from rknn_ray.job.baselines import prepare_baseline
    # ray: imported only when a comparison prepares its baselines
    from actors.nfdp_shard import RayParties
    cfg = load_config(config_path(dataset, "central"),
                      _overrides(seed, student_epochs)
                      + ([f"queries.s={baseline_s}"] if baseline_s else []))
    return dataclasses.replace(prepare_baseline(cfg), party_hosts=RayParties,
                               party_shards=NFDP_SHARDS.get(dataset, 2))


def baseline_ledger(store, setup, method: str, target_eps: float, delta: float, job_id: str):
    """The ledger a baseline records into: a view over its own rows in the compare's
    persistent store (one write per release; a budget line per method: the units and
    neighbour relations of different methods do not compose), reserved for the target
    before the baseline touches private data."""
    from rknn_ray.accounting import PrivacyLedger  # deferred (module comment)
    from rknn_ray.accounting.budget_store import mark_started
    from rknn_ray.accounting.source_identity import private_data_digest
    sp = setup.splits
    identity, described = private_data_digest(setup.cfg, sp.private_x, sp.private_y,
                                              setup.data.client_ids)
    ident = f"{identity}/{method}"
    store.reserve(ident, f"{described} [{method}]", job_id, target_eps, delta, (1e9, 1.0))
    mark_started(store, ident, job_id)      # the baseline may release from here: settled as spent
    return PrivacyLedger(store=store, identity=ident, job_id=job_id)


# ----------------------------------------------------------------------------- outputs

def _load_note(loads) -> str:
    if not loads:
        return ""
    return (f"; 1-minute load average {min(loads):.1f}-{max(loads):.1f}, median "
            f"{sorted(loads)[len(loads) // 2]:.1f}, sampled after each row")


def private_rows(rows: list[dict]) -> list[dict]:
    """The rows without their NOT PRIVATE fields: what compare.json/csv/md hold."""
    return [{k: v for k, v in r.items() if k not in NOT_PRIVATE_FIELDS} for r in rows]


def footnotes(rows: list[dict], meta: dict) -> list[str]:
    """The table's footnotes, each only when a row it speaks of is in the table."""
    methods = {r["method"] for r in rows}
    notes = []
    if any(r.get("unit") == "label" for r in rows):
        notes.append("unit `label` (DP-DFD) protects one query's label, not a record: not "
                     "comparable with the record-level rows.")
    if methods & {"fedmd_nfdp", "fedmd_nfdp_wor"}:
        notes.append("FedMD-NFDP's delta is ~k/n, far above 1/n.")
    if any(r.get("error") for r in rows):
        notes.append("A row with an error did not run to the end: its numbers are n/a.")
    if meta.get("diagnostics"):
        notes.append("diagnostics/ beside this table holds NOT PRIVATE figures (labels from exact "
                     "counts); do not share it.")
    return notes


def to_markdown(rows: list[dict], meta: dict) -> str:
    from jobs.writers import rows_markdown  # deferred (module comment)
    rows = private_rows(rows)
    cols = ("method", "target_eps", "eps", "delta", "unit", "accuracy", "label_accuracy",
            "rounds", "bytes_per_client", "wall_s")
    lines = [f"# Comparison on {meta['dataset']} (delta = {meta['delta']:g} where needed)", "",
             f"Total wall time {meta['wall_s']:.0f} s on {meta['cpus']} CPU cores (shared"
             + _load_note(meta.get("load_average_1min")) + ").", "",
             *rows_markdown(rows, cols)]
    notes = footnotes(rows, meta)
    if notes:
        lines += ["", " ".join(notes)]
    lines.append("")
    return "\n".join(lines)


def to_csv(rows: list[dict]) -> str:
    from jobs.writers import rows_to_csv  # deferred (module comment)
    return rows_to_csv(rows, COLUMNS)


def plot(rows: list[dict], path: str, dataset: str) -> None:
    """Accuracy vs target eps, a line per method (label DP dashed, NFDP's large delta dotted)."""
    from jobs.writers import accuracy_vs_eps_png  # deferred (module comment)
    lines = []
    for m in dict.fromkeys(r["method"] for r in rows):
        pts = sorted((r["target_eps"], r["accuracy"]) for r in rows
                     if r["method"] == m and r["accuracy"] is not None
                     and not math.isnan(r["accuracy"]))
        if pts:
            unit = next(r["unit"] for r in rows if r["method"] == m)
            big = max((r["delta"] for r in rows if r["method"] == m and r["delta"] == r["delta"]),
                      default=0.0)
            note = f", delta up to {big:.2g}" if big > 1e-3 else ""   # NFDP: delta ~ k/n
            lines.append(([p[0] for p in pts], [p[1] for p in pts],
                          {"marker": "o", "ls": "--" if unit == "label" else (":" if note else "-"),
                           "label": f"{m} ({unit}{note})"}))
    accuracy_vs_eps_png(path, lines, f"{dataset}: accuracy vs eps")


def write_diagnostics(out: str, rows: list[dict], baselines: dict | None = None) -> None:
    """``out``/diagnostics/ (owner-only, a README that says NOT PRIVATE): each rknn row's
    label accuracy beside the same labels from exact counts, and the baselines' figures read
    from their exact private votes (``baselines``: method@eps -> BaselineRow.diagnostics)."""
    from jobs.writers import rows_to_csv  # deferred (module comment)
    from rknn_ray.runio import write_json, write_text
    folder = os.path.join(out, "diagnostics")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    diag = [{c: r.get(c) for c in DIAGNOSTICS_COLUMNS} for r in rows
            if r.get("nonprivate_label_accuracy") is not None]
    write_text(os.path.join(folder, "README.txt"), DIAGNOSTICS_README)
    write_json(os.path.join(folder, "nonprivate_labels.json"), {"private": False, "rows": diag})
    write_text(os.path.join(folder, "nonprivate_labels.csv"), rows_to_csv(diag, DIAGNOSTICS_COLUMNS))
    if baselines:
        write_json(os.path.join(folder, "baselines.json"), {"private": False, "runs": baselines})


def write_outputs(out: str, rows: list[dict], meta: dict, ledgers: dict,
                  baseline_diagnostics: dict | None = None) -> None:
    """compare.json/csv/md/png and meta.json, ledgers.json (private results only); with
    ``meta["diagnostics"]`` also the NOT PRIVATE diagnostics/ folder."""
    from jobs.writers import write_tables  # deferred (module comment)
    if meta.get("diagnostics"):
        write_diagnostics(out, rows, baseline_diagnostics)
    rows = private_rows(rows)
    write_tables(out, "compare", rows, table=rows, columns=COLUMNS,
                 markdown=to_markdown(rows, meta), meta=meta, extra={"ledgers.json": ledgers},
                 plot=lambda path: plot(rows, path, meta["dataset"]))


# ----------------------------------------------------------------------------- driver

def compare(dataset: str, eps_list, methods, out: str, delta: float = 1e-5, seed: int = 0,
            student_epochs: int | None = None, log=None,
            baseline_s: int | None = None, diagnostics: bool = False,
            concurrent: int | None = None, tensorboard: bool = False,
            mlflow: str | None = None) -> list[dict]:
    """Run everything (one experiment runner: every row a Ray Tune trial, ``concurrent`` at
    once, an isolated ledger in ``out``, a failed row kept with its error, a row finished
    before with the same spec read back); returns the rows (also written to ``out`` after
    every row), without their NOT PRIVATE fields (``diagnostics``: those go to
    ``out``/diagnostics/ only)."""
    from jobs.experiments import Job, Runner
    from jobs.writers import fmt
    say = log or (lambda s: print(s, file=sys.stderr, flush=True))
    meta = {"dataset": dataset, "eps": list(eps_list), "delta": delta, "methods": list(methods),
            "seed": seed, "student_epochs": student_epochs, "baseline_s": baseline_s,
            "wall_s": 0.0, "cpus": os.cpu_count(), "ledger": None, "complete": False,
            "diagnostics": bool(diagnostics),
            "load_average_1min": []}        # sampled after every row: how shared the machine was
    ledger_path = os.path.join(os.path.abspath(out), "ledger.sqlite")   # the runner's isolated one

    def baseline(method, eps):
        spec = {"dataset": dataset, "method": method, "eps": eps, "delta": delta, "seed": seed,
                "student_epochs": student_epochs, "baseline_s": baseline_s,
                "diagnostics": bool(diagnostics)}
        bundles = [{"CPU": 1.0}] + ([{"CPU": NFDP_SHARD_CPUS}] * NFDP_SHARDS.get(dataset, 2)
                                    if method.startswith("fedmd_nfdp") else [])
        return Job(f"{method}-eps{eps:g}", {"method": method, "dataset": dataset,
                                            "target_eps": eps},
                   call=functools.partial(run_baseline_cell, ledger_path, **spec),
                   spec=spec, bundles=bundles)

    def progress(i, n, job, row, skipped):
        say(f"{row['method']:20s} eps={row['target_eps']:<5g} acc={fmt(row['accuracy'])} "
            f"labels={fmt(row['label_accuracy'])} eps_spent={fmt(row['eps'])} "
            f"delta={fmt(row['delta'])} unit={row['unit']} {row['wall_s']:.1f}s"
            + (" (done before, skipped)" if skipped else "")
            + (f" ERROR {row['error']}" if row["error"] else ""))

    jobs = []
    for eps in eps_list:
        for method in methods:
            try:
                jobs.append(rknn_job(dataset, method.split("_", 1)[1], eps, delta, seed,
                                     student_epochs, diagnostics) if method in RKNN_METHODS
                            else baseline(method, eps))
            except Exception as exc:        # a config that does not load: its row says why
                jobs.append(Job(f"{method}-eps{eps:g}", {"method": method, "dataset": dataset,
                                                         "target_eps": eps},
                                call=_raise(exc)))

    def write(rows, m):
        ledgers, not_private = {}, {}
        for side in runner.side.values():          # what each baseline row kept beside it
            ledgers.update(side.get("ledgers") or {})
            not_private.update(side.get("diagnostics") or {})
            if side.get("baseline_queries") is not None:
                m["baseline_queries"] = side["baseline_queries"]
        write_outputs(out, rows, m, ledgers, not_private)

    runner = Runner(out, write=write, log=progress, meta=meta, sample_load=True,
                    concurrent=concurrent, tensorboard=tensorboard, mlflow=mlflow)
    meta["ledger"] = os.path.join(runner.out, "ledger.sqlite")
    return private_rows(runner.run(jobs))


#: the baselines' shared data per process (a trial prepares it once; Tune may reuse a process)
_SETUPS: dict = {}


def run_baseline_cell(ledger_path: str, dataset: str, method: str, eps: float, delta: float,
                      seed: int, student_epochs: int | None, baseline_s: int | None,
                      diagnostics: bool) -> dict:
    """One baseline row, where its trial runs: its fields, and under ``_side`` its ledger,
    its NOT PRIVATE diagnostics (kept only when ``diagnostics``) and the queries it labeled.
    Its reservation is settled as the main job settles its own
    (rknn_ray.job.rounds.private_rounds): returned when it ends, counted as spent when it
    fails after it may have released (the baseline is marked started before it reads a
    record), so no reservation is left open."""
    import torch  # deferred (module comment)
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.baselines.registry import run_baseline
    from rknn_ray.errors import first_line
    torch.set_num_threads(1)
    key = (dataset, seed, student_epochs, baseline_s)
    if key not in _SETUPS:
        _SETUPS[key] = baseline_setup(dataset, seed, student_epochs, baseline_s)
    setup = _SETUPS[key]
    store, job_id = BudgetStore(ledger_path), f"compare-{uuid.uuid4().hex[:12]}"
    ledger = baseline_ledger(store, setup, method, eps, delta, job_id)
    try:
        row = run_baseline(method, setup, eps, delta, ledger)
    except BaseException as exc:
        # a release may have happened before the failure: counted as spent, settled here
        store.spend_job(ledger.identity, job_id, f"compare: {method} failed "
                        f"({type(exc).__name__}: {first_line(exc)}); a release may have "
                        "happened: the reservation is counted as spent")
        raise
    store.close_job(ledger.identity, job_id, f"compare: {method} at target eps {eps:g}")
    side = {"ledgers": {f"{method}@{eps:g}": {"ledger": ledger.to_dict(), "details": row.details}},
            "baseline_queries": int(setup.queries.size)}
    if diagnostics and row.diagnostics:
        side["diagnostics"] = {f"{method}@{eps:g}": row.diagnostics}
    return {**row.table_fields(), "_side": side}


def _raise(exc: BaseException):
    def call():
        raise exc
    return call


def main(argv=None) -> int:
    from jobs.experiments import run_command  # deferred (module comment)
    from jobs.writers import print_result  # deferred (module comment)
    args = parse_args(argv)
    return run_command(args.out, lambda: compare(
        args.dataset, args.eps, args.methods, args.out, args.delta, args.seed,
        args.student_epochs, baseline_s=args.baseline_s, diagnostics=args.diagnostics,
        concurrent=args.concurrent, tensorboard=args.tensorboard, mlflow=args.mlflow),
        lambda rows: print_result(rows, args.json, os.path.join(args.out, "compare.md")))


if __name__ == "__main__":
    sys.exit(main())

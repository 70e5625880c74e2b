"""Fashion-MNIST through ``data.dataset: table`` against the built-in ``fashion_mnist`` path.

    python -m benchmarks.table_parity --out DIR [--models central local shuffle]
        [--limit N] [--holders H] [--set key=value ...] [--json]

Exports the IDX files as a user's tables (benchmarks.export_table: a pixel list column, string
labels and row ids, holders of 1-40 records with Dirichlet-skewed labels, the paper split at
``run.seed``), then runs real jobs (rknn_ray.job.run, one Ray for all):

* ``central``: jobs/configs/fmnist_central.yaml twice, on the built-in reader and on the
  tables (same encoder, student, seed, public and evaluation images); the student accuracies
  should agree within a point;
* ``local``, ``shuffle``: fmnist_local.yaml / fmnist_shuffle.yaml on the tables.

For each table run it checks that labels.parquet names every public row id exactly once and
measures the released labels against the export's answer key (public_truth.parquet). Both
sides of ``central`` read the same records: the report's budget source must be the same one.
``--limit N`` slices the first N train and test images (sliced IDX files feed the built-in
side), for a quick check; ``--set`` overrides every run's config (e.g. student.epochs=5).
Budgets live in DIR/ledger.sqlite. Prints a table; ``--json`` prints the rows as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from rknn_ray.data.idx import IDX_STEMS, read_idx_split, write_idx
from rknn_ray.data.readers import FASHION_CLASSES, FASHION_MNIST_ROOT
from rknn_ray.runio import prepare_run_dir
from benchmarks.export_table import export
from rknn_ray.errors import RknnError, first_line

CONFIGS = {"central": "jobs/configs/fmnist_central.yaml", "local": "jobs/configs/fmnist_local.yaml",
           "shuffle": "jobs/configs/fmnist_shuffle.yaml"}


def sliced_idx(folder: str, limit: int, data_root: str | None = None) -> str:
    """The first ``limit`` train and test images and labels as IDX files in ``folder``."""
    os.makedirs(folder, exist_ok=True)
    for split, (images, labels) in IDX_STEMS.items():
        x, y = read_idx_split([data_root or FASHION_MNIST_ROOT], split)
        write_idx(os.path.join(folder, images), x[:limit])
        write_idx(os.path.join(folder, labels), y[:limit])
    return folder


def table_data(folder: str, max_records: int, holders: int) -> dict:
    """The ``data`` section that reads the export in ``folder`` (``holders``: checked on the data)."""
    return {"dataset": "table", "classes": list(FASHION_CLASSES), "shape": [1, 28, 28],
            "max_records_per_client": max_records,
            "private": {"path": os.path.join(folder, "private.parquet"), "label": "label",
                        "client": "holder", "holders": int(holders)},
            "public": {"path": os.path.join(folder, "public.parquet"), "id": "row_id"},
            "evaluation": {"path": os.path.join(folder, "evaluation.parquet"), "label": "label"}}


def config(path: str, overrides: list[str], data: dict | None):
    from rknn_ray.config import Config, load_config  # defers yaml
    cfg = load_config(path, [*overrides, "run.progress=false", "privacy.budget_eps=100"])
    if data is None:
        return cfg
    plain = cfg.to_dict()
    plain["data"] = data
    return Config.from_dict(plain)


def check_labels(run_dir: str, data_dir: str) -> dict:
    """labels.parquet against the export: every public id once, accuracy by the answer key."""
    import pyarrow.parquet as pq  # defers pyarrow
    labels = pq.read_table(os.path.join(run_dir, "labels.parquet"))
    ids = labels.column(labels.schema.metadata[b"id_column"].decode()).to_pylist()
    public = pq.read_table(os.path.join(data_dir, "public.parquet"), columns=["row_id"])
    truth = pq.read_table(os.path.join(data_dir, "public_truth.parquet"))
    answer = dict(zip(truth.column("row_id").to_pylist(), truth.column("label").to_pylist()))
    every_once = sorted(ids) == sorted(public.column("row_id").to_pylist()) and \
        len(set(ids)) == len(ids)
    right = sum(answer[i] == c for i, c in zip(ids, labels.column("class").to_pylist()))
    return {"ids_every_public_row_once": every_once, "labels_by_answer_key": right / len(ids)}


def one_run(name: str, cfg, out: str, ledger: str) -> dict:
    from rknn_ray.job import run  # defers cryptography, dp_accounting, faiss, ray, tqdm
    res = run(cfg, prepare_run_dir(os.path.join(out, name)), ledger_path=ledger)
    rep = res.report
    return {"run": name, "model": rep["privacy"]["model"], "eps": rep["privacy"]["eps"],
            "student": rep["accuracy"]["student"], "labels": rep["accuracy"]["labels"],
            "clients": rep["counts"]["clients"], "job": rep["job_id"],
            "seconds": round(sum(v for k, v in rep["timings_s"].items()
                                 if not k.startswith("round_")), 1), "dir": res.out_dir}


def _same_source(ledger: str, *jobs: str) -> bool:
    """Whether the ledger charged these jobs to one source (report.json does not name it)."""
    from rknn_ray.accounting.budget_store import BudgetStore
    holding = [src["identity"] for src in BudgetStore(ledger).datasets()
               if {r.get("job_id") for r in src["releases"]} & set(jobs)]
    return len(holding) == 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", nargs="+", choices=sorted(CONFIGS), default=sorted(CONFIGS))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--holders", type=int, default=None, help="default: 3000 (records/20 "
                    "with --limit)")
    ap.add_argument("--max-records", type=int, default=40)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    # defers cryptography, dp_accounting, faiss, ray, tqdm
    from rknn_ray.job.ray_env import ensure_ray
    out = os.path.abspath(args.out)
    data_dir, ledger = os.path.join(out, "data"), os.path.join(out, "ledger.sqlite")
    holders = args.holders or (max(1, args.limit // 20) if args.limit else 3000)
    rows = []
    try:
        seed = config(CONFIGS["central"], args.overrides, None).run.seed
        export(data_dir, holders, args.max_records, seed=seed, limit=args.limit)
        builtin = ["data.dataset=fashion_mnist"]
        if args.limit:
            builtin.append(f"data.data_root={sliced_idx(os.path.join(out, 'idx'), args.limit)}")
        started = ensure_ray()
        try:
            if "central" in args.models:
                rows.append(one_run("builtin_central", config(
                    CONFIGS["central"], [*args.overrides, *builtin], None), out, ledger))
            for model in sorted(args.models):
                cfg = config(CONFIGS[model], args.overrides,
                             table_data(data_dir, args.max_records, holders))
                row = one_run(f"table_{model}", cfg, out, ledger)
                rows.append({**row, **check_labels(row["dir"], data_dir)})
        finally:
            if started:
                import ray  # defers ray, tqdm
                ray.shutdown()
    except (RknnError, ValueError, OSError) as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2
    by = {r["run"]: r for r in rows}
    if "builtin_central" in by and "table_central" in by:
        a, b = by["builtin_central"], by["table_central"]
        summary = {"central_student_gap": abs(a["student"] - b["student"]),
                   "same_budget_source": _same_source(ledger, a["job"], b["job"])}
    else:
        summary = {}
    if args.json:
        print(json.dumps({"rows": rows, **summary, "limit": args.limit, "holders": holders},
                         indent=2))
        return 0
    for r in rows:
        extra = (f", labels by answer key {r['labels_by_answer_key']:.4f}, every id once "
                 f"{r['ids_every_public_row_once']}") if "labels_by_answer_key" in r else \
            f", labels {r['labels']:.4f}"
        print(f"{r['run']:16s} {r['model']}/eps={r['eps']:.3g}: student {r['student']:.4f}"
              f"{extra}; {r['clients']} clients; {r['seconds']} s")
    if summary:
        print(f"central student gap |built-in - table| = {summary['central_student_gap']:.4f}; "
              f"same budget source: {summary['same_budget_source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

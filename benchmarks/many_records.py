"""Holders with many records (issue 47): every trust model on one holder export, several seeds.

    python -m benchmarks.many_records --out DIR [--seeds 0 1 2] [--variants ...]
        [--holders 3000] [--max-records 40] [--eps 1] [--set key=value ...] [--json]

Exports Fashion-MNIST as a user's tables (benchmarks.export_table: holders of 1-40 records
with Dirichlet-skewed labels, string labels and ids) once, then runs each variant through
``data.dataset: table`` at the same eps on one Ray (rknn_ray.job.run):

* ``central``: fmnist_central.yaml's pipeline (discrete Laplace);
* ``multi``: fmnist_shuffle.yaml with the multi-message mechanism (delta 1e-6);
* ``sample`` / ``each``: fmnist_shuffle.yaml (single-message Collision, tight bound), one
  sampled record per holder, or every kept record reporting (privacy.multi_record);
* ``local`` / ``local_each``: fmnist_local.yaml (Collision) at the same eps.

Prints student and label accuracy per variant and seed with their medians; writes JSON to
benchmarks/results/many-records-<date>-<time>.json. Budgets live in DIR/ledger.sqlite (an
experiment's, large).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from benchmarks.export_table import export
from benchmarks.table_parity import check_labels, config, one_run, table_data

VARIANTS = {
    "central": ("jobs/configs/fmnist_central.yaml", []),
    "multi": ("jobs/configs/fmnist_shuffle.yaml", ["privacy.mechanism=multi"]),
    "sample": ("jobs/configs/fmnist_shuffle.yaml", ["privacy.multi_record=sample"]),
    "each": ("jobs/configs/fmnist_shuffle.yaml", ["privacy.multi_record=each"]),
    "local": ("jobs/configs/fmnist_local.yaml", ["privacy.multi_record=sample"]),
    "local_each": ("jobs/configs/fmnist_local.yaml", ["privacy.multi_record=each"]),
}
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--holders", type=int, default=3000)
    ap.add_argument("--max-records", type=int, default=40)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from rknn_ray.job.ray_env import ensure_ray  # defers ray
    out = os.path.abspath(args.out)
    data_dir, ledger = os.path.join(out, "data"), os.path.join(out, "ledger.sqlite")
    if not os.path.exists(os.path.join(data_dir, "private.parquet")):
        export(data_dir, args.holders, args.max_records, seed=0)
    from rknn_ray.accounting.budget_store import BudgetStore  # defers sqlite
    BudgetStore(ledger, purpose="experiment")       # each run an independent hypothetical release
    started = ensure_ray()
    rows = []
    try:
        for seed in args.seeds:
            for name in args.variants:
                path, extra = VARIANTS[name]
                sets = [*extra, f"privacy.eps={args.eps}", f"run.seed={seed}", *args.overrides]
                if name == "central" or name.startswith("local"):
                    sets.append("privacy.delta=0")
                cfg = config(path, sets, table_data(data_dir, args.max_records, args.holders))
                t0 = time.time()
                row = one_run(f"{name}-seed{seed}", cfg, out, ledger)
                row.update(check_labels(row["dir"], data_dir), variant=name, seed=seed,
                           wall_s=round(time.time() - t0, 1))
                rows.append(row)
                print(f"{name:11s} seed {seed}: student {row['student']:.4f}  labels "
                      f"{row['labels_by_answer_key']:.4f}  clients {row['clients']}  "
                      f"{row['wall_s']} s", flush=True)
    finally:
        if started:
            import ray  # defers ray
            ray.shutdown()
    summary = {}
    for name in args.variants:
        mine = [r for r in rows if r["variant"] == name]
        summary[name] = {"student_median": statistics.median(r["student"] for r in mine),
                         "labels_median": statistics.median(r["labels_by_answer_key"]
                                                            for r in mine),
                         "seeds": len(mine)}
    print(f"\n{'variant':11s} {'student (median)':>17s} {'labels (median)':>16s} seeds")
    for name, s in summary.items():
        print(f"{name:11s} {s['student_median']:17.4f} {s['labels_median']:16.4f} {s['seeds']}")
    result = {"command": "python -m benchmarks.many_records " + " ".join(argv or sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "eps": args.eps, "holders": args.holders,
              "max_records": args.max_records, "rows": rows, "summary": summary}
    os.makedirs(RESULTS, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d-%H%M")     # one file per run: runs of a day do not overwrite
    with open(os.path.join(RESULTS, f"many-records-{stamp}.json"), "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    if args.json:
        print(json.dumps(result, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

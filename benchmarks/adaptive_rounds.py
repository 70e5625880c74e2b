"""Adaptive rounds: T = 1, 2, 3 private rounds at equal total eps (paper 000, Algorithm 1).

    python -m benchmarks.adaptive_rounds [--config jobs/configs/digits_central.yaml]
        [--eps 1 0.3] [--rounds 1 2 3] [--seeds 0 1 2] [--selections uncertain farthest]
        [--set key=value ...] [--out bench_out/adaptive_rounds] [--json]

Every cell is a full ``jobs.distill`` run through the multi-round driver (client
shards, server, sealed reports, central discrete Laplace, Ray Train student) on one
Ray instance: round t spends eps/T (``rounds.budget_split: even``, one ledger event
per round, sequential composition to the total eps) on s new queries; rounds t >= 1
pick them by ``rounds.query_selection`` (``uncertain``: where an interim student is
least certain; ``farthest``: the non-adaptive control). Labels use every round's
released counts. Privacy goes to an isolated ledger (``--out``/ledger.sqlite).

Prints a table (mean and standard deviation over seeds of label accuracy Acc_pl on
the public set and student accuracy on the evaluation set), writes ``results.json``
(one row per run plus the aggregated table), ``adaptive_rounds.md`` and
``adaptive_rounds.png``. The cells run through jobs.experiments.Runner: run folders
stay under ``--out``/runs; a cell finished before with the same spec (its cell.json)
is read back, not re-run (an interrupted benchmark resumes); a failed cell is a row
with its error. Rows follow jobs.experiments.ReportRow (``eps`` is what was spent,
``target_eps`` what was asked, ``accuracy`` the student's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from jobs.experiments import Job, Runner
from jobs.writers import markdown_table, write_tables
from rknn_ray.config import load_config
from rknn_ray.labeling.queries import union_of_rounds
from rknn_ray.rng import seeded_generator

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "..", "jobs", "configs",
                              "digits_central.yaml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG)
    ap.add_argument("--eps", type=float, nargs="+", default=[1.0, 0.3])
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--selections", nargs="+", default=["uncertain", "farthest"],
                    help="query selection for rounds t >= 1 (T = 1 runs once per eps and seed)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="extra config override for every run (repeatable)")
    ap.add_argument("--out", default="bench_out/adaptive_rounds")
    ap.add_argument("--json", action="store_true", help="print the aggregated table as JSON")
    ap.add_argument("--labels-only", action="store_true",
                    help="in-process simulation of the label path (exact counts + the "
                         "mechanism's noise, seeded; no actors, no student): many seeds fast")
    return ap.parse_args(argv)


def cells(args) -> list[dict]:
    """Seeds outermost, so a partial benchmark already compares every T on the first seeds."""
    out = []
    for seed in args.seeds:
        for eps in args.eps:
            for T in args.rounds:
                for sel in (["kmeans"] if T == 1 else args.selections):
                    out.append({"seed": seed, "target_eps": eps, "T": T, "selection": sel})
    return out


def cell_name(cell: dict) -> str:
    return f"eps{cell['target_eps']:g}-T{cell['T']}-{cell['selection']}-seed{cell['seed']}"


def selection_fields(report: dict) -> dict:
    """What rounds t >= 1 chose (report.json ``selection``): the benchmark's own columns."""
    later = [s for s in report.get("selection", []) if s.get("round", 0) > 0]
    return {"uncertainty_chosen": [s.get("uncertainty_chosen") for s in later],
            "uncertainty_all": [s.get("uncertainty_all") for s in later],
            "interim_agreement_released": [s.get("interim_agreement_released") for s in later]}


def cell_job(cell: dict, args):
    """A full jobs.distill run of the cell, as an experiment-runner job (runs/<name>)."""
    over = ["run.progress=false", f"run.seed={cell['seed']}", f"privacy.eps={cell['target_eps']}",
            "privacy.budget_eps=100", f"rounds.count={cell['T']}",
            *(["rounds.query_selection=" + cell["selection"]] if cell["T"] > 1 else []),
            *args.overrides]
    return Job(cell_name(cell), dict(cell), cfg=load_config(args.config, over),
               extra=selection_fields)


_PREPARED: dict = {}


def label_only_cell(cell: dict, args) -> dict:
    """The driver's label path in one process, for many seeds in minutes: the same data,
    encoder, queries, selection and ``finish_labels``, with each round's counts computed
    exactly and noised by the configured central mechanism at eps/T (the statistics of
    the real release, without actors and sealed reports), no student. The noise comes
    from a generator seeded by (seed, round), so the ``uncertain`` and ``farthest`` runs of
    one (seed, T) share their round-1 release exactly (a paired comparison of the
    selection): a simulation, NOT private."""
    # defers ray, faiss and dp_accounting (the job layer): full-job cells never load them here
    from rknn_ray.accounting import PrivacyLedger, guarantee_of
    from rknn_ray.job.rounds import planned_rounds
    from rknn_ray.job.session import RoundResult
    from rknn_ray.job.stages import finish_labels, prepare_stages
    from rknn_ray.labeling.stage import exact_counts, round_query_counts
    over = [f"run.seed={cell['seed']}", f"privacy.eps={cell['target_eps']}",
            f"rounds.count={cell['T']}",
            *(["rounds.query_selection=" + cell["selection"]] if cell["T"] > 1 else []),
            *args.overrides]
    cfg = load_config(args.config, over)
    sizes = round_query_counts(cfg)
    key = (cell["seed"], sizes[0], tuple(args.overrides))
    if key not in _PREPARED:           # data, encoder and round-1 queries: seed and round-1 s only
        st = prepare_stages(cfg, s=sizes[0])
        _PREPARED[key] = (st.data, st.encoder, st.public_emb, st.queries)
    data, encoder, public_emb, first = _PREPARED[key]
    p = cfg.privacy
    rounds, query_sets, uncertain = [], [], []
    ledger = PrivacyLedger()        # the job's default (basic) accountant composes the rounds
    for plan in planned_rounds(cfg, data, public_emb, first, rounds, query_sets):  # the job's loop
        if "uncertainty_chosen" in plan.selection:
            uncertain.append(plan.selection)
        mech = plan.mechanism
        exact = exact_counts(encoder, data, [plan.queries], cfg.rknn.k, plan.connection)
        noisy = mech.add_noise(exact, seeded_generator(cell["seed"] * 1000 + plan.t)).astype(float)
        g = guarantee_of(mech, data.num_clients)
        ledger.record(g, round_id=plan.t)
        rounds.append(RoundResult(noisy, g, g.event, {}, 0, 0, 0, {}))
        query_sets.append(plan.queries)
    all_qs = union_of_rounds(public_emb, query_sets)
    lab, _ = finish_labels(cfg, data, np.concatenate([r.counts for r in rounds]), all_qs,
                           public_emb, rounds, None)
    eps, delta = ledger.spent()
    return {**cell, "model": p.model, "mechanism": p.mechanism, "dataset": cfg.data.dataset,
            "label_accuracy": lab.label_accuracy, "accuracy": float("nan"),
            "query_label_accuracy": lab.query_accuracy, "eps": float(eps),
            "delta": float(delta), "rounds": len(rounds),
            "round_eps": [e.guarantee.eps for e in ledger.entries],
            "ledger_events": len(ledger.entries), "queries": all_qs.size,
            "k_used": cfg.rknn.k, "private": False,       # a seeded simulation
            "uncertainty_chosen": [u["uncertainty_chosen"] for u in uncertain],
            "uncertainty_all": [u["uncertainty_all"] for u in uncertain],
            "interim_agreement_released": [u["interim_agreement_released"] for u in uncertain]}


def aggregate(rows: list[dict]) -> list[dict]:
    """Mean and sd over seeds per (eps, T, selection); ``eps`` here is the target total."""
    table = []
    keys = sorted({(r["target_eps"], r["T"], r["selection"]) for r in rows},
                  key=lambda k: (-k[0], k[1], k[2]))
    for eps, T, sel in keys:
        sub = [r for r in rows if (r["target_eps"], r["T"], r["selection"]) == (eps, T, sel)]
        lab = np.array([r["label_accuracy"] for r in sub], dtype=float)
        stu = np.array([r["accuracy"] for r in sub], dtype=float)
        table.append({"eps": eps, "T": T, "selection": sel, "seeds": len(sub),
                      "queries": sub[0]["queries"], "eps_spent": max(r["eps"] for r in sub),
                      "label_mean": float(lab.mean()), "label_std": float(lab.std()),
                      "student_mean": float(stu.mean()), "student_std": float(stu.std())})
    return table


def to_markdown(table: list[dict]) -> str:
    lines = markdown_table(
        ("eps (total)", "T", "rounds t>=1 select", "queries", "eps spent",
         "label acc (mean ± sd)", "student acc (mean ± sd)", "seeds"),
        [[f"{r['eps']:g}", r["T"], r["selection"], r["queries"], f"{r['eps_spent']:.4g}",
          f"{r['label_mean']:.4f} ± {r['label_std']:.4f}",
          f"{r['student_mean']:.4f} ± {r['student_std']:.4f}", r["seeds"]] for r in table])
    return "\n".join(lines) + "\n"


def plot(table: list[dict], path: str) -> None:
    from rknn_ray.plots import plt, save_png  # defers matplotlib
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, what in zip(axes, ("label", "student")):
        for eps in sorted({r["eps"] for r in table}, reverse=True):
            for sel in ("uncertain", "farthest"):
                sub = sorted([r for r in table if r["eps"] == eps and
                              (r["selection"] == sel or r["T"] == 1)], key=lambda r: r["T"])
                if len(sub) < 2:
                    continue
                ax.errorbar([r["T"] for r in sub], [r[f"{what}_mean"] for r in sub],
                            yerr=[r[f"{what}_std"] for r in sub], marker="o", capsize=3,
                            linestyle="-" if sel == "uncertain" else "--",
                            label=f"eps={eps:g}, {sel}")
        ax.set_xlabel("rounds T (equal total eps)")
        ax.set_ylabel(f"{what} accuracy")
        ax.set_xticks(sorted({r["T"] for r in table}))
        if ax.get_legend_handles_labels()[0]:        # a single T has no line to name
            ax.legend(fontsize=7)
    fig.suptitle("Adaptive rounds at equal total eps (mean ± sd over seeds)")
    fig.tight_layout()
    save_png(fig, path)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    todo = cells(args)
    jobs = [Job(cell_name(c), dict(c), call=(lambda c=c: label_only_cell(c, args)))
            for c in todo] if args.labels_only else \
        [cell_job(c, args) for c in todo]
    meta = {"config": os.path.relpath(args.config), "overrides": args.overrides,
            "cpus": os.cpu_count()}

    def write(rows: list, m: dict) -> None:
        table = aggregate(rows)
        done = m.get("complete")             # the table and figure once every cell is in
        write_tables(args.out, "adaptive_rounds",
                     {"meta": {**m, "complete": len(rows) == len(todo)}, "table": table,
                      "runs": rows}, json_name="results.json",
                     markdown=to_markdown(table) if done else None,
                     plot=(lambda path: plot(table, path)) if done else None)

    def progress(i, n, job, row, skipped):
        print(f"eps={row['target_eps']:g} T={row['T']} {row['selection']:9s} "
              f"seed={row['seed']}: labels {row['label_accuracy']:.4f}, student "
              f"{row['accuracy']:.4f}, eps spent {row['eps']:.4g} in {row['ledger_events']} "
              "event(s)" + (" (done before, skipped)" if skipped else "")
              + (f" ERROR {row['error']}" if row.get("error") else ""),
              file=sys.stderr, flush=True)

    rows = Runner(args.out, write=write, log=progress, meta=meta,
                  ray=not args.labels_only).run(jobs)
    table = aggregate(rows)
    print(to_markdown(table))
    if args.json:
        print(json.dumps(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record-level private knowledge distillation, end to end on Ray.

    python -m jobs.distill --config jobs/configs/digits_central.yaml \
        [--set privacy.eps=0.5 ...] [--out runs/my-run] [--overwrite]

Works locally (starts a loopback Ray instance) and under ``ray job submit`` (joins
the cluster through RAY_ADDRESS). Writes a run folder: config.yaml, report.json,
ledger.json, labels.parquet, student.pt and summary.png.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import pyarrow as pa
import yaml

from rknn_ray import __version__
from rknn_ray.config import load_config
from rknn_ray.errors import RknnError
from rknn_ray.runio import prepare_run_dir, write_json, write_parquet, write_text

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "digits_central.yaml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (jobs/configs/*.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set privacy.eps=0.5 (repeatable)")
    ap.add_argument("--out", default=None, help="run folder (default runs/<name>-<time>)")
    ap.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    ap.add_argument("--key-file", default=None,
                    help="server X25519 key file (default: a fresh key pair per job)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap.parse_args(argv)


def run(cfg: dict, out_dir: str, key_file: str | None = None, progress=None) -> dict:
    """Run the job for a validated ``cfg`` into the prepared ``out_dir``; returns the report."""
    import ray

    from jobs.progress import Progress
    from jobs.protocol import new_job_id, run_round
    from jobs.ray_env import ensure_ray
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.mechanisms.central import central_error_bound
    from rknn_ray.pipeline import derive_labels, exact_answers, fit_queries, prepare_data
    from rknn_ray.plots import run_summary_png
    from rknn_ray.student import StudentConfig, train_student

    progress = progress or Progress(cfg["run"]["progress"])
    job_id = new_job_id()
    with progress.stage("data", f"loading {cfg['data']['dataset']} and partitioning"):
        data = prepare_data(cfg)         # fails fast on missing files / bad data, writes nothing
    write_text(os.path.join(out_dir, "config.yaml"), yaml.safe_dump(cfg, sort_keys=False))
    sp = data.splits
    progress.say(f"private {len(sp.private_y)} records in {data.num_clients} clients, "
                 f"public {len(sp.public_y)}, evaluation {len(sp.eval_y)}")
    with progress.stage("queries", f"encoder + k-means: s = {cfg['queries']['s']} queries"):
        encoder, _, qs = fit_queries(cfg, data)
    p = cfg["privacy"]
    ledger = PrivacyLedger(budget_eps=p["budget_eps"], budget_delta=p["budget_delta"],
                           accountant=p["accountant"])
    started = ensure_ray()
    try:
        rnd = run_round(cfg, data, encoder, qs, 0, job_id, ledger, progress, key_file)
        with progress.stage("labels", "labels: private and non-private reference"):
            lab = derive_labels(rnd.counts, qs, sp.public_y, cfg["labels"]["type"])
            exact = exact_answers(encoder, data, qs, cfg["rknn"]["k"]).counts()
            ref = derive_labels(exact.astype(float), qs, sp.public_y, cfg["labels"]["type"])
        progress.say(f"label accuracy {lab.label_accuracy:.4f} "
                     f"(non-private {ref.label_accuracy:.4f})")
        st = cfg["student"]
        scfg = StudentConfig(epochs=st["epochs"], batch_size=st["batch_size"], lr=st["lr"],
                             weight_decay=st["weight_decay"], num_workers=st["num_workers"],
                             use_gpu=st["use_gpu"], label_type=cfg["labels"]["type"],
                             seed=cfg["run"]["seed"], arch=st["arch"], augment=st["augment"])
        if cfg["labels"]["train_on"] == "queries":
            train_x, targets = sp.public_x[qs.public_index], \
                (lab.query_soft if scfg.label_type == "soft" else lab.query_labels)
            weight = lab.query_weight if scfg.label_type == "soft" else None
        else:
            train_x, targets, weight = sp.public_x, lab.public_targets, lab.public_weight
        with progress.stage("student", f"student: Ray Train, {st['num_workers']} workers, "
                            f"{st['epochs']} epochs on {len(train_x)} labelled samples"):
            student = train_student(train_x, targets, sp.eval_x, sp.eval_y, data.image_shape,
                                    data.num_classes, scfg, storage_path=out_dir,
                                    checkpoint_dir=out_dir, sample_weight=weight,
                                    progress=lambda row: progress.say(
                                        "  epoch " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float)
                                                               else f"{k} {v}" for k, v in row.items())))
        progress.say(f"student test accuracy {student.test_accuracy:.4f}")
    finally:
        if started:
            ray.shutdown()

    truth_q = sp.public_y[qs.public_index]
    rows = np.arange(exact.shape[0])
    others = exact.copy()
    others[rows, truth_q] = np.iinfo(np.int64).min
    gaps = exact[rows, truth_q] - others.max(axis=1)
    g = rnd.guarantee
    report = {
        "accuracy": {"labels": lab.label_accuracy, "student": student.test_accuracy,
                     "nonprivate_labels": ref.label_accuracy,
                     "query_labels": lab.query_accuracy,
                     "nonprivate_query_labels": ref.query_accuracy},
        "privacy": {"model": g.model, "mechanism": g.mechanism, "eps": ledger.spent()[0],
                    "delta": ledger.spent()[1], "unit": g.unit, "neighbour": g.neighbour,
                    "rounds": [g.to_dict()], "ledger": ledger.to_dict(),
                    "details": rnd.mechanism},
        "counts": {"clients": data.num_clients, "records": int(len(sp.private_y)),
                   "queries": qs.size, "public": int(len(sp.public_y)),
                   "evaluation": int(len(sp.eval_y)), "messages": rnd.messages,
                   "received": rnd.received, "rejected": rnd.rejected,
                   "max_records_per_client": data.max_records_per_client},
        "split": sp.describe(),
        "student": {"test_accuracy": student.test_accuracy, "epochs": student.epochs,
                    "num_workers": student.num_workers, "device": student.device,
                    "checkpoint": student.checkpoint_path, "train_samples": int(len(train_x))},
        "timings_s": {**progress.timings, **rnd.timings},
        "rng": cfg["run"]["rng"], "version": __version__, "job_id": job_id,
        "config": cfg,
    }
    if rnd.shuffler is not None:
        report["shuffler"] = rnd.shuffler
    labels_table = pa.table({
        "public_index": np.arange(len(sp.public_y)), "query": qs.assignment,
        "label": lab.public_hard, "true_label": sp.public_y,
        "nonprivate_label": ref.public_hard, "weight": lab.public_weight,
        "soft": pa.array(list(lab.query_soft[qs.assignment]), type=pa.list_(pa.float32())),
    })
    write_parquet(os.path.join(out_dir, "labels.parquet"), labels_table)
    write_json(os.path.join(out_dir, "ledger.json"), ledger.to_dict())
    bound = central_error_bound(rnd.mechanism["scale"], data.num_classes, 0.05, "discrete") \
        if g.model == "central" else None
    run_summary_png(os.path.join(out_dir, "summary.png"), report, student.history, gaps,
                    lab.query_labels == truth_q, bound)
    write_json(os.path.join(out_dir, "report.json"), report)   # last: marks a complete run
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        out = args.out or os.path.join("runs", f"{cfg['run']['name']}-{time.strftime('%Y%m%d-%H%M%S')}")
        out = prepare_run_dir(out, overwrite=args.overwrite)
        if args.quiet:
            cfg["run"]["progress"] = False
        report = run(cfg, out, key_file=args.key_file)
    except RknnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    acc, p = report["accuracy"], report["privacy"]
    print(f"run folder: {out}")
    print(f"{p['model']}/{p['mechanism']} eps={p['eps']:.4g} delta={p['delta']:.3g} "
          f"({p['unit']}-level, {p['neighbour']}): label accuracy {acc['labels']:.4f} "
          f"(non-private {acc['nonprivate_labels']:.4f}), student accuracy {acc['student']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fashion-MNIST, paper-style split, central DP: Acc_pl and Acc_pc over s and eps.

    python -m benchmarks.fmnist_central [--s 40 200 500] [--eps 0.1 1] [--k 1]
        [--epochs 10] [--no-student] [--json] [--out bench_out/fmnist_central]

Same library stages as jobs.distill (encoder, k-means queries, reverse k-NN,
central discrete-Laplace mechanism, labels, Ray Train student); the encoder,
queries and exact counts are computed once per s and reused across eps, so the
table isolates the effect of the noise. "none" is the non-private reference on
the same pipeline. Prints a table, writes results.json and a PNG.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rknn_ray.rng import secure_generator
from rknn_ray.runio import write_json



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--s", type=int, nargs="+", default=[40, 200, 500])
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0])
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-student", action="store_true", help="labels only (fast)")
    ap.add_argument("--json", action="store_true", help="print the JSON results to stdout")
    ap.add_argument("--out", default="bench_out/fmnist_central")
    args = ap.parse_args(argv)

    # defers cryptography, dp_accounting, faiss, ray, tqdm
    from rknn_ray.job.ray_env import ensure_ray
    from rknn_ray.config import load_config
    from rknn_ray.labeling.stage import derive_labels, exact_counts  # defers faiss
    from rknn_ray.mechanisms.stage import mechanism_for  # defers faiss
    from rknn_ray.job.stages import prepare_stages  # defers ray, faiss (the job layer)
    from rknn_ray.plots import plt, save_png
    from rknn_ray.student import StudentConfig, train_student  # defers torch

    os.makedirs(args.out, exist_ok=True)
    rows = []
    if not args.no_student:
        ensure_ray()
    for s in args.s:
        cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "jobs", "configs",
                                       "fmnist_central.yaml"),
                          [f"queries.s={s}", f"rknn.k={args.k}", f"represent.dim={args.dim}",
                           f"run.seed={args.seed}"])
        t0 = time.perf_counter()
        st = prepare_stages(cfg)
        data, qs = st.data, st.queries
        exact = exact_counts(st.encoder, data, [qs], args.k)
        prep = time.perf_counter() - t0
        sp = data.splits
        for eps in [None] + list(args.eps):
            if eps is None:
                counts = exact.astype(float)
            else:
                mech = mechanism_for(cfg, data, eps=eps, model="central", name="laplace")
                counts = mech.add_noise(exact, secure_generator()).astype(float)
            lab = derive_labels(counts, qs, sp.public_y, "hard")
            row = {"s": s, "k": args.k, "eps": eps, "acc_pl": lab.label_accuracy,
                   "acc_query": lab.query_accuracy, "acc_pc": None, "prep_s": prep}
            if not args.no_student:
                t1 = time.perf_counter()
                res = train_student(sp.public_x, lab.public_targets, sp.eval_x, sp.eval_y,
                                    data.image_shape, data.num_classes,
                                    StudentConfig(epochs=args.epochs, num_workers=args.workers,
                                                  seed=args.seed),
                                    storage_path=os.path.abspath(os.path.join(args.out, "ray")))
                row["acc_pc"], row["student_s"] = res.test_accuracy, time.perf_counter() - t1
            rows.append(row)
            print(f"s={s:4d} eps={'none' if eps is None else eps:>5}  Acc_pl={row['acc_pl']:.4f}"
                  f"  Acc_pc={'-' if row['acc_pc'] is None else format(row['acc_pc'], '.4f')}",
                  file=sys.stderr, flush=True)

    print("\n| s | k | eps | Acc_pl | Acc_pc |\n|---|---|---|---|---|")
    for r in rows:
        pc = "-" if r["acc_pc"] is None else f"{r['acc_pc']:.4f}"
        print(f"| {r['s']} | {r['k']} | {'none' if r['eps'] is None else r['eps']} | "
              f"{r['acc_pl']:.4f} | {pc} |")
    write_json(os.path.join(args.out, "results.json"), rows)
    fig, ax = plt.subplots(figsize=(6, 4))
    for eps in [None] + list(args.eps):
        sel = [r for r in rows if r["eps"] == eps]
        ax.plot([r["s"] for r in sel], [r["acc_pl"] for r in sel], "o-",
                label=f"Acc_pl eps={'inf (non-private)' if eps is None else eps}")
        if sel and sel[0]["acc_pc"] is not None:
            ax.plot([r["s"] for r in sel], [r["acc_pc"] for r in sel], "s--",
                    label=f"Acc_pc eps={'inf' if eps is None else eps}")
    ax.set_xlabel("queries s"); ax.set_ylabel("accuracy"); ax.set_title("Fashion-MNIST, central DP")
    ax.legend(fontsize=7); fig.tight_layout()
    save_png(fig, os.path.join(args.out, "fmnist_central.png"))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

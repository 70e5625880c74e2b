"""Label and student accuracy across trust models at equal (eps, delta).

    python -m benchmarks.trust_models --dataset fashion_mnist --eps 0.5 1 2 \
        [--models central:laplace local:rr local:collision shuffle:rr shuffle:collision shuffle:multi] \
        [--protocol actors|library] [--student local|ray|none] [--epochs 5] [--json] [--out DIR]

The setting of paper 000's Figure 5: one record per client (cross-device;
60,000 clients on Fashion-MNIST), s = |Y| = 10 queries, k = 1 (``--s``, ``--k``
change them). Data, encoder and
queries are prepared once; each (model, mechanism, eps) then runs one round:

* ``--protocol actors`` (default): the real path of jobs.distill -- ClientShard
  actors randomize and seal, the Shuffler actor (shuffle model) pools and permutes,
  the Server actor opens, checks and estimates;
* ``--protocol library``: the same mechanism calls in this process, no sealing
  (for wide eps sweeps such as Figure 5's 0.01..4).

Local-model eps is the local eps of each report; central and shuffle eps are the
central guarantee (shuffle: delta = --delta, eps0 from the amplification bound
and the n actually shuffled). The student is trained on the labelled public set
(``local``: the Ray Train loop run in-process, same code; ``ray``: Ray Train).
Prints a table, writes results.json and a PNG per dataset.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from rknn_ray.rng import seeded_generator
from rknn_ray.errors import RknnError
from rknn_ray.runio import write_json
from jobs.experiments import markdown_table

DEFAULT_MODELS = ["central:laplace", "local:rr", "local:collision", "shuffle:rr",
                  "shuffle:collision", "shuffle:multi"]


def library_round(cfg, data, ans, rng_seed):
    """One round without actors: randomize + estimate in-process (same mechanism code)."""
    from rknn_ray.accounting import guarantee_of  # defers dp_accounting, scipy
    from rknn_ray.mechanisms.stage import mechanism_for  # defers faiss
    mech = mechanism_for(cfg, data)
    batch = mech.randomize(ans, seeded_generator(rng_seed))
    counts = mech.estimate(batch.payloads, data.num_clients, seeded_generator(rng_seed + 1))
    return counts, guarantee_of(mech, data.num_clients), len(batch), mech.describe()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion_mnist")
    ap.add_argument("--eps", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    ap.add_argument("--protocol", choices=["actors", "library"], default="actors")
    ap.add_argument("--student", choices=["local", "ray", "none"], default="local")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--s", type=int, default=10)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--dim", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="library protocol: label accuracy averaged over this many "
                         "independent randomizations (student trained on the first)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default="bench_out/trust_models")
    args = ap.parse_args(argv)

    from rknn_ray.job.progress import Progress  # defers cryptography, faiss, ray, tqdm
    # defers cryptography, faiss, ray, tqdm
    from rknn_ray.job.session import ProtocolSession, new_job_id
    from rknn_ray.job.ray_env import ensure_ray
    from rknn_ray.config import load_config  # defers yaml
    from rknn_ray.data.sources import dataset_sources  # defers faiss
    from rknn_ray.labeling.stage import derive_labels, exact_answers  # defers faiss
    from rknn_ray.mechanisms.stage import mechanism_for  # defers faiss
    from rknn_ray.job.stages import prepare_stages  # defers ray, faiss (the job layer)
    from rknn_ray.plots import plt, save_png  # defers matplotlib
    from rknn_ray.student import StudentConfig, train_student, train_student_local  # defers torch

    os.makedirs(args.out, exist_ok=True)
    base = [f"data.dataset={args.dataset}", "data.partition=one_per_client",
            f"queries.s={args.s}", f"rknn.k={args.k}", f"represent.dim={args.dim}",
            f"run.seed={args.seed}", "run.rng=seeded", "labels.type=soft",
            f"privacy.delta={args.delta}"]
    cfg0 = load_config(None, base + ["privacy.delta=0"])    # data and queries: the default (central) model
    st = prepare_stages(cfg0)
    data, encoder, qs = st.data, st.encoder, st.queries
    sp = data.splits
    answers = exact_answers(encoder, data, qs, args.k)
    exact = answers.counts()
    ref = derive_labels(exact.astype(float), qs, sp.public_y, "soft")
    print(f"{args.dataset}: {data.num_clients} clients, s={args.s}; non-private label "
          f"accuracy {ref.label_accuracy:.4f}", file=sys.stderr, flush=True)
    if args.protocol == "actors" or args.student == "ray":
        ensure_ray()

    def student_acc(lab):
        if args.student == "none":
            return None
        scfg = StudentConfig(epochs=args.epochs, label_type="soft", seed=args.seed,
                             num_workers=2 if args.student == "ray" else 1,
                             augment="shift" if args.dataset == "digits" else "none")
        fn = train_student if args.student == "ray" else train_student_local
        kw = {"storage_path": os.path.abspath(os.path.join(args.out, "ray"))} \
            if args.student == "ray" else {}
        return fn(sp.public_x, lab.public_targets, sp.eval_x, sp.eval_y, data.image_shape,
                  data.num_classes, scfg, sample_weight=lab.public_weight, **kw).test_accuracy

    rows = [{"model": "none", "mechanism": "non-private", "eps": None, "acc_labels": ref.label_accuracy,
             "acc_student": student_acc(ref)}]
    for eps in args.eps:
        for spec in args.models:
            model, name = spec.split(":")
            cfg = load_config(None, base + [f"privacy.model={model}", f"privacy.mechanism={name}",
                                            f"privacy.eps={eps}"] +
                              (["privacy.delta=0"] if model != "shuffle" else []))
            row = {"model": model, "mechanism": name, "eps": eps}
            t0 = time.perf_counter()
            try:
                if args.protocol == "actors":
                    mech = mechanism_for(cfg, data)
                    with ProtocolSession(cfg, dataset_sources(cfg, data), new_job_id(),
                                         progress=Progress(False)) as session:
                        from rknn_ray.accounting import PrivacyLedger  # defers dp_accounting
                        res = session.run_round(0, mech, encoder, qs.features, PrivacyLedger())
                    counts, g, msgs, details = res.counts, res.guarantee, res.messages, res.mechanism
                else:
                    counts, g, msgs, details = library_round(cfg, data, answers, args.seed)
                    extra = [derive_labels(library_round(cfg, data, answers, args.seed + 7919 * r)[0],
                                           qs, sp.public_y, "soft").label_accuracy
                             for r in range(1, args.repeats)]
            except RknnError as exc:
                row.update({"error": str(exc)})
                rows.append(row)
                print(f"  {spec} eps={eps}: infeasible ({exc})", file=sys.stderr, flush=True)
                continue
            lab = derive_labels(counts, qs, sp.public_y, "soft")
            accs = [lab.label_accuracy] + (extra if args.protocol == "library" else [])
            row.update({"acc_labels": float(np.mean(accs)), "acc_labels_sd": float(np.std(accs)),
                        "repeats": len(accs), "eps_guarantee": g.eps,
                        "delta_guarantee": g.delta, "eps0": details.get("eps0"),
                        "messages": msgs, "round_s": time.perf_counter() - t0,
                        "mean_abs_count_error": float(np.abs(counts - exact).mean())})
            row["acc_student"] = student_acc(lab)
            rows.append(row)
            st = "-" if row["acc_student"] is None else f"{row['acc_student']:.4f}"
            print(f"  {spec:18s} eps={eps:<5} Acc_pl={row['acc_labels']:.4f}"
                  f"+-{row['acc_labels_sd']:.4f} (x{len(accs)}) Acc_pc={st} "
                  f"({row['round_s']:.1f}s, {msgs} messages)", file=sys.stderr, flush=True)

    print(f"\n{args.dataset}, one record per client, s={args.s}, k={args.k}, "
          f"protocol={args.protocol}")
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["model"], r["mechanism"], r["eps"], "infeasible", "", "", "", ""])
            continue
        g = "-" if r["eps"] is None else f"({r['eps_guarantee']:.3g}, {r['delta_guarantee']:.0e})"
        e0 = "" if r.get("eps0") is None else f"{r['eps0']:.3g}"
        pc = "-" if r["acc_student"] is None else f"{r['acc_student']:.4f}"
        sd = f" +- {r['acc_labels_sd']:.4f}" if r.get("repeats", 1) > 1 else ""
        table.append([r["model"], r["mechanism"], r["eps"] if r["eps"] is not None else "inf", g,
                      e0, f"{r['acc_labels']:.4f}{sd}", pc, r.get("messages", "")])
    print("\n".join(markdown_table(("model", "mechanism", "eps (target)", "guarantee (eps, delta)",
                                    "eps0", "Acc_pl", "Acc_pc", "messages"), table)))
    write_json(os.path.join(args.out, f"{args.dataset}.json"),
               {"args": vars(args), "rows": rows})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for spec in args.models:
        model, name = spec.split(":")
        sel = [r for r in rows if r["model"] == model and r["mechanism"] == name and "error" not in r]
        for ax, key in zip(axes, ("acc_labels", "acc_student")):
            if sel and sel[0].get(key) is not None:
                ax.plot([r["eps"] for r in sel], [r[key] for r in sel], "o-", label=spec)
    for ax, key, title in zip(axes, ("acc_labels", "acc_student"), ("label accuracy", "student accuracy")):
        if rows[0].get(key) is not None:
            ax.axhline(rows[0][key], color="k", ls="--", label="non-private")
        ax.set_xscale("log"); ax.set_xlabel("eps"); ax.set_title(f"{args.dataset}: {title}")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, os.path.join(args.out, f"{args.dataset}.png"))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

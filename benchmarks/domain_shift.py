"""Fashion-MNIST under domain shift: reverse k-NN against the balanced connection rules.

    python -m benchmarks.domain_shift [--shifts none label covariate] [--eps 0.1 1]
        [--rules reverse_knn balanced_min balanced_harmonic] [--shuffle-eps 1]
        [--oracle-eps 0.1] [--epochs 40] [--trainer ray|local] [--student-seeds 1]
        [--repeats 5] [--no-student] [--json] [--out bench_out/domain_shift]

Issue 37 item 3. Where the shift goes: under jobs/configs/fmnist_central.yaml's paper split
the private records are the 60,000 training images, the public set is a seeded half (5,000)
of the test images and the evaluation set the other half (rknn_ray.data.splits). The public
set is all the method sees besides the private votes: the HOG+PCA encoder is fitted on it
(rknn_ray.job.stages.fit_queries), the k-means queries are its samples, the connection rules
price from it, and the student trains on it. So each shift is applied to the public part
only, before the encoder is fitted, while the private records and the evaluation set stay as
the paper split has them (the student is measured on the private holders' distribution):

* ``none``: the paper split as configured;
* ``label``: the public set subsampled to Dirichlet(``--alpha``) class proportions (seeded),
  as large as the available images of each class allow (:func:`dirichlet_subsample`);
* ``covariate``: public images with contrast scaled about each image's mean and Gaussian
  pixel noise added, clipped to [0, 1] (:func:`covariate_shift`).

``rknn.connection: auto``'s choice (public information only) is recorded per setting and eps.
Per setting the encoder, the private embeddings and, per eps, the queries (``queries.s`` /
``rknn.k`` chosen by the config's ``auto`` from public information at that eps) are computed
once; each rule's exact counts once and reused for the noise draws. Every rule at a given
(setting, eps) gets the same noise draws (paired comparison). Central model: the config's
discrete-Laplace mechanism; shuffle model: jobs/configs/fmnist_shuffle.yaml's single-message
mechanism (one record per client), randomized and estimated in this process through the
same mechanism calls the ClientShard and Server actors make (benchmarks.trust_models
``library_round``). Labels as a job makes them (finish_labels: soft, smoothed over the public
graph); the student is the configured one (features -> MLP) trained with Ray Train, or with
``--trainer local`` the same loop in this process (no Train start-up per student). Label
accuracy is averaged over ``--repeats`` noise draws; ``--student-seeds`` students (seeds
run.seed, run.seed + 1, ...) train on the first draw's labels.

The degree profile (min, 10th percentile, median, max of the private records connected to
each query) and the share of queries whose exact top-two gap is below the noise std are
SIMULATION DIAGNOSTICS read from the exact (private) counts; no run releases them. So are the
``--oracle-eps`` rows (balanced rules priced on public + private records, labels only).
Prints a table, writes results.json and domain_shift.png under ``--out``.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import time

import numpy as np

from jobs.writers import markdown_table
from rknn_ray.config import load_config
from rknn_ray.data.prepared import partitioned, prepare_data
from rknn_ray.labeling.connection import RULES, plan_connection
from rknn_ray.labeling.queries import QuerySet, select_queries
from rknn_ray.mechanisms.stage import mechanism_for, noise_std_per_count
from rknn_ray.representation.stage import encoder_from_config
from rknn_ray.rng import seeded_generator
from rknn_ray.runio import write_json
from rknn_ray.student.stage import train_on_labels

SHIFTS = ("none", "label", "covariate")
CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "jobs", "configs")


def dirichlet_subsample(y: np.ndarray, alpha: float, seed: int,
                        num_classes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sorted indices into ``y``, target proportions): the largest subsample of ``y`` whose
    class counts follow proportions drawn from Dirichlet(alpha, ..., alpha), seeded."""
    y = np.asarray(y, dtype=np.int64)
    c = int(num_classes or y.max() + 1)
    if alpha <= 0:
        raise ValueError(f"alpha = {alpha} must be > 0")
    rng = seeded_generator(seed)
    p = rng.dirichlet(np.full(c, float(alpha)))
    avail = np.bincount(y, minlength=c)
    keep = p > 0
    total = int(np.floor(np.min(avail[keep] / p[keep])))
    want = np.minimum(np.floor(p * total), avail).astype(np.int64)    # p * total <= avail
    idx = [rng.choice(np.flatnonzero(y == j), size=int(want[j]), replace=False)
           for j in range(c) if want[j] > 0]
    return np.sort(np.concatenate(idx)), p


def covariate_shift(x: np.ndarray, contrast: float, noise: float, seed: int) -> np.ndarray:
    """Images in [0, 1] with contrast scaled by ``contrast`` about each image's mean and
    Gaussian noise of std ``noise`` added, clipped back to [0, 1]; float32, seeded."""
    if not 0 <= contrast <= 1 or noise < 0:
        raise ValueError(f"contrast = {contrast} must be in [0, 1] and noise = {noise} >= 0")
    x = np.asarray(x, dtype=np.float32)
    axes = tuple(range(1, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    out = mean + contrast * (x - mean)
    if noise > 0:
        out = out + seeded_generator(seed).normal(0.0, noise, size=x.shape).astype(np.float32)
    return np.clip(out, 0.0, 1.0).astype(np.float32)


def shifted(data, shift: str, args):
    """``data`` with its public part shifted (private and evaluation parts untouched) and
    a description of the shift."""
    sp = data.splits
    if shift == "none":
        return data, {"shift": "none", "public": int(len(sp.public_y))}
    if shift == "label":
        idx, p = dirichlet_subsample(sp.public_y, args.alpha, args.seed, data.num_classes)
        new = dataclasses.replace(sp, public_x=sp.public_x[idx], public_y=sp.public_y[idx],
                                  public_index=None if sp.public_index is None
                                  else sp.public_index[idx])
        info = {"shift": "label", "alpha": args.alpha, "proportions": p.round(4).tolist(),
                "public": int(len(idx)),
                "public_per_class": np.bincount(new.public_y, minlength=data.num_classes).tolist()}
    elif shift == "covariate":
        new = dataclasses.replace(sp, public_x=covariate_shift(sp.public_x, args.contrast,
                                                               args.noise, args.seed))
        info = {"shift": "covariate", "contrast": args.contrast, "noise_std": args.noise,
                "public": int(len(sp.public_y))}
    else:
        raise ValueError(f"unknown shift {shift!r}: use one of {SHIFTS}")
    return dataclasses.replace(data, splits=new), info


def degree_profile(exact: np.ndarray) -> dict:
    """Min, 10th percentile, median and max of the records connected to each query (r = 1:
    a query's exact count total). SIMULATION DIAGNOSTIC: read from private data."""
    deg = np.asarray(exact).sum(axis=1)
    return {"min": int(deg.min()), "p10": float(np.percentile(deg, 10)),
            "median": float(np.median(deg)), "max": int(deg.max()),
            "simulation_diagnostic_private": True}


class CachedEncoder:
    """A fitted encoder whose transform is remembered by input content, so every rule's
    exact counts reuse one embedding of the 60,000 private images."""

    def __init__(self, encoder):
        self.inner, self._memo = encoder, {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def transform(self, x):
        x = np.ascontiguousarray(x)
        key = (x.shape, str(x.dtype), hashlib.blake2b(memoryview(x).cast("B"),
                                                       digest_size=16).hexdigest())
        if key not in self._memo:
            self._memo[key] = self.inner.transform(x)
        return self._memo[key]


def queries_at(cfg, public_emb: np.ndarray, s: int):
    """The s k-means queries of the public embeddings, as rknn_ray.job.stages.fit_queries
    picks them (every public sample when s equals the public size)."""
    if s == len(public_emb):
        idx = np.arange(len(public_emb), dtype=np.int64)
        return QuerySet(np.ascontiguousarray(public_emb, dtype=np.float32), idx, idx.copy(), 0.0)
    q = cfg.queries
    return select_queries(public_emb, s, restarts=q.restarts, niter=q.niter, seed=cfg.run.seed,
                          use_nearest_public=q.use_nearest_public)


def rule_counts(encoder, data, qs, k: int, rule: str, price_emb):
    """Exact (s, |Y|) counts (NOT private), the RecordAnswers and the plan's facts under one
    connection rule, planned on ``price_emb`` (the public embeddings, as a run does)."""
    from rknn_ray.labeling.stage import exact_answers  # defers faiss
    conn = plan_connection(rule, price_emb, qs.features, k)
    ans = exact_answers(encoder, data, qs, k, connection=conn)
    return ans.counts(), ans, conn.describe()


def private_sample(encoder, data, args, size: int = 5000) -> np.ndarray:
    """Embeddings of a seeded sample of the PRIVATE records: prices from the public set plus
    them show what a balanced rule could do if the public set also held data like the private
    records (the public samples keep every query's score > 0: the harmonic objective is 0
    while any query has none). A simulation diagnostic only; no private method may plan on
    private records."""
    x = data.splits.private_x
    idx = np.sort(seeded_generator(args.seed + 17).choice(len(x), min(size, len(x)),
                                                          replace=False))
    return encoder.transform(x[idx])


def gap_profile(exact: np.ndarray, noise_std: float) -> dict:
    """How many queries the noise can flip: the exact top-1 minus top-2 count per query
    against the per-count noise std. SIMULATION DIAGNOSTIC: read from private data."""
    top = np.sort(np.asarray(exact, dtype=float), axis=1)
    gap = top[:, -1] - top[:, -2]
    return {"gap_p10": float(np.percentile(gap, 10)), "gap_median": float(np.median(gap)),
            "share_gap_below_noise_std": float(np.mean(gap < noise_std)),
            "share_empty": float(np.mean(top.sum(axis=1) == 0)),
            "simulation_diagnostic_private": True}


def labels_for(cfg, data, counts, qs, public_emb, eps: float | None, k: int):
    from rknn_ray.job.stages import finish_labels  # defers ray, faiss (the job layer)
    std = 0.0 if eps is None else noise_std_per_count(cfg, data, k=k, s=qs.size, eps=eps)
    return finish_labels(cfg, data, np.asarray(counts, dtype=float), qs, public_emb, [],
                         noise_std=std)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shifts", nargs="+", default=list(SHIFTS), choices=SHIFTS)
    ap.add_argument("--eps", type=float, nargs="+", default=[0.1, 1.0], help="central model")
    ap.add_argument("--shuffle-eps", type=float, nargs="*", default=[1.0],
                    help="shuffle model, single message (none: skip)")
    ap.add_argument("--rules", nargs="+", default=None, help="default: every connection rule")
    ap.add_argument("--oracle-eps", type=float, nargs="*", default=[0.1],
                    help="central eps at which the balanced rules are also priced on the public "
                         "set plus a sample of the PRIVATE records (a diagnostic, not a "
                         "private method; labels only)")
    ap.add_argument("--alpha", type=float, default=0.3, help="label shift: Dirichlet concentration")
    ap.add_argument("--contrast", type=float, default=0.5, help="covariate shift: contrast factor")
    ap.add_argument("--noise", type=float, default=0.1, help="covariate shift: pixel noise std")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--trainer", choices=["ray", "local"], default="ray",
                    help="student.trainer: Ray Train, or the same loop in this process")
    ap.add_argument("--repeats", type=int, default=5, help="noise draws for label accuracy")
    ap.add_argument("--student-seeds", type=int, default=1,
                    help="students (seeds run.seed, +1, ...) trained on the first draw's labels")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-student", action="store_true", help="labels only (fast)")
    ap.add_argument("--json", action="store_true", help="print the JSON results to stdout")
    ap.add_argument("--out", default="bench_out/domain_shift")
    args = ap.parse_args(argv)

    rules = list(args.rules or RULES)
    missing = [r for r in rules if r not in RULES]
    if missing:
        print(f"error: --rules {' '.join(missing)}: the connection rules are "
              f"{', '.join(RULES)}; pick from those", file=sys.stderr)
        return 2
    if min(args.eps + args.shuffle_eps, default=1.0) <= 0 or \
            min(args.repeats, args.epochs, args.student_seeds) < 1:
        print("error: eps must be > 0 and --repeats, --epochs, --student-seeds >= 1; pass "
              "positive values", file=sys.stderr)
        return 2

    # defers ray, faiss (the job layer), matplotlib: --help and bad arguments load none
    from rknn_ray.job.stages import resolve_auto, resolve_connection
    from rknn_ray.plots import plt, save_png

    os.makedirs(args.out, exist_ok=True)
    if not args.no_student and args.trainer == "ray":
        from rknn_ray.job.ray_env import ensure_ray  # defers ray: only the Ray trainer
        ensure_ray()
    common = [f"run.seed={args.seed}", f"student.epochs={args.epochs}", "run.progress=false",
              f"student.trainer={args.trainer}"]

    def config(name: str, eps: float):
        return load_config(os.path.join(CONFIG_DIR, name), common + [f"privacy.eps={eps}"])

    base = prepare_data(config("fmnist_central.yaml", args.eps[0] if args.eps else 1.0))
    settings, rows = {}, []
    t_all = time.perf_counter()

    def student(cfg, data, encoder, lab, info, qs, public_emb, tag):
        """Test accuracies of ``--student-seeds`` students on the same labels, and seconds."""
        if args.no_student:
            return [], None
        t1, accs = time.perf_counter(), []
        for i in range(args.student_seeds):
            folder = os.path.abspath(os.path.join(args.out, "runs", f"{tag}-seed{i}"))
            os.makedirs(folder, exist_ok=True)
            run_cfg = cfg.with_overrides([f"run.seed={args.seed + i}"])
            _, res = train_on_labels(run_cfg, data, encoder, lab, info, qs, public_emb, folder)
            accs.append(float(res.test_accuracy))
        return accs, time.perf_counter() - t1

    for shift in args.shifts:
        t0 = time.perf_counter()
        data, info = shifted(base, shift, args)
        cfg0 = config("fmnist_central.yaml", args.eps[0] if args.eps else 1.0)
        encoder = CachedEncoder(encoder_from_config(cfg0).fit(data.splits.public_x))
        public_emb = encoder.transform(data.splits.public_x)
        info["prep_s"] = time.perf_counter() - t0
        settings[shift] = info
        runs = [("central", "laplace", "fmnist_central.yaml", eps) for eps in args.eps] + \
               [("shuffle", None, "fmnist_shuffle.yaml", eps) for eps in args.shuffle_eps]
        for model, mech_name, cfg_name, eps in runs:
            cfg = config(cfg_name, eps)
            run_data = data if model == "central" else partitioned(
                cfg, data.splits, data.num_classes, data.image_shape, data.dataset)
            cfg, choice = resolve_auto(cfg, run_data)
            s, k = int(cfg.queries.s), int(cfg.rknn.k)
            qs = queries_at(cfg, public_emb, s)
            auto_rule, why = resolve_connection(cfg.with_overrides(["rknn.connection=auto"]),
                                                run_data, public_emb, qs)
            info.setdefault("auto_connection", {})[f"{model} eps {eps:g}"] = {
                "rule": auto_rule, "reason": why["reason"], "at_risk": why["at_risk"]}
            variants = [(rule, "public") for rule in rules]
            if model == "central" and eps in args.oracle_eps:
                variants += [(rule, "private") for rule in rules if rule != "reverse_knn"]
            for rule, priced_on in variants:
                t1 = time.perf_counter()
                price_emb = public_emb if priced_on == "public" else np.concatenate(
                    [public_emb, private_sample(encoder, run_data, args)])
                exact, answers, plan_info = rule_counts(encoder, run_data, qs, k, rule, price_emb)
                ref, _ = labels_for(cfg, run_data, exact, qs, public_emb, None, k)
                mech = mechanism_for(cfg, run_data, eps=eps, model=model, name=mech_name)
                accs, first = [], None
                for rep in range(args.repeats):
                    rng_seed = args.seed * 1_000_003 + int(round(eps * 1000)) * 101 + rep
                    if model == "central":
                        counts = mech.add_noise(exact, seeded_generator(rng_seed))
                    else:       # the ClientShard's randomize, the Server's estimate
                        batch = mech.randomize(answers, seeded_generator(rng_seed))
                        counts = mech.estimate(batch.payloads, run_data.num_clients,
                                               seeded_generator(rng_seed + 7919))
                    lab, linfo = labels_for(cfg, run_data, counts, qs, public_emb, eps, k)
                    accs.append(lab.label_accuracy)
                    first = first or (lab, linfo, counts)
                lab, linfo, counts = first
                tag = f"{shift}-{model}-eps{eps:g}-{rule}-{priced_on}"
                students, student_s = ([], None) if priced_on != "public" else student(
                    cfg, run_data, encoder, lab, linfo, qs, public_emb, tag)
                acc_student = float(np.mean(students)) if students else None
                row = {"shift": shift, "model": model,
                       "mechanism": mech_name or cfg.privacy.mechanism,
                       "eps": eps, "rule": rule, "priced_on": priced_on, "s": s, "k": k,
                       "public": int(len(data.splits.public_y)),
                       "acc_labels": float(np.mean(accs)), "acc_labels_sd": float(np.std(accs)),
                       "repeats": len(accs), "acc_labels_nonprivate": ref.label_accuracy,
                       "acc_query": lab.query_accuracy, "acc_student": acc_student,
                       "acc_student_sd": float(np.std(students)) if students else None,
                       "acc_student_seeds": students,
                       "degree": degree_profile(exact),
                       "gaps": gap_profile(exact, linfo["noise_std"]),
                       "acc_query_nonprivate": ref.query_accuracy,
                       "plan": {key: v for key, v in plan_info.items()
                                if key in ("tau", "best_iteration", "public_degree",
                                           "public_objective", "public_objective_reverse_knn")},
                       "mean_abs_count_error": float(np.abs(counts - exact).mean()),
                       "noise_std_per_count": linfo["noise_std"],
                       "smooth_neighbours": linfo["denoise"]["neighbours"],
                       "auto": {"s": s, "k": k, "reason": (choice or {}).get("reason")},
                       "labels_s": time.perf_counter() - t1 - (student_s or 0.0),
                       "student_s": student_s}
                rows.append(row)
                d = row["degree"]
                print(f"{shift:9s} {model:7s} eps={eps:<4g} {rule:17s} {priced_on:7s} s={s:<5d} "
                      f"(auto: {auto_rule}) "
                      f"Acc_pl={row['acc_labels']:.4f}+-{row['acc_labels_sd']:.4f} "
                      f"(np {ref.label_accuracy:.4f}) Acc_pc="
                      f"{'-' if acc_student is None else format(acc_student, '.4f')} "
                      f"deg min/p10/med={d['min']}/{d['p10']:.0f}/{d['median']:.0f} "
                      f"({row['labels_s']:.0f}s + {student_s or 0:.0f}s)",
                      file=sys.stderr, flush=True)

    print("\n".join(table_lines(rows)))
    doc = {"args": vars(args), "settings": settings, "rows": rows,
           "degree_note": "simulation diagnostic computed from the private records' exact "
                          "counts; never released by a run",
           "elapsed_s": time.perf_counter() - t_all}
    write_json(os.path.join(args.out, "results.json"), doc)
    plot(rows, rules, args, plt, save_png)
    if args.json:
        print(json.dumps(doc, default=float))
    return 0


def table_lines(rows) -> list[str]:
    """The markdown table of docs/results.md from result rows (results.json's ``rows``)."""
    table = [[r["shift"], r["model"], f"{r['eps']:g}",
              r["rule"] + ("" if r.get("priced_on", "public") == "public"
                           else " (priced on public + private sample)"),
              r["s"], f"{r['acc_labels']:.4f} +- {r['acc_labels_sd']:.4f}",
              "-" if r["acc_student"] is None else f"{r['acc_student']:.4f}" + (
                  f" +- {r['acc_student_sd']:.4f}" if len(r.get("acc_student_seeds", [])) > 1
                  else ""),
              f"{r['degree']['min']} / {r['degree']['p10']:.0f} / {r['degree']['median']:.0f}"
              f" / {r['degree']['max']}",
              f"{r['gaps']['share_gap_below_noise_std']:.0%}"]
             for r in rows]
    return markdown_table(("shift", "model", "eps", "rule", "s", "label acc", "student acc",
                           "degree min / p10 / median / max", "gap < noise std"), table)


def plot(rows, rules, args, plt, save_png) -> None:
    """Per (model, eps): bars of student (else label) accuracy per shift and rule."""
    panels = sorted({(r["model"], r["eps"]) for r in rows}, key=lambda p: (p[0] != "central", p[1]))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.8),
                             squeeze=False)
    key = "acc_labels" if args.no_student else "acc_student"
    for ax, (model, eps) in zip(axes[0], panels):
        for j, rule in enumerate(rules):
            sel = {r["shift"]: r[key] for r in rows if r["model"] == model and r["eps"] == eps
                   and r["rule"] == rule and r["priced_on"] == "public"}
            xs = np.arange(len(args.shifts)) + (j - (len(rules) - 1) / 2) * 0.8 / len(rules)
            ax.bar(xs, [sel.get(sh, np.nan) or np.nan for sh in args.shifts],
                   width=0.8 / len(rules), label=rule)
        ax.set_xticks(np.arange(len(args.shifts)), args.shifts)
        ax.set_ylim(0, 1)
        ax.set_title(f"{model}, eps={eps:g}: {'label' if args.no_student else 'student'} acc",
                     fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, os.path.join(args.out, "domain_shift.png"))


if __name__ == "__main__":
    sys.exit(main())

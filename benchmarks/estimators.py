"""Bias and variance of every estimator, measured against its closed form.

    python -m benchmarks.estimators [--clients 2000] [--trials 400] [--eps 1] [--json]

For each mechanism (central discrete Laplace, the local randomizers, the shuffle
versions at their amplified eps0, the multi-message protocol) it runs ``trials``
independent randomizations of one fixed BSVS instance (one record per client,
s = 6, |Y| = 4, k = 2) and reports, over all cells: the largest |bias| in units of
its standard error, and the ratio of the measured to the closed-form variance
(``cell_variance`` for local randomizers, the noise variance for central and
multi-message). Unbiased and correct: |z| small, ratio near 1.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from rknn_ray.mechanisms.noise import discrete_laplace_variance
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.rng import seeded_generator
from jobs.experiments import markdown_table

SPECS = [("central", "laplace"), ("local", "rr"), ("local", "collision"),
         ("local", "separation"), ("local", "concatenation"), ("local", "laplace"),
         ("shuffle", "rr"), ("shuffle", "collision"), ("shuffle", "multi")]


def closed_form_variance(mech, answers) -> np.ndarray:
    shape = (answers.num_queries, answers.num_classes)
    if mech.model == "central":
        return np.full(shape, discrete_laplace_variance(mech.scale))
    if mech.name == "multi":
        return np.full(shape, mech.describe()["error_variance_all_honest"])   # every client honest
    return np.asarray(mech.cell_variance(answers), dtype=float)


def run(clients: int, trials: int, eps: float, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    s, c, k = 6, 4, 2
    nb = np.argsort(rng.random((clients, s)), axis=1)[:, :k]
    ans = RecordAnswers(nb, rng.integers(0, c, (clients, 1)), np.arange(clients), s, c)
    truth = ans.counts().astype(float)
    rows = []
    for model, name in SPECS:
        mech = build(model, name, MechanismParams(s, c, k, eps, delta=1e-6 if model == "shuffle" else 0.0,
                                                  num_clients=clients))
        ests = np.stack([mech.estimate(mech.randomize(ans, seeded_generator(seed + t)).payloads,
                                       clients, seeded_generator(10**6 + t))
                         for t in range(trials)])
        var_th = closed_form_variance(mech, ans)
        bias_z = (ests.mean(0) - truth) / np.sqrt(var_th / trials)
        ratio = ests.var(0, ddof=1) / var_th
        rows.append({"model": model, "mechanism": name, "eps_run": float(getattr(mech, "local_eps", eps)),
                     "max_abs_bias_z": float(np.abs(bias_z).max()),
                     "mean_bias_z": float(bias_z.mean()),
                     "var_ratio_mean": float(ratio.mean()), "var_ratio_min": float(ratio.min()),
                     "var_ratio_max": float(ratio.max()), "var_theory_mean": float(var_th.mean()),
                     "message_bytes": int(mech.message_size)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=2000)
    ap.add_argument("--trials", type=int, default=400)
    ap.add_argument("--eps", type=float, default=1.0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = run(args.clients, args.trials, args.eps)
    print(f"{args.clients} clients, {args.trials} trials, eps={args.eps} (24 cells; with 24 cells "
          f"max |z| up to ~3 is expected; variance ratio SE ~ {np.sqrt(2 / args.trials):.3f})")
    print("\n".join(markdown_table(
        ("model", "mechanism", "eps run", "max abs bias z", "mean var (theory)",
         "measured/theory var: mean [min, max]", "bytes"),
        [[r["model"], r["mechanism"], f"{r['eps_run']:.3g}", f"{r['max_abs_bias_z']:.2f}",
          f"{r['var_theory_mean']:.4g}", f"{r['var_ratio_mean']:.3f} [{r['var_ratio_min']:.2f}, "
          f"{r['var_ratio_max']:.2f}]", r["message_bytes"]] for r in rows])))
    if args.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

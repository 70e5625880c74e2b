"""The utility cost of the multi-message protocol's assumed honest fraction, in process.

    python -m benchmarks.honest_fraction [--config jobs/configs/fmnist_shuffle.yaml]
        [--fractions 0.5 1.0] [--seeds 3] [--json]

For each ``privacy.honest_fraction`` it resolves ``queries.s: auto`` as the job does (the
per-client message cap binds harder when every client sends m = ceil(gamma n) clients'
shares), fits the public encoder and queries, computes the exact counts, and adds the
noise the release carries when every client is honest: per cell NB(n/m, p) - NB(n/m, p)
from the exact sampler (flooding pairs cancel in the estimate). Labels come from the
job's own post-processing (smoothing over the public graph). Prints s, the noise standard
deviation per count, expected messages per client and the label accuracy per seed. No
actors and no student: it isolates what the fraction costs the released counts.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction

import numpy as np


def measure(config: str, fractions: list[float], seeds: int) -> list[dict]:
    from rknn_ray.config import load_config
    from rknn_ray.mechanisms.exact import negative_binomial
    from rknn_ray.pipeline import exact_counts, finish_labels, mechanism_for, prepare_stages
    from rknn_ray.rng import seeded_generator
    rows = []
    data = None
    for gamma in fractions:
        cfg = load_config(config, ["privacy.mechanism=multi", f"privacy.honest_fraction={gamma}"])
        st = prepare_stages(cfg, data, resolve=True)      # one dataset for every fraction
        cfg, data, choice, qs, public_emb = st.cfg, st.data, st.auto, st.queries, st.public_emb
        exact = exact_counts(st.encoder, data, [qs], cfg.rknn.k)
        mech = mechanism_for(cfg, data, model="shuffle", name="multi")
        d = mech.params.num_cells
        shape = Fraction(mech.n_cal, mech.n_honest)
        std = math.sqrt(mech.describe()["error_variance_all_honest"])
        accs = []
        for seed in range(seeds):
            rng = seeded_generator(1000 + seed)
            noise = (negative_binomial(rng, shape, mech.nb_rate, d)
                     - negative_binomial(rng, shape, mech.nb_rate, d)).reshape(exact.shape)
            lab, _ = finish_labels(cfg, data, exact + noise, qs, public_emb, [], noise_std=std)
            accs.append(float(lab.label_accuracy))
        rows.append({"honest_fraction": gamma, "s": int(qs.size), "k": int(cfg.rknn.k),
                     "noise_senders": mech.n_honest, "clients": mech.n_cal,
                     "noise_std_per_count": std,
                     "messages_per_client_expected": mech.describe()["messages_per_client_expected"],
                     "eps": mech.cal.eps, "label_accuracy": accs,
                     "label_accuracy_median": float(np.median(accs)),
                     "auto": (choice or {}).get("reason")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="jobs/configs/fmnist_shuffle.yaml")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = measure(a.config, a.fractions, a.seeds)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    from jobs.experiments import markdown_table
    print("\n".join(markdown_table(
        ("honest fraction", "s", "noise senders m", "noise std/count", "msgs/client",
         "label acc (median)"),
        [[f"{r['honest_fraction']:g}", r["s"], f"{r['noise_senders']} of {r['clients']}",
          f"{r['noise_std_per_count']:.3g}", f"{r['messages_per_client_expected']:.1f}",
          f"{r['label_accuracy_median']:.4f} ({', '.join(f'{x:.4f}' for x in r['label_accuracy'])})"]
         for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

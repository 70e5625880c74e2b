"""The utility cost of the multi-message protocol's assumed honest fraction and DLap share,
in process.

    python -m benchmarks.honest_fraction [--config jobs/configs/fmnist_shuffle.yaml]
        [--fractions 0.5 1.0] [--shares auto 0.85 0.7 0.55] [--seeds 3] [--student]
        [--set KEY=VALUE ...] [--json]

For each ``privacy.honest_fraction`` and ``privacy.options.dlap_share`` (``auto``: left to
the job's choice, rknn_ray.mechanisms.stage.free_dlap_shares) it resolves ``queries.s: auto`` as
the job does (the per-client message cap binds harder when every client sends m = ceil(gamma
n) clients' shares, and less when a smaller DLap share needs fewer flooding messages), fits
the public encoder and queries, computes the exact counts, and adds the noise the release
carries when every client is honest: per cell NB(n/m, p) - NB(n/m, p) from the exact
sampler (flooding pairs cancel in the estimate). Labels come from the job's own
post-processing (smoothing over the public graph). Prints s, the noise standard deviation
per count, expected messages per client, the label accuracy per seed, and the label
accuracy of the exact counts at the same s (what the queries alone allow); with
``--student``, also the job's student trained on each draw's labels (its loop in this
process, ``student.trainer: local``) and once on the exact counts' labels: the student the
queries alone allow, whatever the noise. ``--set`` adds config overrides (``queries.s=5000``:
the exact-count columns at an s the cap would not allow). No actors: it isolates what each
setting costs the released counts.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from fractions import Fraction

import numpy as np

from rknn_ray.accounting.guarantee import guarantee_of
from rknn_ray.mechanisms.exact import negative_binomial
from rknn_ray.rng import seeded_generator
from jobs.experiments import markdown_table


def measure(config: str, fractions: list[float], seeds: int,
            shares: tuple = ("auto",), student: bool = False,
            overrides: tuple = ()) -> list[dict]:
    from rknn_ray.config import load_config  # defers yaml
    from rknn_ray.labeling.stage import exact_counts  # defers faiss
    from rknn_ray.mechanisms.stage import mechanism_for  # defers faiss
    from rknn_ray.job.stages import finish_labels, prepare_stages  # defers ray, faiss
    from rknn_ray.student.stage import train_on_labels  # defers torch
    rows = []
    data = None
    for gamma, share in [(g, sh) for g in fractions for sh in shares]:
        cfg = load_config(config, ["privacy.mechanism=multi", f"privacy.honest_fraction={gamma}"]
                          + ([] if share == "auto" else [f"privacy.options.dlap_share={share}"])
                          + list(overrides))
        st = prepare_stages(cfg, data, resolve=True)      # one dataset for every setting
        cfg, data, choice, qs, public_emb = st.cfg, st.data, st.auto, st.queries, st.public_emb
        exact = exact_counts(st.encoder, data, [qs], cfg.rknn.k)
        mech = mechanism_for(cfg, data, model="shuffle", name="multi")
        d = mech.params.num_cells
        shape = Fraction(mech.n_cal, mech.n_honest)
        std = math.sqrt(mech.describe()["error_variance_all_honest"])
        local = cfg.with_overrides(["student.trainer=local"])   # the job's student, in process

        def student_of(labels, info) -> float:
            _, res = train_on_labels(local, data, st.encoder, labels, info, qs, public_emb)
            return float(res.test_accuracy)

        accs, students = [], []
        for seed in range(seeds):
            rng = seeded_generator(1000 + seed)
            noise = (negative_binomial(rng, shape, mech.nb_rate, d)
                     - negative_binomial(rng, shape, mech.nb_rate, d)).reshape(exact.shape)
            lab, info = finish_labels(cfg, data, exact + noise, qs, public_emb, [], noise_std=std)
            accs.append(float(lab.label_accuracy))
            if student:
                students.append(student_of(lab, info))
        exact_lab, exact_info = finish_labels(cfg, data, exact, qs, public_emb, [], noise_std=std)
        # no noise at all: the ceiling these queries put on the student
        student_exact = student_of(exact_lab, exact_info) if student else None
        rows.append({"honest_fraction": gamma, "dlap_share": mech.cal.dlap_share,
                     "dlap_share_set": share, "s": int(qs.size), "k": int(cfg.rknn.k),
                     "noise_senders": mech.n_honest, "clients": mech.n_cal,
                     "noise_std_per_count": std,
                     "messages_per_client_expected": mech.describe()["messages_per_client_expected"],
                     "eps": guarantee_of(mech).eps, "label_accuracy": accs,
                     "label_accuracy_median": float(np.median(accs)),
                     "label_accuracy_exact_counts": float(exact_lab.label_accuracy),
                     "student_accuracy": students,
                     "student_accuracy_median": float(np.median(students)) if students else None,
                     "student_accuracy_exact_counts": student_exact,
                     "auto": (choice or {}).get("reason")})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="jobs/configs/fmnist_shuffle.yaml")
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--shares", nargs="+", default=["auto"],
                    help="privacy.options.dlap_share values, or auto (the job's choice)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--student", action="store_true",
                    help="also train the job's student on each draw's labels (in this process)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override, as for jobs.distill (repeatable)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    shares = [sh if sh == "auto" else float(sh) for sh in a.shares]
    rows = measure(a.config, a.fractions, a.seeds, tuple(shares), a.student, tuple(a.overrides))
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("\n".join(markdown_table(
        ("honest fraction", "DLap share", "s", "noise senders m", "noise std/count",
         "msgs/client", "label acc (median)", "exact counts, same s", "student (median)",
         "student, exact counts"),
        [[f"{r['honest_fraction']:g}",
          f"{r['dlap_share']:g}" + (" (auto)" if r["dlap_share_set"] == "auto" else ""),
          r["s"], f"{r['noise_senders']} of {r['clients']}",
          f"{r['noise_std_per_count']:.3g}", f"{r['messages_per_client_expected']:.1f}",
          f"{r['label_accuracy_median']:.4f} ({', '.join(f'{x:.4f}' for x in r['label_accuracy'])})",
          f"{r['label_accuracy_exact_counts']:.4f}",
          "-" if r["student_accuracy_median"] is None else
          f"{r['student_accuracy_median']:.4f} ({', '.join(f'{x:.4f}' for x in r['student_accuracy'])})",
          "-" if r["student_accuracy_exact_counts"] is None else
          f"{r['student_accuracy_exact_counts']:.4f}"]
         for r in rows])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

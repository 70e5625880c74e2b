"""Figure 6 of paper 000: MSE of flat Collision vs Separation vs Concatenation.

Setting: n = 1 client, s = 200, |Y| = 50, k = 2, r = 2, eps in [0.5, 8]. The MSE
is the average over the s*|Y| cells of the estimate's variance (all estimators
are unbiased), computed exactly from the closed-form per-report variances and
checked by simulation at a few eps (many independent single-client trials).

Two sets of curves:
* exact: the mechanisms as implemented (unbiased estimators, exact variances);
* paper approximation (Appendix B): an empty cell's variance V for flat Collision,
  V_T(eps/2) V_y(eps/2) for Separation and V_concat(eps)^2 for Concatenation (the
  naive product, which is biased on the record's own cells);
* the naive Concatenation product's true MSE (variance on every cell class plus
  its squared bias on the k r cells of the record).

    python -m benchmarks.local_mse [--json] [--out DIR]

prints a table (to stderr under --json, which prints the JSON document to stdout)
and writes DIR/local_mse.json and DIR/local_mse.png.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.collision import collision_client_variance, collision_l
from rknn_ray.mechanisms.separation import concatenation_moments

S, NY, K, R = 200, 50, 2, 2
NAMES = ("collision", "separation", "concatenation")
PAPER_CLAIM = "Concatenation more accurate than flat Collision for eps >= ~3.5, and better " \
              "than Separation at every eps"


def one_client() -> RecordAnswers:
    return RecordAnswers(np.array([[0, 1]]), np.array([[0, 1]]), np.array([0]), S, NY)


def mechanism(name: str, eps: float):
    return build("local", name, MechanismParams(S, NY, K, eps=eps, r=R, num_clients=1))


def exact_mse(name: str, eps: float) -> float:
    return float(mechanism(name, eps).cell_variance(one_client()).mean())


def paper_mse(name: str, eps: float) -> float:
    def v_empty(e, c):
        return collision_client_variance(e, collision_l(e, c), c)[1]
    if name == "collision":
        return v_empty(eps, K * R)
    if name == "separation":
        return v_empty(eps / 2, K) * v_empty(eps / 2, R)
    return v_empty(eps, K + R) ** 2


def bloom_lengths(eps: float) -> dict:
    """Integer Bloom-filter lengths l each mechanism uses at ``eps``."""
    sep = mechanism("separation", eps)
    return {"collision": mechanism("collision", eps).oracle.l,
            "separation": [sep.oracle_t.l, sep.oracle_y.l],
            "concatenation": mechanism("concatenation", eps).oracle.l}


def naive_concatenation_mse(eps: float) -> float:
    """True MSE (variance + bias^2) of the paper's plain product a_hat b_hat, averaged."""
    c = K + R
    mom = concatenation_moments(eps, collision_l(eps, c), c, naive=True)
    count = {(1, 1): K * R, (1, 0): K * (NY - R), (0, 1): (S - K) * R,
             (0, 0): (S - K) * (NY - R)}
    return sum(n * (mom[key][1] + (mom[key][0] - key[0] * key[1]) ** 2)
               for key, n in count.items()) / (S * NY)


def crossings(eps: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[float]:
    """eps where log(a/b) changes sign (linear interpolation in log space)."""
    d = np.log(a) - np.log(b)
    out = []
    for i in np.nonzero(np.sign(d[:-1]) != np.sign(d[1:]))[0]:
        out.append(float(eps[i] + (eps[i + 1] - eps[i]) * d[i] / (d[i] - d[i + 1])))
    return out


def simulate(name: str, eps: float, trials: int, rng: np.random.Generator) -> dict:
    """Average over cells of the squared error of `trials` independent one-client runs."""
    m = mechanism(name, eps)
    ans = RecordAnswers(np.tile([0, 1], (trials, 1)), np.tile([0, 1], (trials, 1)),
                        np.arange(trials), S, NY)
    payloads = m.randomize(ans, rng).payloads
    truth = one_client().counts().astype(float)
    per_trial = []
    for a in range(0, trials, 200):
        est = m.client_estimates(payloads[a:a + 200])
        per_trial.append(((est - truth) ** 2).mean(axis=(1, 2)))
    per_trial = np.concatenate(per_trial)
    return {"mechanism": name, "eps": eps, "trials": trials,
            "mse_simulated": float(per_trial.mean()),
            "se": float(per_trial.std(ddof=1) / math.sqrt(trials)),
            "mse_exact": exact_mse(name, eps)}


def run(trials: int, sim_eps: list[float], seed: int) -> dict:
    eps = np.round(np.arange(0.5, 8.0001, 0.1), 10)
    exact = {n: np.array([exact_mse(n, e) for e in eps]) for n in NAMES}
    approx = {n: np.array([paper_mse(n, e) for e in eps]) for n in NAMES}
    naive = np.array([naive_concatenation_mse(e) for e in eps])
    cross = {"naive_concatenation_vs_collision": crossings(eps, naive, exact["collision"])}
    for label, curves in (("exact", exact), ("paper_approximation", approx)):
        cross[label] = {
            "concatenation_vs_collision": crossings(eps, curves["concatenation"],
                                                    curves["collision"]),
            "separation_vs_collision": crossings(eps, curves["separation"], curves["collision"]),
            "concatenation_vs_separation": crossings(eps, curves["concatenation"],
                                                     curves["separation"]),
        }
    rng = np.random.default_rng(seed)
    sims = [simulate(n, e, trials, rng) for e in sim_eps for n in NAMES]
    sizes = {f"eps={e:g}": {n: mechanism(n, e).message_size for n in NAMES}
             for e in (eps[0], eps[-1])}
    return {"setting": {"n": 1, "s": S, "num_classes": NY, "k": K, "r": R,
                        "record": {"queries": [0, 1], "labels": [0, 1]},
                        "mse": "mean over the s*|Y| cells of E[(est - a)^2]"},
            "eps": eps.tolist(),
            "l_at_integer_eps": {f"{e:g}": bloom_lengths(e) for e in (1, 2, 4, 8)},
            "mse_exact": {n: v.tolist() for n, v in exact.items()},
            "mse_paper_approximation": {n: v.tolist() for n, v in approx.items()},
            "mse_naive_concatenation": naive.tolist(),
            "crossings": cross, "simulation": sims, "bytes_per_client": sizes,
            "paper_claim": PAPER_CLAIM, "verdict": verdict(eps, exact, approx, cross)}


def verdict(eps, exact, approx, cross) -> str:
    ca = cross["paper_approximation"]["concatenation_vs_collision"]
    ce = cross["exact"]["concatenation_vs_collision"]
    cn = cross["naive_concatenation_vs_collision"]
    sep_dominated = bool(np.all(approx["concatenation"] <= approx["separation"]))
    return (f"Paper approximation: Concatenation beats flat Collision from eps ~ "
            f"{', '.join(f'{x:.2f}' for x in ca) or 'never'} (paper: ~3.5) and "
            f"{'is below' if sep_dominated else 'is not always below'} Separation at every eps. "
            f"Exact unbiased estimators: Concatenation vs Collision crossings: "
            f"{', '.join(f'{x:.2f}' for x in ce) or 'none (Concatenation never better)'}; "
            f"Separation vs Collision: "
            f"{', '.join(f'{x:.2f}' for x in cross['exact']['separation_vs_collision']) or 'none'}; "
            f"Concatenation vs Separation: "
            f"{', '.join(f'{x:.2f}' for x in cross['exact']['concatenation_vs_separation']) or 'none'}. "
            f"The paper's plain product (biased on the record's own cells), true MSE incl. "
            f"bias^2, vs Collision: {', '.join(f'{x:.2f}' for x in cn) or 'none'}.")


def table(doc: dict) -> str:
    lines = [f"{'eps':>5} | " + " | ".join(f"{n[:6] + ' exact':>13}" for n in NAMES) + " | "
             + " | ".join(f"{n[:6] + ' paper':>13}" for n in NAMES)]
    for i, e in enumerate(doc["eps"]):
        if abs(e * 2 - round(e * 2)) > 1e-9:
            continue
        lines.append(f"{e:5.1f} | " + " | ".join(f"{doc['mse_exact'][n][i]:13.4g}" for n in NAMES)
                     + " | " + " | ".join(f"{doc['mse_paper_approximation'][n][i]:13.4g}"
                                          for n in NAMES))
    lines.append("")
    lines.append("simulation check (single-client trials):")
    for s in doc["simulation"]:
        z = (s["mse_simulated"] - s["mse_exact"]) / s["se"]
        lines.append(f"  {s['mechanism']:>13} eps={s['eps']:<4} exact={s['mse_exact']:.4g} "
                     f"simulated={s['mse_simulated']:.4g} +- {s['se']:.2g} (z={z:+.2f})")
    lines.append(f"bytes per client: {doc['bytes_per_client']}")
    lines.append("crossings: " + json.dumps(doc["crossings"]))
    lines.append("verdict: " + doc["verdict"])
    return "\n".join(lines)


def plot(doc: dict, path: Path) -> None:
    from rknn_ray.plots import plt, save_png  # defers matplotlib
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"collision": "C0", "separation": "C1", "concatenation": "C2"}
    for n in NAMES:
        ax.plot(doc["eps"], doc["mse_exact"][n], color=colors[n], label=f"{n} (exact, unbiased)")
        ax.plot(doc["eps"], doc["mse_paper_approximation"][n], color=colors[n], ls="--",
                label=f"{n} (paper approximation)")
    ax.plot(doc["eps"], doc["mse_naive_concatenation"], color="C2", ls=":",
            label="concatenation (plain product: true MSE incl. bias$^2$)")
    for s in doc["simulation"]:
        ax.errorbar(s["eps"], s["mse_simulated"], yerr=2 * s["se"], fmt="o",
                    color=colors[s["mechanism"]], ms=4)
    ax.set_yscale("log")
    ax.set_xlabel("local eps")
    ax.set_ylabel("MSE per cell (n = 1)")
    ax.set_title("Figure 6: s=200, |Y|=50, k=2, r=2")
    ax.legend(fontsize=7)
    fig.tight_layout()
    save_png(fig, str(path), dpi=120)                # atomic, like every other plot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the JSON document on stdout")
    ap.add_argument("--out", default="out/local_mse", help="folder for local_mse.json/.png")
    ap.add_argument("--trials", type=int, default=2000, help="single-client trials per point")
    ap.add_argument("--sim-eps", default="1,3.5,6", help="comma-separated eps to simulate")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    t0 = time.time()
    doc = run(args.trials, [float(x) for x in args.sim_eps.split(",") if x], args.seed)
    doc["seconds"] = round(time.time() - t0, 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "local_mse.json").write_text(json.dumps(doc, indent=1))
    plot(doc, out / "local_mse.png")
    print(table(doc), file=sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

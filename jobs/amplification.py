"""Evaluate shuffle-model privacy amplification (python -m jobs.amplification).

Single point:
    python -m jobs.amplification --n 100000 --eps0 4 --delta 1e-6 --json
    python -m jobs.amplification --n 100000 --target-eps 0.5 --delta 1e-6 --json
prints a JSON list, one entry per bound: {"bound", "eps" (or "eps0"), "seconds"}
(plus "error" where a bound does not apply, e.g. the closed form out of its range).

Grid (table, plots, audit):
    python -m jobs.amplification --grid --out runs/amplification
writes results.json, table.txt and PNGs (central eps per bound, the local eps0 each
grants, BSVS labeling error, time per bound, empirical audit), each atomically.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time

import numpy as np

from rknn_ray.accounting import BOUNDS, variation_ratio_bound
from rknn_ray.accounting.audit import (audit_binary_rr, rr_error_bound,
                                       simulate_rr_labeling_error)
from rknn_ray.accounting.ledger import atomic_write_json
from rknn_ray.errors import ConfigError

GRID_N = (10**3, 10**4, 10**5, 10**6)
GRID_EPS0 = (0.5, 1.0, 2.0, 4.0, 6.0)
GRID_DELTA = (1e-6, 1e-8)
GRID_TARGETS = (0.5, 1.0)
ORDER = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form",
         "fmt_closed_form_final")


def _one(fn, *args) -> tuple[float | None, float, str | None]:
    t = time.perf_counter()
    try:
        v = fn(*args)
        return (None if v is None else float(v)), time.perf_counter() - t, None
    except ConfigError as exc:
        return None, time.perf_counter() - t, str(exc)


def point(n: int, delta: float, eps0: float | None = None,
          target_eps: float | None = None, rtol: float = 1e-6) -> list[dict]:
    """One row per bound: central eps for eps0, or local eps0 for target_eps."""
    out = []
    for name in ORDER:
        b = BOUNDS[name]
        if eps0 is not None:
            v, s, err = _one(b.central_eps, eps0, n, delta)
            row = {"bound": name, "eps": v, "seconds": s}
        else:
            v, s, err = _one(lambda t, n_, d: b.local_eps0(t, n_, d, rtol=rtol), target_eps, n, delta)
            row = {"bound": name, "eps0": v, "seconds": s}
        if err:
            row["error"] = err
        out.append(row)
    return out


def _atomic_savefig(fig, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".png", dir=folder)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110, format="png")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _atomic_text(path: str, text: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".txt", dir=folder)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def run_grid(out: str, ns=GRID_N, eps0s=GRID_EPS0, deltas=GRID_DELTA, targets=GRID_TARGETS,
             k: int = 1, r: int = 1, num_classes: int = 10, audit_trials: int = 1_000_000,
             seed: int = 0, plots: bool = True) -> dict:
    """The evaluation grid: central eps, granted eps0, labeling error, timings, audit."""
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    rows, inverse, audits, violations = [], [], [], []
    for delta in deltas:
        for n in ns:
            for e0 in eps0s:
                res = {r_["bound"]: r_ for r_ in point(n, delta, eps0=e0)}
                krr = variation_ratio_bound("krr", k=num_classes)
                v, s, err = _one(krr.central_eps, e0, n, delta)
                res[f"variation_ratio_krr{num_classes}"] = {"bound": krr.name, "eps": v, "seconds": s}
                rows.append({"n": n, "eps0": e0, "delta": delta,
                             **{b: res[b]["eps"] for b in res},
                             "seconds": {b: res[b]["seconds"] for b in res}})
                vals = [res[b]["eps"] for b in ("lower_bound", "variation_ratio", "clones_numerical",
                                                "fmt_closed_form_final")]
                chain = [x for x in vals if x is not None]
                if any(a > b_ + 1e-9 for a, b_ in zip(chain, chain[1:])):
                    violations.append({"n": n, "eps0": e0, "delta": delta, "values": vals})
            for t in targets:
                inv = {r_["bound"]: r_["eps0"] for r_ in point(n, delta, target_eps=t, rtol=1e-4)}
                row = {"n": n, "delta": delta, "target_eps": t, "eps0": inv, "labeling": {}}
                # BSVS labeling error at the granted eps0 (theory; simulation where it is cheap)
                counts = _bsvs_counts(n, num_classes)
                for b, e0 in inv.items():
                    if e0 is None or b == "lower_bound":
                        continue
                    th = rr_error_bound(e0, n, k, r, num_classes)
                    sim = simulate_rr_labeling_error(e0, counts, n, k, r, trials=200, rng=rng)
                    row["labeling"][b] = {"eta_theory": th, "eta_over_n": th / n,
                                          "label_error_sim": sim}
                inverse.append(row)
        # audit at a few points (binary RR, n where the count fits quickly)
        for n in ns[:3]:
            for e0 in (1.0, 4.0):
                claimed = {b: next(x[b] for x in rows if x["n"] == n and x["eps0"] == e0
                                   and x["delta"] == delta)
                           for b in ("variation_ratio", "clones_numerical", "fmt_closed_form")}
                a = audit_binary_rr(n, e0, delta, claimed, trials=audit_trials, rng=rng)
                audits.append(a.to_dict())
    result = {"grid": {"n": list(ns), "eps0": list(eps0s), "delta": list(deltas),
                       "targets": list(targets), "k": k, "r": r, "num_classes": num_classes},
              "central": rows, "inverse": inverse, "audit": audits,
              "order_violations": violations,
              "red_flags": [a for a in audits if a["red_flags"]],
              "total_seconds": time.perf_counter() - t_start}
    atomic_write_json(os.path.join(out, "results.json"), result)
    _atomic_text(os.path.join(out, "table.txt"), format_table(rows, inverse, audits))
    if plots:
        make_plots(result, out)
    return result


def _bsvs_counts(n: int, num_classes: int) -> np.ndarray:
    """A realistic count profile: 20 queries, majority class holding 40% of n/20 votes."""
    s = 20
    per = n // s
    counts = np.full((s, num_classes), int(0.6 * per / (num_classes - 1)), dtype=np.int64)
    counts[np.arange(s), np.arange(s) % num_classes] = int(0.4 * per)
    return counts


def format_table(rows, inverse, audits) -> str:
    cols = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form",
            "fmt_closed_form_final")
    lines = ["central eps by bound (None: closed form out of its validity range)",
             f"{'delta':>7} {'n':>8} {'eps0':>5} " + " ".join(f"{c[:18]:>18}" for c in cols)]
    for r_ in rows:
        vals = " ".join(f"{'-' if r_[c] is None else format(r_[c], '.5f'):>18}" for c in cols)
        lines.append(f"{r_['delta']:7.0e} {r_['n']:8d} {r_['eps0']:5.1f} {vals}")
    lines += ["", "local eps0 granted for a target central eps"]
    for r_ in inverse:
        vals = " ".join(f"{c}={'-' if r_['eps0'][c] is None else format(r_['eps0'][c], '.4f')}"
                        for c in cols)
        lines.append(f"delta={r_['delta']:.0e} n={r_['n']} target={r_['target_eps']}: {vals}")
    lines += ["", "empirical audit (binary RR, Clopper-Pearson lower bound vs claimed upper)"]
    for a in audits:
        flag = "RED FLAG: " + ",".join(a["red_flags"]) if a["red_flags"] else "ok"
        lines.append(f"n={a['n']} eps0={a['eps0']} delta={a['delta']:.0e}: "
                     f"eps_lb={a['eps_lower_empirical']:.4f} claimed={a['claimed_upper']} {flag}")
    return "\n".join(lines) + "\n"


def make_plots(result: dict, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = result["central"]
    bounds = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form")
    for delta in result["grid"]["delta"]:
        ns = result["grid"]["n"]
        fig, axes = plt.subplots(1, len(ns), figsize=(4 * len(ns), 3.5), sharey=True)
        for ax, n in zip(np.atleast_1d(axes), ns):
            sub = [r_ for r_ in rows if r_["n"] == n and r_["delta"] == delta]
            for b in bounds:
                xs = [r_["eps0"] for r_ in sub if r_[b] is not None]
                ys = [r_[b] for r_ in sub if r_[b] is not None]
                ax.plot(xs, ys, marker="o", label=b)
            ax.set_title(f"n={n:.0e}")
            ax.set_xlabel("local eps0")
            ax.set_yscale("log")
        np.atleast_1d(axes)[0].set_ylabel(f"central eps (delta={delta:.0e})")
        np.atleast_1d(axes)[0].legend(fontsize=7)
        fig.tight_layout()
        _atomic_savefig(fig, os.path.join(out, f"central_eps_delta{delta:.0e}.png"))
        plt.close(fig)
    # granted eps0 and labeling error
    inv = result["inverse"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for b in ("variation_ratio", "clones_numerical", "fmt_closed_form"):
        for t in result["grid"]["targets"]:
            sub = [r_ for r_ in inv if r_["target_eps"] == t and r_["delta"] == result["grid"]["delta"][0]]
            xs = [r_["n"] for r_ in sub if r_["eps0"].get(b) is not None]
            ax1.plot(xs, [r_["eps0"][b] for r_ in sub if r_["eps0"].get(b) is not None],
                     marker="o", label=f"{b}, eps={t}")
            ax2.plot([r_["n"] for r_ in sub if b in r_["labeling"]],
                     [r_["labeling"][b]["label_error_sim"] for r_ in sub if b in r_["labeling"]],
                     marker="o", label=f"{b}, eps={t}")
    ax1.set_xscale("log"); ax1.set_xlabel("n"); ax1.set_ylabel("granted local eps0")
    ax2.set_xscale("log"); ax2.set_xlabel("n"); ax2.set_ylabel("simulated label error (RR)")
    ax1.legend(fontsize=6)
    fig.tight_layout()
    _atomic_savefig(fig, os.path.join(out, "granted_eps0_and_label_error.png"))
    plt.close(fig)
    # timing
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for b in bounds:
        xs = sorted({r_["n"] for r_ in rows})
        ys = [np.mean([r_["seconds"][b] for r_ in rows if r_["n"] == n]) for n in xs]
        ax.plot(xs, ys, marker="o", label=b)
    ax.set_xscale("log"); ax.set_yscale("log"); ax.set_xlabel("n"); ax.set_ylabel("seconds / bound")
    ax.legend(fontsize=7)
    fig.tight_layout()
    _atomic_savefig(fig, os.path.join(out, "timing.png"))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.amplification", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, help="number of shuffled senders")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--eps0", type=float, help="local eps0 of each sender")
    g.add_argument("--target-eps", type=float, help="central eps target: print granted eps0")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--grid", action="store_true", help="run the evaluation grid")
    ap.add_argument("--out", default="runs/amplification", help="grid output folder")
    ap.add_argument("--audit-trials", type=int, default=1_000_000)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.grid:
            res = run_grid(args.out, audit_trials=args.audit_trials, plots=not args.no_plots)
            print(format_table(res["central"], res["inverse"], res["audit"]))
            print(f"wrote {args.out} in {res['total_seconds']:.1f}s; "
                  f"red flags: {len(res['red_flags'])}; order violations: {len(res['order_violations'])}")
            return 1 if res["red_flags"] else 0
        if args.n is None or (args.eps0 is None and args.target_eps is None):
            ap.error("give --n and one of --eps0 / --target-eps (or --grid)")
        n = int(args.n)
        if n != args.n:
            ap.error("--n must be an integer")
        rows = point(n, args.delta, eps0=args.eps0, target_eps=args.target_eps)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows))
    else:
        key = "eps" if args.eps0 is not None else "eps0"
        for r_ in rows:
            v = "-" if r_[key] is None else f"{r_[key]:.6f}"
            print(f"{r_['bound']:>22} {key}={v:>10} ({r_['seconds']:.3f}s) {r_.get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

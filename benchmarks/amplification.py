"""Evaluate shuffle-model privacy amplification (``python -m benchmarks.amplification``;
``rknn-ray-amplification`` runs the same).

Single point:
    python -m benchmarks.amplification --n 100000 --eps0 4 --delta 1e-6 --json
    python -m benchmarks.amplification --n 100000 --target-eps 0.5 --delta 1e-6 --json
    python -m benchmarks.amplification --mechanism krr --k 10 --n 1000000 --eps0 2 --delta 1e-8 --json
prints a JSON list, one entry per bound: {"bound", "eps" (or "eps0"), "seconds"}
(plus "error" where a bound does not apply, e.g. the closed form out of its range).
--mechanism krr|collision|bitrr lists the bounds for that randomizer (bitrr: the project's
``rr``, per-bit RR with one hot cell on --d bits; its tight form and generic tight, no
variation-ratio form): its own lower bound
("bound": "lower_bound", with a "note" naming the neighbouring pair), its
variation-ratio bound and the generic ones; without it (generic) the output is unchanged.

Grid (table, plots, audit):
    python -m benchmarks.amplification --grid --out runs/amplification
writes results.json, table.txt, amplification-published.{json,md} (see below) and PNGs,
each atomically:
  central_eps_delta*.png   central eps per bound
  granted_eps0.png         the local eps0 each bound grants for a central target
  labeling_error.png       BSVS labeling error of the real RR / Collision at that eps0:
                           theory (mechanism.error_bound) vs simulation (randomize+estimate)
  timing.png               seconds per bound
  audit.png                empirical lower bounds vs claimed upper bounds
Against the published numbers of the anchors (benchmarks/published_amplification.py;
also part of --grid):
    python -m benchmarks.amplification --published --out benchmarks/results
writes amplification-published.{json,md}: each published eps (or granted eps0), the
project's bound of the same math where it has one, its tight and lower bounds, the ratio
and whether the published number is consistent with our lower bound; exit status 1 if a
current row is not.
Audits: binary RR (fast reference, binomial simulation) and the project's real
shuffle / local RR and Collision randomizers (benchmarks/audit.py). Exit
status 1 if any audit raises a red flag (a claimed upper bound below a certified
lower bound) or a current published number is inconsistent with our lower bound.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from rknn_ray.accounting import BOUNDS, variation_ratio_bound
from rknn_ray.accounting.bounds import MechanismLowerBound
# benchmarks.audit (scipy.stats: ~1 s) loads in the functions that audit: --help stays fast
from rknn_ray.accounting.tight import tight_bound
from benchmarks import published_amplification as pub
from rknn_ray.mechanisms.collision import collision_l
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.runio import write_json, write_text

GRID_N = (10**3, 10**4, 10**5, 10**6)
GRID_EPS0 = (0.5, 1.0, 2.0, 4.0, 6.0)
GRID_DELTA = (1e-6, 1e-8)
GRID_TARGETS = (0.5, 1.0)
ORDER = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form",
         "fmt_closed_form_final")
MECHS = ("rr", "collision")
# Real-randomizer audits: (model, n, eps) -- shuffle: eps is the central target the
# mechanism calibrates eps0 for (per delta); local: eps is eps0 itself.
REAL_AUDITS = (("shuffle", 200, 1.0), ("local", 1000, 4.0))
# Client reports randomized per real audit point (Collision costs more than RR per report).
REAL_AUDIT_REPORTS = {"rr": 20_000_000, "collision": 10_000_000}
# Labeling simulation: s queries, one-record clients, reports per (row, bound, mech).
SIM_QUERIES = 2
SIM_REPORTS = 200_000
SIM_MAX_TRIALS = 200
SIM_BETA = 0.05


def _one(fn, *args) -> tuple[float | None, float, str | None]:
    t = time.perf_counter()
    try:
        v = fn(*args)
        return (None if v is None else float(v)), time.perf_counter() - t, None
    except ConfigError as exc:
        return None, time.perf_counter() - t, str(exc)


def mechanism_bounds(mechanism: str = "generic", **params) -> list:
    """The bounds that apply to one randomizer, its own lower bound first.

    Every generic bound applies to k-RR and Collision (both are eps0-LDP); the
    mechanism adds its variation-ratio bound and its own lower bound (an explicit
    neighbouring pair, see MechanismLowerBound's citation, printed as "note").
    """
    if mechanism == "generic":
        # the strongest generic lower bound the project has: the largest of binary RR's
        # and the 3-/4-RR pairs' (each eps0-LDP; binary RR's alone is BOUNDS["lower_bound"],
        # below the 3-/4-RR pairs' at large n: 0.00971 vs 0.01229 at n = 1e6, eps0 = 2)
        return [tight_bound("generic").lower_bound()] + \
            [BOUNDS[name] for name in ORDER if name != "lower_bound"]
    if mechanism == "bitrr":                         # no variation-ratio form: tight's alone
        tight = tight_bound("bitrr", kr=1, d=params["d"])
        return [tight.lower_bound(), tight, tight_bound()] + \
            [BOUNDS[name] for name in ORDER if name != "lower_bound"]
    vr = variation_ratio_bound(mechanism, **params)
    tight_params = {"k": params["k"]} if mechanism == "krr" else {"l": params["l"], "c": params.get("c", 1)}
    if mechanism == "collision" and params.get("c", 1) != 1:
        tight = []                                   # the tight bound covers c = 1 only
        low = MechanismLowerBound(vr)
    else:
        tight = [tight_bound(mechanism, **tight_params)]
        low = tight[0].lower_bound()
    return [low] + tight + [vr] + [BOUNDS[name] for name in ORDER if name != "lower_bound"]


def point(n: int, delta: float, eps0: float | None = None,
          target_eps: float | None = None, rtol: float = 1e-6,
          mechanism: str = "generic", **params) -> list[dict]:
    """One row per bound: central eps for eps0, or local eps0 for target_eps."""
    out = []
    for b in mechanism_bounds(mechanism, **params):
        name = b.name
        if eps0 is not None:
            v, s, err = _one(b.central_eps, eps0, n, delta)
            row = {"bound": name, "eps": v, "seconds": s}
        else:
            v, s, err = _one(lambda t, n_, d: b.local_eps0(t, n_, d, rtol=rtol), target_eps, n, delta)
            row = {"bound": name, "eps0": v, "seconds": s}
        if err:
            row["error"] = err
        if mechanism != "generic" and b.kind == "lower":
            row["note"] = b.citation
        out.append(row)
    return out


# ------------------------------------------------------------------ grid parts

def _labeling(n: int, granted: dict, num_classes: int, rng, sim_max_n: int,
              sim_reports: int) -> dict:
    """Theory vs simulation of the real RR / Collision at the eps0 each bound grants."""
    out = {}
    from benchmarks.audit import bsvs_answers, simulate_labeling_error  # deferred (scipy)
    answers = bsvs_answers(n, SIM_QUERIES, num_classes) if n <= sim_max_n else None
    trials = int(min(SIM_MAX_TRIALS, max(1, sim_reports // n)))
    for b, e0 in granted.items():
        if e0 is None or b == "lower_bound":
            continue
        out[b] = {}
        for name in MECHS:
            mech = build("local", name, MechanismParams(SIM_QUERIES, num_classes, 1, e0))
            if answers is not None:
                out[b][name] = simulate_labeling_error(mech, answers, trials, rng, SIM_BETA)
            else:
                out[b][name] = {"mechanism": name, "eps0": e0, "n": n, "beta": SIM_BETA,
                                "trials": 0, "eta_theory": float(mech.error_bound(SIM_BETA, n)),
                                "eta_over_n": float(mech.error_bound(SIM_BETA, n)) / n,
                                "eta_bernstein": float(mech.error_bound(SIM_BETA, n,
                                                                        method="bernstein")),
                                "label_error_sim": None,
                                "note": f"not simulated: n > sim_max_n={sim_max_n} (time budget)"}
    return out


def _claims(mech, n: int, delta: float) -> dict:
    """Central eps each upper bound claims for this mechanism's eps0, n, delta."""
    e0 = float(mech.local_eps)
    claims = {}
    for b in ("variation_ratio", "clones_numerical", "fmt_closed_form"):
        claims[b] = _one(BOUNDS[b].central_eps, e0, n, delta)[0]
    if mech.name == "collision":
        vr = variation_ratio_bound("collision", c=1, l=mech.l)
        claims["variation_ratio_collision"] = _one(vr.central_eps, e0, n, delta)[0]
    return claims


def real_audits(deltas, rng, scale: float = 1.0, points=REAL_AUDITS) -> list[dict]:
    """Audits of the project's RR and Collision (s = |Y| = 2, k = r = 1), see module doc."""
    from benchmarks.audit import audit_from_statistics, shuffled_pair_statistics  # scipy
    out = []
    for model, n, eps in points:
        for name in MECHS:
            trials = max(1000, int(REAL_AUDIT_REPORTS[name] * scale) // (n + 1))
            if model == "shuffle":        # eps0 is calibrated per delta
                runs = [(d, build("shuffle", name, MechanismParams(2, 2, 1, eps, delta=d,
                                                                   num_clients=n)), [d])
                        for d in deltas]
            else:
                runs = [(None, build("local", name, MechanismParams(2, 2, 1, eps)), list(deltas))]
            for _, mech, ds in runs:
                t0 = time.perf_counter()
                s0, s1 = shuffled_pair_statistics(mech, n, trials, rng)
                secs = time.perf_counter() - t0
                for d in ds:
                    a = audit_from_statistics(mech, n, s0, s1, d, _claims(mech, n, d),
                                              seconds=secs).to_dict()
                    a["target_eps"] = eps if model == "shuffle" else None
                    out.append(a)
    return out


def run_grid(out: str, ns=GRID_N, eps0s=GRID_EPS0, deltas=GRID_DELTA, targets=GRID_TARGETS,
             num_classes: int = 10, audit_trials: int = 1_000_000, real_audit_scale: float = 1.0,
             sim_max_n: int = 100_000, sim_reports: int = SIM_REPORTS,
             seed: int = 0, plots: bool = True, gap: bool = True, published: bool = True) -> dict:
    """The evaluation grid: central eps, granted eps0, labeling error, timings, audits, and
    (``published``) the anchors' published numbers against the project's bounds."""
    from benchmarks.audit import audit_binary_rr  # deferred (scipy)
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(seed)
    t_start = time.perf_counter()
    times = {}
    rows, inverse, audits, violations = [], [], [], []

    def tick(key: str, t0: float) -> None:
        times[key] = times.get(key, 0.0) + time.perf_counter() - t0

    for delta in deltas:
        for n in ns:
            t = time.perf_counter()
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
            tick("bounds", t)
            for tg in targets:
                t = time.perf_counter()
                inv = {r_["bound"]: r_["eps0"] for r_ in point(n, delta, target_eps=tg, rtol=1e-4)}
                tick("bounds", t)
                t = time.perf_counter()
                inverse.append({"n": n, "delta": delta, "target_eps": tg, "eps0": inv,
                                "labeling": _labeling(n, inv, num_classes, rng, sim_max_n,
                                                      sim_reports)})
                tick("labeling", t)
        # reference audit: binary RR at a few points (n where the count fits quickly)
        t = time.perf_counter()
        for n in ns[:3]:
            for e0 in (1.0, 4.0):
                claimed = {b: _one(BOUNDS[b].central_eps, e0, n, delta)[0]
                           for b in ("variation_ratio", "clones_numerical", "fmt_closed_form")}
                a = audit_binary_rr(n, e0, delta, claimed, trials=audit_trials, rng=rng,
                                    pair_eps=BOUNDS["lower_bound"].central_eps(e0, n, delta))
                audits.append(a.to_dict())
        tick("audit_binary_rr", t)
    t = time.perf_counter()
    gap = gap_study(ns=GAP_N if tuple(ns) == GRID_N else ns, eps0s=eps0s, deltas=deltas) if gap else []
    tick("tight_gap", t)
    t = time.perf_counter()
    audits += real_audits(deltas, rng, scale=real_audit_scale)
    tick("audit_real", t)
    t = time.perf_counter()
    pub_rows = _write_published(out) if published else []
    tick("published", t)
    result = {"grid": {"n": list(ns), "eps0": list(eps0s), "delta": list(deltas),
                       "targets": list(targets), "k": 1, "r": 1, "num_classes": num_classes,
                       "sim_queries": SIM_QUERIES, "sim_beta": SIM_BETA, "sim_max_n": sim_max_n},
              "central": rows, "inverse": inverse, "audit": audits, "tight_gap": gap,
              "order_violations": violations,
              "published": pub_rows,
              # an audit's claim below its certified lower bound, or a published upper bound
              # below our lower bound (one of the two is wrong)
              "red_flags": [a for a in audits if a["red_flags"]] + _published_failures(pub_rows),
              "seconds_by_part": times,
              "total_seconds": time.perf_counter() - t_start}
    write_json(os.path.join(out, "results.json"), result)
    pub_table = ""
    if pub_rows:
        pub_table = "\nagainst the published numbers\n" + pub.format_markdown(pub_rows) + "\n"
    write_text(os.path.join(out, "table.txt"),
               format_table(rows, inverse, audits) + "\n\n" + format_gap_table(gap) + "\n" + pub_table)
    if plots:
        make_plots(result, out)
        if gap:
            plot_gap(gap, out)
    result["total_seconds"] = time.perf_counter() - t_start
    return result


# ------------------------------------------------------------------ tight-bound gap study

GAP_N = (10**3, 10**4, 10**5, 10**6, 10**8)
GAP_K = 10


def gap_study(ns=GAP_N, eps0s=GRID_EPS0, deltas=GRID_DELTA, k: int = GAP_K,
              mechs=("krr", "collision", "generic")) -> list[dict]:
    """Per randomizer (k-RR, Collision with the l the project picks for eps0, generic):
    the tight bound, its own lower bound, their ratio, the older bounds, seconds each.
    Generic: the lower bound is the largest of binary RR's and the 3-/4-RR pairs' (each
    eps0-LDP); binary RR's alone is kept as ``binary_rr_lower``."""
    rows = []
    for mech in mechs:
        for delta in deltas:
            for n in ns:
                for e0 in eps0s:
                    params = ({"k": k} if mech == "krr" else
                              {"l": collision_l(e0, 1), "c": 1} if mech == "collision" else {})
                    row = {"mechanism": mech, **params, "n": n, "eps0": e0, "delta": delta}
                    if mech == "generic":
                        tight = tight_bound("generic")
                        v, secs, _ = _one(BOUNDS["lower_bound"].central_eps, e0, n, delta)
                        row["binary_rr_lower"], row["binary_rr_lower_seconds"] = v, secs
                        bounds = [tight.lower_bound(), tight] + [
                            b for b in mechanism_bounds("generic") if b.name != "lower_bound"]
                    else:
                        bounds = mechanism_bounds(mech, **params)
                    for b in bounds:
                        if b.name.startswith("fmt_closed"):
                            continue
                        v, secs, err = _one(b.central_eps, e0, n, delta)
                        key = "tight" if b.name.startswith("tight") else (
                            "variation_ratio" if b.name.startswith("variation_ratio") and
                            mech != "generic" and b.name != "variation_ratio" else b.name)
                        if key == "variation_ratio" and "variation_ratio" in row:
                            continue                  # generic bound already listed
                        row[key], row[f"{key}_seconds"] = v, secs
                    lo, up = row.get("lower_bound"), row.get("tight")
                    row["ratio"] = (up / lo) if lo and up else None
                    rows.append(row)
    return rows


# ------------------------------------------------------------------ exact lower bounds

#: (mechanism, params, n, eps0) of the exact-lower-bound study (issue 50, item 1), delta 1e-8
EXACT_LOWER_POINTS = tuple(
    [("bitrr", {"kr": 1, "d": 20}, n, e0) for n in (10**3, 10**4, 10**5, 10**6) for e0 in (1.0, 2.0, 4.0)]
    + [("collision", {"l": None, "c": 1}, n, e0) for n in (10**4, 10**5, 10**6)
       for e0 in (0.5, 1.0, 2.0, 4.0)]
    + [("krr", {"k": 10}, n, e0) for n in (10**5, 10**6) for e0 in (1.0, 2.0)])


def _count_pair_lower(mech: str, params: dict, n: int, e0: float, delta: float) -> float:
    """The lower bound before issue 50: the larger of the count pairs (no exact sum of the
    whole output beyond n ~ 1e3-1e4)."""
    from rknn_ray.accounting.hockey import eps_for_delta
    from rknn_ray.accounting.shuffled_rr import (bitrr_pairs, collision_pair,
                                                 collision_third_value_pairs, exp_lo, krr_pair)
    if mech == "bitrr":
        pairs = bitrr_pairs(e0, n, params["d"])
    elif mech == "collision":
        pairs = [collision_pair(e0, n, params["l"])] + collision_third_value_pairs(e0, n, params["l"])
    else:
        from rknn_ray.accounting.bounds import _pair_delta
        p, k = exp_lo(e0), params["k"]
        a = 1.0 / (p + k - 1.0)
        pairs = [krr_pair(e0, n, k), _pair_delta(p, a, 1.0 - (p + 1.0) * a, a, n)]
    return max(eps_for_delta(pd, delta, e0, upper=False) for pd in pairs)


def exact_lower_study(points=EXACT_LOWER_POINTS, delta: float = 1e-8) -> list[dict]:
    """Per point: the tight bound, the count-pair lower bound (before), the lower bound with
    the exact n-fold sums (after, ``TightBound.lower``), both ratios and the seconds."""
    rows = []
    for mech, params, n, e0 in points:
        params = dict(params)
        if mech == "collision" and params.get("l") is None:
            params["l"] = collision_l(e0, 1)
        b = tight_bound(mech, **params)
        up, t_up, _ = _one(b.central_eps, e0, n, delta)
        old, t_old, _ = _one(_count_pair_lower, mech, params, n, e0, delta)
        new, t_new, _ = _one(b.lower, e0, n, delta)
        rows.append({"mechanism": mech, **params, "n": n, "eps0": e0, "delta": delta,
                     "tight": up, "count_pair_lower": old, "lower_bound": new,
                     "ratio_before": up / old if old else None, "ratio": up / new if new else None,
                     "tight_seconds": t_up, "lower_seconds": t_new})
        print(f"{mech:>9} {params.get('k', params.get('l', params.get('d'))):>4} {n:>8} {e0:>4} "
              f"tight {up:.6g} before {old:.6g} ({up / old:.4f}) after {new:.6g} "
              f"({up / new:.4f}) {t_new:.1f}s", file=sys.stderr, flush=True)
    return rows


def format_exact_lower_table(rows) -> str:
    delta = f"{rows[0]['delta']:g}" if rows else "-"
    lines = ["tight upper / lower bound, before (count pairs) and after (exact n-fold sums); "
             f"delta {delta}",
             f"{'mech':>9} {'param':>5} {'n':>8} {'eps0':>4} {'tight':>10} {'before':>10} "
             f"{'ratio':>7} {'after':>10} {'ratio':>7} {'s':>6}"]
    for r in rows:
        par = r.get("d") if r["mechanism"] == "bitrr" else r.get("l", r.get("k"))
        lines.append(f"{r['mechanism']:>9} {par:>5} {r['n']:>8} {r['eps0']:>4} {r['tight']:>10.6g} "
                     f"{r['count_pair_lower']:>10.6g} {r['ratio_before']:>7.4f} "
                     f"{r['lower_bound']:>10.6g} {r['ratio']:>7.4f} {r['lower_seconds']:>6.1f}")
    return "\n".join(lines)


# ------------------------------------------------------------------ tight-bound speed

SPEED_N = (10**8, 10**9)
SPEED_EPS0 = (1.0, 2.0, 4.0)
SPEED_MECHS = (("krr", {"k": 10}), ("collision", {"l": 8, "c": 1}), ("collision", {"l": 56, "c": 1}),
               ("bitrr", {"kr": 1, "d": 20}), ("generic", {}))
#: the issues' targets for one tight bound, CPU seconds per n (issue 50: <= 1 s at 1e9)
SPEED_TARGET_S = {10**8: 1.0, 10**9: 1.0}


def speed_study(ns=SPEED_N, eps0s=SPEED_EPS0, delta: float = 1e-8, repeats: int = 3,
                mechs=SPEED_MECHS) -> dict:
    """Seconds of the tight bound per (randomizer, n, eps0): the median of ``repeats`` cold
    calls (each builds its pair afresh), wall and CPU, with its lower bound and the load
    average around it. The targets are judged on CPU seconds: on a shared machine wall time
    grows with the load (the load average says by how much), CPU time much less."""
    load_before, rows = os.getloadavg(), []
    for mech, params in mechs:
        bound = tight_bound(mech, **params)
        for n in ns:
            for e0 in eps0s:
                secs, cpus, eps = [], [], None
                for _ in range(repeats):
                    c0 = time.process_time()
                    eps, s, _err = _one(bound.central_eps, e0, n, delta)
                    cpus.append(time.process_time() - c0)
                    secs.append(s)
                c0 = time.process_time()
                low, _s, _err = _one(bound.lower_bound().central_eps, e0, n, delta)
                low_cpu = time.process_time() - c0
                cpu = float(np.median(cpus))
                rows.append({"mechanism": mech, **params, "n": n, "eps0": e0, "delta": delta,
                             "tight": eps, "lower_bound": low,
                             "ratio": (eps / low) if eps and low else None,
                             "seconds": float(np.median(secs)), "seconds_all": secs,
                             "cpu_seconds": cpu, "cpu_seconds_all": cpus,
                             "lower_cpu_seconds": low_cpu,
                             "within_target": cpu <= SPEED_TARGET_S.get(n, float("inf"))})
    return {"rows": rows, "repeats": repeats, "targets_s": {f"{n:.0e}": t for n, t in SPEED_TARGET_S.items()},
            "load_avg_before": list(load_before), "load_avg_after": list(os.getloadavg()),
            "cpus": os.cpu_count()}


def format_speed_table(res) -> str:
    lines = [f"tight bound wall / CPU seconds (median of {res['repeats']}); load average before "
             f"{res['load_avg_before'][0]:.1f}, after {res['load_avg_after'][0]:.1f} on {res['cpus']} CPUs",
             f"{'mech':>9} {'param':>5} {'n':>7} {'eps0':>4} {'tight':>10} {'lower':>10} {'ratio':>7} "
             f"{'wall_s':>6} {'cpu_s':>6} {'target':>6} {'lower_cpu_s':>11}"]
    for r in res["rows"]:
        param = r.get("k", r.get("l", r.get("d", "-")))
        lines.append(f"{r['mechanism']:>9} {param:>5} {r['n']:>7.0e} {r['eps0']:>4g} "
                     f"{_f(r['tight'], '.6g'):>10} {_f(r['lower_bound'], '.6g'):>10} "
                     f"{_f(r['ratio'], '.4f'):>7} {r['seconds']:>6.2f} {r['cpu_seconds']:>6.2f} "
                     f"{'ok' if r['within_target'] else 'OVER':>6} "
                     f"{_f(r.get('lower_cpu_seconds'), '.2f'):>11}")
    return "\n".join(lines)


def format_gap_table(rows) -> str:
    lines = ["tight bound vs its own lower bound (ratio = tight / lower); seconds of the tight bound",
             f"{'mech':>9} {'param':>5} {'delta':>7} {'n':>9} {'eps0':>4} {'lower':>10} {'tight':>10} "
             f"{'ratio':>7} {'var_ratio':>10} {'clones':>10} {'t_sec':>6}"]
    for r in rows:
        param = r.get("k", r.get("l", "-"))
        lines.append(f"{r['mechanism']:>9} {param:>5} {r['delta']:>7.0e} {r['n']:>9.0e} {r['eps0']:>4g} "
                     f"{_f(r.get('lower_bound'), '.6f'):>10} {_f(r.get('tight'), '.6f'):>10} "
                     f"{_f(r.get('ratio'), '.4f'):>7} {_f(r.get('variation_ratio'), '.6f'):>10} "
                     f"{_f(r.get('clones_numerical'), '.6f'):>10} {_f(r.get('tight_seconds'), '.2f'):>6}")
    return "\n".join(lines)


def plot_gap(rows, out: str) -> None:
    """gap.png: tight / lower per n, one panel per randomizer, a line per eps0 (delta[0])."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    mechs = sorted({r["mechanism"] for r in rows}, key=("krr", "collision", "generic").index)
    d0 = rows[0]["delta"]
    fig, axes = plt.subplots(1, len(mechs), figsize=(4.2 * len(mechs), 3.6), sharey=True)
    for ax, mech in zip(np.atleast_1d(axes), mechs):
        for e0 in sorted({r["eps0"] for r in rows}):
            pts = [(r["n"], r["ratio"]) for r in rows if r["mechanism"] == mech
                   and r["eps0"] == e0 and r["delta"] == d0 and r["ratio"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"eps0={e0:g}")
        ax.axhline(1.05, color="gray", ls="--", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(f"{mech}: tight / lower (delta={d0:.0e})")
        ax.set_xlabel("n")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("upper / lower (eps)")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()              # keeps the x labels inside the PNG
    _save(fig, os.path.join(out, "gap.png"))


# ------------------------------------------------------------------ table

def _f(x, fmt=".4f") -> str:
    return "-" if x is None else format(x, fmt)


def format_table(rows, inverse, audits) -> str:
    cols = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form",
            "fmt_closed_form_final")
    lines = ["central eps by bound (None: closed form out of its validity range)",
             f"{'delta':>7} {'n':>8} {'eps0':>5} " + " ".join(f"{c[:18]:>18}" for c in cols)]
    for r_ in rows:
        vals = " ".join(f"{_f(r_[c], '.5f'):>18}" for c in cols)
        lines.append(f"{r_['delta']:7.0e} {r_['n']:8d} {r_['eps0']:5.1f} {vals}")
    lines += ["", "local eps0 granted for a target central eps"]
    for r_ in inverse:
        vals = " ".join(f"{c}={_f(r_['eps0'][c])}" for c in cols)
        lines.append(f"delta={r_['delta']:.0e} n={r_['n']} target={r_['target_eps']}: {vals}")
    lines += ["", f"BSVS labeling error of the real mechanisms at the granted eps0 "
              f"(s={SIM_QUERIES} queries, one-record clients, k=r=1, beta={SIM_BETA}); "
              "per bucket sup-norm error:",
              "  eta_thm = mechanism.error_bound (paper theorem), eta_bern = Bernstein bound; "
              "sim_q = simulated (1-beta)-quantile; exceed = buckets with error >= eta_thm, "
              "exc_b = >= eta_bern (each allows a fraction beta); label_err = argmax flips",
              f"{'delta':>7} {'n':>8} {'tgt':>4} {'bound':>22} {'mech':>9} {'eps0':>7} "
              f"{'eta_thm':>10} {'eta_bern':>10} {'sim_q':>10} {'exceed':>9} {'exc_b':>9} "
              f"{'label_err':>9} {'trials':>6}"]
    for r_ in inverse:
        for b, per in r_["labeling"].items():
            for name, L in per.items():
                exceed, exc_b = (("-", "-") if L.get("exceed_count") is None else
                                 (f"{L['exceed_count']}/{L['buckets']}",
                                  f"{L['exceed_bernstein_count']}/{L['buckets']}"))
                lines.append(
                    f"{r_['delta']:7.0e} {r_['n']:8d} {r_['target_eps']:4.1f} {b:>22} {name:>9} "
                    f"{L['eps0']:7.3f} {L['eta_theory']:10.1f} {L['eta_bernstein']:10.1f} "
                    f"{_f(L.get('sup_err_q'), '.1f'):>10} {exceed:>9} {exc_b:>9} "
                    f"{_f(L.get('label_error_sim')):>9} {L['trials']:6d}")
    lines += ["", "empirical audits: certified lower bound eps_lb (Clopper-Pearson, "
              "confidence 0.95, threshold chosen on half the trials) vs claimed upper bounds;",
              "  eps_pair = exact eps of the audited neighbouring pair (infinitely many trials "
              "approach it); power = the eps_lb this many trials certify when every count equals "
              "its mean (exact law, best threshold). At delta <= 1e-6 the pair's eps is set by "
              "events far rarer than 1/trials, so power < eps_pair: a clean audit shows the "
              "implementation is not grossly leakier than claimed; it does not prove a bound "
              "tight."]
    for a in audits:
        flag = "RED FLAG: " + ",".join(a["red_flags"]) if a["red_flags"] else "ok"
        claimed = ", ".join(f"{k}={_f(v)}" for k, v in a["claimed_upper"].items())
        what = ("binary RR (reference)" if a["mechanism"] == "binary_rr"
                else f"{a['model']} {a['mechanism']}"
                + (f" (target {a['target_eps']})" if a.get("target_eps") else ""))
        lines.append(f"{what:>28} n={a['n']} eps0={a['eps0']:.3f} delta={a['delta']:.0e} "
                     f"trials={a['trials']}: eps_lb={a['eps_lower_empirical']:.4f} "
                     f"power={_f(a.get('eps_lb_expected'))} eps_pair={_f(a.get('eps_pair_exact'))} "
                     f"| claimed {claimed} | {flag}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ plots

def _save(fig, path: str) -> None:
    """The project's atomic PNG writer (matplotlib is imported only when plotting)."""
    from rknn_ray.plots import save_png  # defers matplotlib
    save_png(fig, path, dpi=110)


COLORS = {"lower_bound": "black", "variation_ratio": "tab:blue", "clones_numerical": "tab:green",
          "fmt_closed_form": "tab:red", "fmt_closed_form_final": "tab:orange"}


def make_plots(result: dict, out: str) -> None:
    from rknn_ray.plots import plt  # defers matplotlib
    rows = result["central"]
    bounds = ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form")
    ns = result["grid"]["n"]
    for delta in result["grid"]["delta"]:
        fig, axes = plt.subplots(1, len(ns), figsize=(3.6 * len(ns), 3.6), sharey=True)
        for ax, n in zip(np.atleast_1d(axes), ns):
            sub = [r_ for r_ in rows if r_["n"] == n and r_["delta"] == delta]
            for b in bounds:
                xs = [r_["eps0"] for r_ in sub if r_[b] is not None]
                ys = [r_[b] for r_ in sub if r_[b] is not None]
                ax.plot(xs, ys, marker="o", color=COLORS[b], label=b)
            ax.set_title(f"n = {n:.0e}")
            ax.set_xlabel("local eps0")
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
        np.atleast_1d(axes)[0].set_ylabel("central eps")
        np.atleast_1d(axes)[0].legend(fontsize=7)
        fig.suptitle(f"central eps per amplification bound (delta = {delta:.0e})")
        fig.tight_layout()
        _save(fig, os.path.join(out, f"central_eps_delta{delta:.0e}.png"))
    _plot_granted(result, out, plt)
    _plot_labeling(result, out, plt)
    _plot_timing(result, out, plt, bounds)
    _plot_audit(result, out, plt)


def _plot_granted(result, out, plt) -> None:
    inv, d0 = result["inverse"], result["grid"]["delta"][0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for b in ("lower_bound", "variation_ratio", "clones_numerical", "fmt_closed_form"):
        for t, ls in zip(result["grid"]["targets"], ("--", "-", ":", "-.")):
            sub = [r_ for r_ in inv if r_["target_eps"] == t and r_["delta"] == d0
                   and r_["eps0"].get(b) is not None]
            ax.plot([r_["n"] for r_ in sub], [r_["eps0"][b] for r_ in sub], marker="o",
                    ls=ls, color=COLORS[b], label=f"{b}, eps={t}")
    ax.set_xscale("log"); ax.set_xlabel("n (shuffled senders)"); ax.set_ylabel("granted local eps0")
    ax.set_title(f"local eps0 granted for a central target (delta = {d0:.0e})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    _save(fig, os.path.join(out, "granted_eps0.png"))


def _plot_labeling(result, out, plt) -> None:
    """Per mechanism and target: eta/n (theorem, dashed), Bernstein (dotted), simulated
    (1-beta)-quantile (solid), per bound; and the simulated label error."""
    inv, d0, targets = result["inverse"], result["grid"]["delta"][0], result["grid"]["targets"]
    bounds = ("variation_ratio", "clones_numerical", "fmt_closed_form")
    fig, axes = plt.subplots(len(MECHS), len(targets) + 1,
                             figsize=(4.2 * (len(targets) + 1), 3.4 * len(MECHS)), squeeze=False)
    for i, name in enumerate(MECHS):
        for j, t in enumerate(targets):
            ax = axes[i, j]
            sub = [r_ for r_ in inv if r_["target_eps"] == t and r_["delta"] == d0]
            for b in bounds:
                L = [(r_["n"], r_["labeling"][b][name]) for r_ in sub if b in r_["labeling"]]
                ax.plot([n for n, _ in L], [x["eta_over_n"] for _, x in L], ls="--",
                        color=COLORS[b], label=f"{b} theorem")
                ax.plot([n for n, _ in L], [x["eta_bernstein"] / n for n, x in L], ls=":",
                        color=COLORS[b], label=f"{b} Bernstein")
                S = [(n, x) for n, x in L if x.get("sup_err_q") is not None]
                ax.plot([n for n, _ in S], [x["sup_err_q"] / n for n, x in S], ls="-",
                        marker="o", color=COLORS[b], label=f"{b} simulated")
            ax.set_xscale("log"); ax.set_yscale("log")
            ax.set_xlabel("n"); ax.set_ylabel("sup error / n per bucket")
            ax.set_title(f"{name}: central eps={t}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == 0 and j == 0:
                ax.legend(fontsize=5.5)
        ax = axes[i, -1]
        for b in bounds:
            for t, ls in zip(targets, ("--", "-", ":", "-.")):
                S = [(r_["n"], r_["labeling"][b][name]["label_error_sim"]) for r_ in inv
                     if r_["target_eps"] == t and r_["delta"] == d0 and b in r_["labeling"]
                     and r_["labeling"][b][name]["label_error_sim"] is not None]
                ax.plot([n for n, _ in S], [e for _, e in S], marker="o", ls=ls,
                        color=COLORS[b], label=f"{b}, eps={t}")
        ax.set_xscale("log"); ax.set_xlabel("n"); ax.set_ylabel("simulated label error")
        ax.set_title(f"{name}: argmax flips", fontsize=9)
        ax.grid(alpha=0.3)
        if i == 0:
            ax.legend(fontsize=5.5)
    fig.suptitle(f"BSVS labeling error at the granted eps0 (s={SIM_QUERIES}, "
                 f"|Y|={result['grid']['num_classes']}, beta={SIM_BETA}, delta={d0:.0e})",
                 fontsize=10)
    fig.tight_layout()
    _save(fig, os.path.join(out, "labeling_error.png"))


def _plot_timing(result, out, plt, bounds) -> None:
    rows = result["central"]
    fig, ax = plt.subplots(figsize=(5, 3.6))
    xs = sorted({r_["n"] for r_ in rows})
    for b in bounds:
        ys = [np.mean([r_["seconds"][b] for r_ in rows if r_["n"] == n]) for n in xs]
        ax.plot(xs, ys, marker="o", color=COLORS[b], label=b)
    ax.set_xscale("log"); ax.set_yscale("log"); ax.set_xlabel("n")
    ax.set_ylabel("seconds per central-eps evaluation")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    _save(fig, os.path.join(out, "timing.png"))


def _plot_audit(result, out, plt) -> None:
    audits = result["audit"]
    if not audits:
        return
    labels = []
    for a in audits:
        who = "binRR ref" if a["mechanism"] == "binary_rr" else f"{a['model']} {a['mechanism']}"
        labels.append(f"{who} n={a['n']} eps0={a['eps0']:.2f} d={a['delta']:.0e}")
    y = np.arange(len(audits))
    fig, ax = plt.subplots(figsize=(8, 0.32 * len(audits) + 2.2))
    ax.scatter([a["eps_lower_empirical"] for a in audits], y, marker="o", color="black",
               zorder=3, label="certified lower bound (audit)")
    ax.scatter([a["eps_pair_exact"] if a.get("eps_pair_exact") is not None else np.nan
                for a in audits], y, marker="x", color="gray", zorder=3,
               label="exact eps of the audited pair")
    ax.scatter([a["eps_lb_expected"] if a.get("eps_lb_expected") is not None else np.nan
                for a in audits], y, marker="|", s=120, color="black", zorder=3,
               label="audit power (expected lower bound)")
    for b, m in (("variation_ratio", "^"), ("clones_numerical", "s"),
                 ("variation_ratio_collision", "v")):
        xs = [a["claimed_upper"].get(b) for a in audits]
        ax.scatter([np.nan if x is None else x for x in xs], y, marker=m, facecolors="none",
                   edgecolors=COLORS.get(b, "tab:purple"), zorder=2, label=f"claimed: {b}")
    flagged = [i for i, a in enumerate(audits) if a["red_flags"]]
    if flagged:
        ax.scatter([audits[i]["eps_lower_empirical"] for i in flagged], flagged, s=150,
                   facecolors="none", edgecolors="red", label="RED FLAG")
    ax.set_yticks(y)
    ax.set_yticklabels(labels, fontsize=6.5)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=0.01)
    top = max([x for a in audits for x in a["claimed_upper"].values() if x is not None]
              + [a["eps_lower_empirical"] for a in audits])
    ax.set_xlim(0.0, 1.4 * top)
    ax.set_xlabel("central eps (symlog: linear below 0.01)")
    ax.set_title("empirical audit: each certified lower bound (dot) must lie\n"
                 "left of the claimed upper bounds", fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    h = 0.32 * len(audits) + 2.2
    fig.legend(*ax.get_legend_handles_labels(), fontsize=7, loc="lower center", ncol=3)
    fig.tight_layout(rect=(0, 0.75 / h, 1, 1))
    _save(fig, os.path.join(out, "audit.png"))


# ------------------------------------------------------------------ CLI

EXAMPLES = """\
examples:
  rknn-ray amplification --n 100000 --eps0 4 --delta 1e-6 --json
  rknn-ray amplification --n 100000 --target-eps 0.5 --delta 1e-6
  python -m benchmarks.amplification --grid --out runs/amplification   # the same command"""


def _write_published(out: str) -> list[dict]:
    """The anchors' published numbers against ours: amplification-published.{json,md} in out."""
    res = pub.compare()
    write_json(os.path.join(out, "amplification-published.json"), res)
    write_text(os.path.join(out, "amplification-published.md"), pub.format_markdown(res) + "\n")
    return res


def _published_failures(rows) -> list[dict]:
    return [{"kind": "published", **r} for r in pub.failures(rows)]


def _published(out: str) -> int:
    """The --published mode: table to stdout and files; 1 if a current row fails its checks."""
    res = _write_published(out)
    print(pub.format_markdown(res))
    bad = pub.failures(res)
    for r in bad:
        print(f"red flag: {r['source']} {r['label']} ({r['quantity']}): not consistent with "
              f"the project's bounds", file=sys.stderr)
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray amplification", description=__doc__,
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, help="number of shuffled senders")
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--eps0", type=float, help="local eps0 of each sender")
    g.add_argument("--target-eps", type=float, help="central eps target: print granted eps0")
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--mechanism", choices=("generic", "krr", "collision", "bitrr"),
                    default="generic",
                    help="randomizer: generic eps0-LDP (default), k-RR (--k), Collision (--l, --c) "
                         "or the project's per-bit RR with one hot cell (bitrr, --d); prints "
                         "every bound that applies to it and its own lower bound")
    ap.add_argument("--d", type=int, help="bitrr: report length in bits (s * |Y|)")
    ap.add_argument("--k", type=int, help="k-RR: number of options")
    ap.add_argument("--l", type=int, help="Collision: Bloom filter length l (default with --eps0: "
                                          "the l a Collision job picks at that eps0)")
    ap.add_argument("--c", type=int, default=1, help="Collision: cells per report c (default 1)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    ap.add_argument("--grid", action="store_true", help="run the evaluation grid")
    ap.add_argument("--gap", action="store_true",
                    help="only the tight-bound gap study (tight / lower per randomizer, n, eps0, "
                         "delta): table.txt, gap.json and gap.png in --out")
    ap.add_argument("--speed", action="store_true",
                    help="time the tight bound at n = 1e8 and 1e9 (k-RR k=10, Collision l=8 and 56, "
                         "generic; eps0 1, 2, 4; delta 1e-8; median of 3): "
                         "amplification-tight-speed.json in --out")
    ap.add_argument("--exact-lower", action="store_true",
                    help="the lower bounds' exact n-fold sums against the count pairs they replace "
                         "(bitrr d=20, Collision, 10-RR; delta 1e-8): "
                         "amplification-exact-lower.json in --out")
    ap.add_argument("--published", action="store_true",
                    help="compare with the anchors' published numbers: "
                         "amplification-published.{json,md} in --out")
    ap.add_argument("--out", default="runs/amplification", help="grid output folder")
    ap.add_argument("--audit-trials", type=int, default=1_000_000,
                    help="trials of the binary-RR reference audit")
    ap.add_argument("--real-audit-scale", type=float, default=1.0,
                    help="scales the reports randomized by the real-mechanism audits "
                         f"(1.0 = {REAL_AUDIT_REPORTS})")
    ap.add_argument("--sim-max-n", type=int, default=100_000,
                    help="largest n whose labeling error is simulated (theory beyond)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.published or args.speed or args.exact_lower:
            try:
                os.makedirs(args.out, exist_ok=True)
                if not os.access(args.out, os.W_OK):
                    raise PermissionError(13, "not writable")
            except OSError as exc:
                print(f"error: --out {args.out}: {exc.strerror}; pass a writable folder",
                      file=sys.stderr)
                return 2
        if args.published:
            return _published(args.out)
        if args.exact_lower:
            rows = exact_lower_study()
            write_json(os.path.join(args.out, "amplification-exact-lower.json"), rows)
            print(format_exact_lower_table(rows))
            return 0
        if args.speed:
            res = speed_study()
            write_json(os.path.join(args.out, "amplification-tight-speed.json"), res)
            print(format_speed_table(res))
            return 0
        if args.gap:
            gap = gap_study()
            os.makedirs(args.out, exist_ok=True)
            write_json(os.path.join(args.out, "gap.json"), gap)
            table = format_gap_table(gap)
            write_text(os.path.join(args.out, "table.txt"), table + "\n")
            if not args.no_plots:
                plot_gap(gap, args.out)
            print(table)
            return 0
        if args.grid:
            res = run_grid(args.out, audit_trials=args.audit_trials,
                           real_audit_scale=args.real_audit_scale, sim_max_n=args.sim_max_n,
                           seed=args.seed, plots=not args.no_plots)
            print(format_table(res["central"], res["inverse"], res["audit"]))
            parts = ", ".join(f"{k} {v:.1f}s" for k, v in res["seconds_by_part"].items())
            print(f"wrote {args.out} in {res['total_seconds']:.1f}s ({parts}); "
                  f"red flags: {len(res['red_flags'])}; order violations: {len(res['order_violations'])}")
            return 1 if res["red_flags"] else 0
        if args.n is None or (args.eps0 is None and args.target_eps is None):
            ap.error("give --n and one of --eps0 / --target-eps (or --grid)")
        n = int(args.n)
        if n != args.n:
            ap.error("--n must be an integer")
        if args.mechanism == "collision" and args.l is None and args.eps0 is not None:
            args.l = collision_l(args.eps0, args.c)     # the l a job picks at this eps0
            print(f"note: --l not given: l = {args.l}, the length a Collision job uses at "
                  f"eps0 = {args.eps0:g}, c = {args.c}", file=sys.stderr)
        if args.k is not None and args.mechanism != "krr":
            print(f"note: --k is k-RR's number of options; --mechanism {args.mechanism} ignores it",
                  file=sys.stderr)
        need = {"krr": ("k", "--k (the number of options), e.g. --k 10"),
                "collision": ("l", "--l (the Bloom filter length), e.g. --l 10; with --eps0 it "
                                   "defaults to the l a job uses"),
                "bitrr": ("d", "--d (the report length s * |Y|), e.g. --d 100")}.get(args.mechanism)
        if need and getattr(args, need[0]) is None:
            print(f"error: --mechanism {args.mechanism} needs {need[1]}", file=sys.stderr)
            return 2
        params = ({"k": args.k} if args.mechanism == "krr" else
                  {"c": args.c, "l": args.l} if args.mechanism == "collision" else
                  {"d": args.d} if args.mechanism == "bitrr" else {})
        rows = point(n, args.delta, eps0=args.eps0, target_eps=args.target_eps,
                     mechanism=args.mechanism, **params)
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

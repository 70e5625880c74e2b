"""T shuffled rounds composed as privacy loss distributions vs T times a round's eps.

    python -m benchmarks.composed_rounds --eps0 3 --n 50000 --delta 1e-6 --rounds 5 [--json]
        [--bound clones_numerical] [--mechanism generic|krr|collision --size K_OR_L]

For T = 1..rounds: the bound's eps for one round at ``delta`` (its hockey-stick), T times it
(basic composition, at T delta), the pld accountant's composition of T rounds (the PLD of the
bound's dominating pair, rknn_ray.accounting.shuffle_pld, at T delta), and a lower bound on
any valid composition: the T-fold composition (optimistic PLD) of an explicit pair of the
same randomizer (shuffled binary RR for generic bounds, shuffled_rr.py's k-RR / Collision
pair for a mechanism-specific one). Each with its seconds.

    python -m benchmarks.composed_rounds --plan CONFIG --clients 1079 --eps 1 --rounds 5 [--json]
        [--set KEY=VALUE ...]

With ``--plan``: for T = 2..rounds, a T-round job of that config (its model, mechanism and
bound, ``--clients`` senders, one record each, ``privacy.eps = --eps``) under the pld
accountant: each round calibrated for eps/T (the split) and calibrated together
(rknn_ray.mechanisms.composed_rounds, what the job runs), each with its round's own eps, its
local eps0 (single-message shuffle) or noise scale (central: the Laplace scale; multi-message:
the Laplace scale of the DLap's variance), and the ledger's composed eps of the T planned
rounds; ``scale_found``: the largest x whose rounds at x times their share compose within eps.
A central config needs a delta (``--set privacy.delta=1e-6``): at delta = 0 the rounds compose
to exactly their sum.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from types import SimpleNamespace

from rknn_ray.accounting.accountants import Composition, event_cost
from rknn_ray.accounting.bound_choice import get_bound
from rknn_ray.accounting.shuffle_pld import (composed_eps, histogram_lower_pair, pld_from_pair,
                                             round_pld, rr_lower_pair)
from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms.composed_rounds import (JOINT_MODELS, MEASURED_MODELS, joint_scale,
                                                 planned_event, round_shares)
from rknn_ray.mechanisms.stage import mechanism_for


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eps0", type=float, default=3.0)
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bound", default="clones_numerical")
    ap.add_argument("--mechanism", default="generic", choices=("generic", "krr", "collision"))
    ap.add_argument("--size", type=int, default=None,
                    help="k of k-RR or l of Collision (c = 1) for --mechanism krr / collision")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--plan", metavar="CONFIG", default=None,
                    help="a job config: eps0 per round, eps/T split vs rounds calibrated together")
    ap.add_argument("--clients", type=int, default=1_079, help="--plan: senders per round")
    ap.add_argument("--classes", type=int, default=10, help="--plan: |Y|")
    ap.add_argument("--eps", type=float, default=1.0, help="--plan: the job's eps")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="--plan: a config override (repeatable)")
    args = ap.parse_args(argv)
    if args.plan is not None and (args.rounds < 2 or args.clients < 2 or not args.eps > 0):
        ap.error("--plan needs --rounds >= 2, --clients >= 2 and --eps > 0")
    if args.rounds < 1 or args.n < 2 or not 0 < args.delta < 1 or not args.eps0 > 0:
        ap.error("need --rounds >= 1, --n >= 2, 0 < --delta < 1 and --eps0 > 0")
    if args.mechanism != "generic" and (args.size is None or args.size < 2):
        ap.error(f"--mechanism {args.mechanism} needs --size >= 2 (k of k-RR, l of Collision)")
    return args


def lower_pair(mechanism: str, eps0: float, n: int, size: int | None):
    """The explicit pair whose composition bounds every valid composition from below."""
    if mechanism == "generic":
        return rr_lower_pair(eps0, n), "shuffled binary RR, the others holding user 1's alternative"
    p = math.exp(eps0)
    a = 1.0 / (p + size - 1.0)
    keep = 1.0 - 1.0 / size if mechanism == "collision" else 1.0
    return (histogram_lower_pair(p, n, a * keep, p * a * keep),
            f"shuffled {mechanism} ({'l' if mechanism == 'collision' else 'k'}={size}), the "
            "others holding user 1's alternative")


def measure(args) -> dict:
    params = {} if args.mechanism == "generic" else (
        {"k": args.size} if args.mechanism == "krr" else {"l": args.size, "c": 1})
    bound = get_bound(args.bound, args.mechanism, **params) if args.mechanism != "generic" \
        else get_bound(args.bound)
    if not getattr(bound, "has_pair", False):
        raise ConfigError("bound", f"{args.bound!r} ({args.mechanism}) names no dominating pair",
                          "use clones_numerical, variation_ratio or tight")
    t = time.perf_counter()
    per_round = bound.central_eps(args.eps0, args.n, args.delta)
    t_bound = time.perf_counter() - t
    t = time.perf_counter()
    upper = round_pld(bound, args.eps0, args.n)
    t_pld = time.perf_counter() - t
    (log_p, log_q), pair_note = lower_pair(args.mechanism, args.eps0, args.n, args.size)
    lower = pld_from_pair(log_p, log_q, pessimistic=False)
    rows = []
    for T in range(1, args.rounds + 1):
        t = time.perf_counter()
        composed = composed_eps(upper, T, T * args.delta)
        seconds = time.perf_counter() - t
        rows.append({"rounds": T, "delta": T * args.delta, "sum_of_rounds": T * per_round,
                     "composed_pld": composed, "lower_composed": composed_eps(lower, T, T * args.delta),
                     "ratio_to_sum": composed / (T * per_round), "seconds_compose": seconds})
    return {"bound": args.bound, "mechanism": args.mechanism, "size": args.size,
            "eps0": args.eps0, "n": args.n, "delta_per_round": args.delta,
            "eps_per_round": per_round, "seconds_bound": t_bound, "seconds_round_pld": t_pld,
            "lower_pair": pair_note, "rows": rows}


def _noise_scale(mech) -> float | None:
    """The round's noise scale where it has one: the central Laplace scale, the multi-message
    DLap's Laplace-equivalent scale (None for single-message shuffle: its eps0 says it)."""
    if mech.model == "central":
        return float(mech.scale)
    cal = getattr(mech, "cal", None)
    return None if cal is None else float(cal.laplace_equivalent_scale)


def _round_row(mech, T: int, delta: float, suffix: str) -> dict:
    """One plan's round: its own eps, eps0 / noise scale, the T rounds' composed eps."""
    rounds = [(planned_event(mech), mech.costing())] * T
    return {f"own_eps_{suffix}": event_cost(*rounds[0])[0],
            f"eps0_{suffix}": getattr(mech, "local_eps", None),
            f"noise_scale_{suffix}": _noise_scale(mech),
            f"composed_{suffix}": Composition("pld").extend(rounds).result(delta)[0]}


def plan(args) -> dict:
    """Each round's eps and noise, and the ledger's composed eps: eps/T split vs together."""
    data = SimpleNamespace(num_clients=args.clients, num_classes=args.classes,
                           max_records_per_client=1)
    rows = []
    for T in range(2, args.rounds + 1):
        cfg = load_config(args.plan, [*args.overrides, f"privacy.eps={args.eps}",
                                      f"rounds.count={T}", "privacy.accountant=pld",
                                      "rounds.budget_split=even"])
        p = cfg.privacy
        which = (p.model, p.mechanism)
        if which not in {**JOINT_MODELS, **MEASURED_MODELS}:
            raise ConfigError("--plan", f"{args.plan} runs {p.model}/{p.mechanism}",
                              "give a single-message shuffle, central or multi-message config")
        if p.model == "central" and p.delta == 0:
            raise ConfigError("--plan", f"{args.plan} states delta = 0: pure-DP rounds compose "
                              "to exactly their sum, the split is the plan",
                              "add --set privacy.delta=1e-6")
        delta = p.delta
        t = time.perf_counter()
        split = mechanism_for(cfg, data, eps=args.eps / T, delta=delta / T, num_queries=1)
        t_split = time.perf_counter() - t
        t = time.perf_counter()
        share = round_shares(cfg, data)[0]
        scale, _ = joint_scale(cfg, data, [(args.eps / T, delta / T)] * T, args.eps, delta)
        t_plan = time.perf_counter() - t
        joint = mechanism_for(cfg, data, eps=share.eps, delta=share.delta, num_queries=1,
                              eps0=share.eps0)
        rows.append({"rounds": T, "scale_found": scale, "together": share.together,
                     **_round_row(split, T, delta, "split"),
                     **_round_row(joint, T, delta, "together"),
                     "seconds_split": t_split, "seconds_plan": t_plan})
    return {"config": args.plan, "overrides": args.overrides, "model": p.model,
            "mechanism": p.mechanism,
            "bound": p.amplification_bound if p.model == "shuffle" else None,
            "clients": args.clients, "eps": args.eps, "delta": delta, "rows": rows}


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        out = plan(args) if args.plan is not None else measure(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    if args.plan is not None:
        bound = f", {out['bound']} bound" if out["bound"] else ""
        print(f"{out['config']}: {out['model']}/{out['mechanism']}{bound}, {out['clients']} "
              f"senders, eps={out['eps']:g}, delta={out['delta']:g}, pld accountant")
        knob = "eps0" if out["rows"][0]["eps0_split"] is not None else "noise scale"
        key = "eps0" if knob == "eps0" else "noise_scale"
        print(f"| T | x found | own eps (eps/T) | {knob} | composed | own eps (together) | "
              f"{knob} | composed | plan s |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in out["rows"]:
            print(f"| {r['rounds']} | {r['scale_found']:.4f} | {r['own_eps_split']:.4f} | "
                  f"{r[key + '_split']:.4f} | {r['composed_split']:.4f} | "
                  f"{r['own_eps_together']:.4f} | {r[key + '_together']:.4f} | "
                  f"{r['composed_together']:.4f} | {r['seconds_plan']:.1f} |")
        return 0
    print(f"{out['bound']} ({out['mechanism']}), eps0={out['eps0']:g}, n={out['n']}, "
          f"delta={out['delta_per_round']:g} per round: eps {out['eps_per_round']:.5f} per round; "
          f"round PLD built in {out['seconds_round_pld']:.2f} s")
    print("| T | delta | T x eps | composed PLD | lower (composed pair) | composed / sum | s |")
    print("|---|---|---|---|---|---|---|")
    for r in out["rows"]:
        print(f"| {r['rounds']} | {r['delta']:.0e} | {r['sum_of_rounds']:.5f} | "
              f"{r['composed_pld']:.5f} | {r['lower_composed']:.5f} | {r['ratio_to_sum']:.3f} | "
              f"{r['seconds_compose']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

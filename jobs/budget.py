"""The privacy budgets that last across jobs: list them, raise one.

    rknn-ray budget [list] [--ledger PATH] [--json]
    rknn-ray budget set DATASET --eps EPS [--delta DELTA] [--allow-lower] [--ledger PATH]
    rknn-ray budget settle JOB_ID [--ledger PATH]

``DATASET`` is the identity printed by ``list``: a source, the pool of records a job's
split loaded, known by per-record fingerprints (any job touching any of its records draws
from its one budget). Budgets are set once, by the first job on a dataset, and change
only here. Identities from older ledgers (``legacy``) move onto a source at its first job;
``set`` on a moved identity says where it went. ``settle`` closes the open reservation of a
job that died without closing it (``kill -9``, a lost node): counted as spent once the ledger
recorded it as started (before its first client randomized), returned only when it never
started. Errors exit 2 and never print a traceback.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from jobs.signals import reader_gone
from rknn_ray.accounting.budget_store import (ENV_PATH, BudgetStore, default_path,
                                              open_reservations, settle, settle_fate)
from rknn_ray.accounting.units import MAX_BUDGET_EPS  # also caps privacy.budget_eps
from rknn_ray.errors import RknnError


EXAMPLES = """\
examples:
  rknn-ray budget                          # every dataset's budget, spent and open reservations
  rknn-ray budget set DATASET --eps 10     # raise a budget (DATASET: an identity list prints)
  rknn-ray budget settle JOB_ID            # close a killed job's reservation
  python -m jobs.budget list --json        # the same command, JSON"""



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray budget", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", nargs="?", default="list", choices=("list", "set", "settle"))
    ap.add_argument("dataset", nargs="?", help="dataset identity (for 'set'), job id (for 'settle')")
    ap.add_argument("--eps", type=float, help="new total eps budget (for 'set')")
    ap.add_argument("--delta", type=float, default=None, help="new total delta budget (for 'set')")
    ap.add_argument("--allow-lower", action="store_true", help="allow lowering a budget")
    ap.add_argument("--ledger", default=None, help="ledger path (default: $RKNN_RAY_LEDGER or "
                                                   "~/.local/share/rknn-ray/ledger.sqlite)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    try:
        code = _run(args)
        sys.stdout.flush()          # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:       # `rknn-ray budget | head`: the reader had what it wanted
        return reader_gone()
    except RknnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:      # never a traceback: say what failed and where to look
        print(f"error: rknn-ray budget failed: {type(exc).__name__}: {exc}. Nothing was "
              "changed unless stated above; please report it with this line", file=sys.stderr)
        return 1


def _run(args) -> int:
    path = os.path.abspath(args.ledger or default_path())
    if not os.path.lexists(path):         # looking never creates a ledger (a mistyped path);
        # a path that exists but is no regular file (a FIFO, a dangling link) is refused below
        if args.action == "set":
            print(f"error: there is no privacy ledger at {path}. Fix: point --ledger or "
                  f"${ENV_PATH} at the ledger your jobs use (a dataset's budget is created by "
                  "its first job)", file=sys.stderr)
            return 2
        print("[]" if args.json else f"privacy ledger: {path} does not exist yet: no job has "
              "recorded anything there")
        return 0
    store = BudgetStore(path)
    if args.action == "settle":
        return _settle(store, args.dataset)
    if args.action == "set":
        if not args.dataset or args.eps is None:
            print("error: 'set' needs DATASET and --eps. Fix: rknn-ray budget set <identity> "
                  "--eps <total>", file=sys.stderr)
            return 2
        target, moved = store.canonical(args.dataset)
        if moved:
            print(f"{args.dataset} was merged into {target} ({moved}); setting {target}")
            args.dataset = target
        current = store.budget(args.dataset)
        if current is None:
            print(f"error: no dataset {args.dataset!r} in {store.path}. Fix: copy an identity "
                  "from `rknn-ray budget list`", file=sys.stderr)
            return 2
        if math.isfinite(args.eps) and args.eps > MAX_BUDGET_EPS:
            print(f"error: --eps {args.eps:g} is above {MAX_BUDGET_EPS:g}: a budget that large "
                  "limits nothing (eps above ~10 already protects little), likely a typo. Fix: "
                  f"pass a total eps of at most {MAX_BUDGET_EPS:g}", file=sys.stderr)
            return 2
        store.set_budget(args.dataset, args.eps, current[1] if args.delta is None else args.delta,
                         allow_lower=args.allow_lower)
        delta = current[1] if args.delta is None else args.delta
        print(f"budget of {args.dataset}: eps {current[0]:g} -> {args.eps:g}, "
              f"delta {current[1]:g} -> {delta:g}")
        return 0
    rows = store.datasets()
    if args.json:
        print(json.dumps(_finite(rows), indent=2, allow_nan=False))
        return 0
    _print_open(open_reservations(store))
    print(f"privacy ledger: {store.path}" + ("  (experiment ledger: cells are independent "
                                             "releases, delta not capped)"
                                             if store.purpose == "experiment" else ""))
    if not rows:
        print("  no dataset has been used yet")
    for d in rows:
        print(f"\n{d['identity']}  {d['description']}\n  budget eps={d['budget']['eps']:g} "
              f"delta={d['budget']['delta']:g}; spent or reserved eps={d['spent']['eps']:.6g} "
              f"delta={d['spent']['delta']:.3g} ({d['released']} release{'' if d['released'] == 1 else 's'}, "
              f"{d['reserved']} open)")
        if d["budget"]["delta"] > 0 and d["released"] + d["reserved"] > 1:
            print("  (the releases' own costs added up; a job with privacy.accountant=pld is "
                  "checked against their pld composition at the budget's delta, at most this)")
        if d["kind"] == "legacy":
            print("  legacy identity (older ledger): moves onto its source at the next job on "
                  "this dataset")
        elif d["min_private"]:
            print(f"  delta stays below 1/n = {1 / d['min_private']:.3g} "
                  f"(n = {d['min_private']} private records, the fewest a job on it used)")
        for m in d["merged"]:
            print(f"  merged from {m['identity']}: {m['reason']}")
        for line in job_lines(d["releases"]):
            print(line)
    return 0


def _finite(obj):
    """JSON has no infinity or NaN (Python would write ``Infinity``, which JSON readers
    refuse): such a number is written as the string "inf", "-inf" or "nan"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def job_lines(releases: list[dict]) -> list[str]:
    """Each job on a dataset in words: what it reserved, spent (its rounds below it), returned,
    or still holds. A job's reservation row (no round) holds what it did not release:
    ``unused`` was returned, ``reserved`` is held, ``released`` was counted as spent (settled)."""
    jobs: dict[str, list[dict]] = {}
    for r in releases:
        jobs.setdefault(r["job_id"], []).append(r)
    lines = []
    for job_id, rows in jobs.items():
        with_delta = any(r["delta"] for r in rows)
        spent, returned, held = (_sums(rows, status) for status in ("released", "unused", "reserved"))
        reserved = tuple(a + b + c for a, b, c in zip(spent, returned, held))
        rounds = sorted((r for r in rows if r["round"] is not None), key=lambda r: r["round"])
        statuses = {r["status"] for r in rows if r["round"] is None}    # the reservation's
        words = [f"reserved {_amount(reserved, with_delta)}",
                 f"spent {_amount(spent, with_delta)} in {len(rounds)} "
                 f"round{'s' if len(rounds) != 1 else ''}"]
        if "unused" in statuses:
            words.append(f"returned {_amount(returned, with_delta)}")
        if "reserved" in statuses:
            words.append(f"still held {_amount(held, with_delta)} (open reservation)")
        note = next((r["note"] for r in rows if r["round"] is None and r["note"]), "")
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(max(r["updated"] for r in rows)))
        lines.append(f"    {when}  job {job_id}: {', '.join(words)}" + (f"; {note}" if note else ""))
        for r in rounds:
            event = (r["event"] or {}).get("type", "") if isinstance(r["event"], dict) else ""
            extra = "" if r["note"] in (None, "", "released") else f"  {r['note']}"
            per_holder = (r.get("extra") or {}).get("holder_records")
            if per_holder:          # multi_record each: one report per kept record
                extra += (f"  (per record; a holder of m kept records at m x eps, at most "
                          f"{per_holder} x {r['eps']:.4g} = {per_holder * r['eps']:.4g})")
            lines.append(f"      round {r['round'] + 1}: released "
                         f"{_amount((r['eps'], r['delta']), with_delta)}  {event}{extra}".rstrip())
    return lines


def _sums(rows: list[dict], status: str) -> tuple[float, float]:
    return (sum(r["eps"] for r in rows if r["status"] == status),
            sum(r["delta"] for r in rows if r["status"] == status))


def _amount(eps_delta: tuple, with_delta: bool) -> str:
    eps, delta = eps_delta
    return f"eps={eps:.4g}" + (f" delta={delta:.3g}" if with_delta else "")


def _age(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 1440}d {m // 60 % 24}h" if m >= 1440 else f"{m // 60}h {m % 60}m" if m >= 60 \
        else f"{m}m {int(seconds) % 60}s"


def _print_open(pending: list[dict]) -> None:
    """Open reservations first: a job killed without closing one holds budget until settled."""
    if not pending:
        return
    print(f"open reservations ({len(pending)}): a job still running, or one that died without "
          "closing its reservation")
    for r in pending:
        state = {True: "driver running", False: "driver gone", None: "driver unknown"}[
            r["driver_alive"]]
        fate = "if settled: " + settle_fate(r)
        print(f"  job {r['job_id']}  age {_age(r['age_s'])}  eps={r['eps']:.4g} "
              f"delta={r['delta']:.3g}  {state}  on {r['identity']} ({fate})")
        if r["driver_alive"] is not True:
            print(f"    settle it: rknn-ray budget settle {r['job_id']}")
    print()


def _settle(store: BudgetStore, job_id: str | None) -> int:
    if not job_id:
        print("error: 'settle' needs a JOB_ID. Fix: rknn-ray budget settle <job id> (open "
              "reservations are listed by `rknn-ray budget`)", file=sys.stderr)
        return 2
    for r in settle(store, job_id):
        print(f"job {job_id} on {r['identity']}: eps={r['eps']:.4g} delta={r['delta']:.3g} "
              f"{settle_fate(r)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The privacy budgets that last across jobs: list them, raise one.

    rknn-ray budget [list] [--ledger PATH] [--json]
    rknn-ray budget set DATASET --eps EPS [--delta DELTA] [--allow-lower] [--ledger PATH]

``DATASET`` is the identity printed by ``list`` (a digest of the private data's
manifest). Budgets are set once, by the first job on a dataset, and change only here.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.errors import RknnError


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray budget", description=__doc__.split("\n\n")[0])
    ap.add_argument("action", nargs="?", default="list", choices=("list", "set"))
    ap.add_argument("dataset", nargs="?", help="dataset identity (for 'set')")
    ap.add_argument("--eps", type=float, help="new total eps budget (for 'set')")
    ap.add_argument("--delta", type=float, default=None, help="new total delta budget (for 'set')")
    ap.add_argument("--allow-lower", action="store_true", help="allow lowering a budget")
    ap.add_argument("--ledger", default=None, help="ledger path (default: $RKNN_RAY_LEDGER or "
                                                   "~/.local/share/rknn-ray/ledger.sqlite)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    args = ap.parse_args(argv)
    try:
        store = BudgetStore(args.ledger)
        if args.action == "set":
            if not args.dataset or args.eps is None:
                print("error: 'set' needs DATASET and --eps. Fix: rknn-ray budget set <identity> "
                      "--eps <total>", file=sys.stderr)
                return 2
            current = store.budget(args.dataset)
            if current is None:
                print(f"error: no dataset {args.dataset!r} in {store.path}. Fix: copy an identity "
                      "from `rknn-ray budget list`", file=sys.stderr)
                return 2
            store.set_budget(args.dataset, args.eps, current[1] if args.delta is None else args.delta,
                             allow_lower=args.allow_lower)
            print(f"budget of {args.dataset}: eps {current[0]:g} -> {args.eps:g}")
            return 0
        rows = store.datasets()
    except RknnError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"privacy ledger: {store.path}")
    if not rows:
        print("  no dataset has been used yet")
    for d in rows:
        print(f"\n{d['identity']}  {d['description']}\n  budget eps={d['budget']['eps']:g} "
              f"delta={d['budget']['delta']:g}; spent or reserved eps={d['spent']['eps']:.6g} "
              f"delta={d['spent']['delta']:.3g} ({d['released']} releases, {d['reserved']} open)")
        for r in d["releases"]:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["updated"]))
            event = (r["event"] or {}).get("type", "") if isinstance(r["event"], dict) else ""
            print(f"    {when}  job {r['job_id']}  round {r['round'] if r['round'] is not None else '-'}"
                  f"  {r['status']:<8}  eps={r['eps']:.4g} delta={r['delta']:.3g}  {event}  {r['note'] or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

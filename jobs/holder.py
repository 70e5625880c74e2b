"""A data holder's commands (no Ray is imported by any of them; only outgoing HTTPS).

    rknn-ray holder keygen --out DIR
    rknn-ray holder join URL --cafile CA --key DIR --data FILE --ledger L --operator-key PUB
                         [--policy-eps-round E] [--policy-eps-total T] [--label COL]
    rknn-ray holder join-many URL --cafile CA --holders-dir DIR --operator-key PUB [...]

``keygen`` writes the holder's Ed25519 key and its own secret (0600) and prints its public
key for the shuffler's registry; ``join`` fetches and verifies the round specification,
charges the holder's own ledger at the eps its own accountant computes, and uploads its
sealed reports (docs/running.md, "A holder off the cluster"); ``join-many`` runs every
holder of a folder in one process, each with its own key and ledger (trials). Errors and
refusals exit 2 with one line (per holder).
"""
from __future__ import annotations

import argparse
import math
import sys

EXAMPLES = """\
examples:
  rknn-ray holder keygen --out holder/
  rknn-ray holder join https://shuffler.example:8443 --cafile ca.pem --key holder/ \\
      --data my_rows.csv --ledger holder/ledger.db --operator-key operator.pub \\
      --policy-eps-round 1 --policy-eps-total 4
  rknn-ray holder join-many https://127.0.0.1:8443 --cafile tls/ca.pem --holders-dir trial/holders \
      --operator-key operator.pub
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rknn-ray holder", epilog=EXAMPLES,
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)
    kg = sub.add_parser("keygen", help="write the holder's key and secret, print its public key")
    kg.add_argument("--out", required=True, help="folder for holder.key and holder.secret")
    jn = sub.add_parser("join", help="answer the round the service at URL publishes")
    jm = sub.add_parser("join-many", help="every holder of a folder answers, each its own key "
                                          "and ledger (trials)")
    for p in (jn, jm):
        p.add_argument("url", help="the service, https://HOST:PORT")
        p.add_argument("--cafile", required=True,
                       help="CA certificate the service's TLS is checked with")
    jn.add_argument("--key", required=True, help="this holder's folder (from keygen)")
    jn.add_argument("--data", required=True, help="this holder's own rows (CSV or Parquet)")
    jn.add_argument("--ledger", required=True, help="this holder's own SQLite ledger")
    jm.add_argument("--holders-dir", required=True,
                    help="one subfolder per holder: key/, data.csv or data.parquet, ledger.db")
    for p in (jn, jm):
        p.add_argument("--operator-key", required=True,
                       help="file with the operator's Ed25519 public key (64 hex digits)")
        p.add_argument("--policy-eps-round", type=float, default=math.inf,
                       help="largest eps spent on one round (default: no per-round limit)")
        p.add_argument("--policy-eps-total", type=float, default=10.0,
                       help="largest eps spent in total (default 10)")
        p.add_argument("--policy-delta-total", type=float, default=1e-5,
                       help="largest delta in total (default 1e-5)")
        p.add_argument("--label", help="the label column (default: the published table's)")
        p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                       help="wait up to this long for the operator to publish a round "
                            "specification (default: ask once)")
        p.add_argument("--assume-collusion", action="store_true",
                       help="charge eps0 (the shuffler colluding) instead of the amplified eps")
    return ap


def main(argv=None) -> int:
    from rknn_ray.errors import RknnError  # defers the library's package to a call of main

    args = parser().parse_args(argv)
    try:
        return {"keygen": _keygen, "join": _join, "join-many": _join_many}[args.action](args)
    except (ValueError, OSError, RuntimeError, RknnError) as exc:   # one-line errors, refusals
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: rknn-ray holder {args.action}: {text}", file=sys.stderr)
        return 2


def _keygen(args) -> int:
    from holder.identity import keygen
    print(keygen(args.out).key_id)
    return 0


def _operator_key(args) -> bytes:
    from pathlib import Path
    path = Path(args.operator_key)
    if not path.is_file():
        raise ValueError(f"--operator-key: no file at {path}; write the operator's Ed25519 "
                         "public key there as 64 hex digits")
    try:
        operator = bytes.fromhex(path.read_text().strip())
    except ValueError:
        operator = b""
    if len(operator) != 32:
        raise ValueError(f"--operator-key: {path} is not 64 hex digits (an Ed25519 public key)")
    return operator


def _policy(args):
    from holder.ledger import Policy
    return Policy(args.policy_eps_round, args.policy_eps_total, args.policy_delta_total)


def _join(args) -> int:
    from collections import Counter

    from holder.identity import load
    from holder.join import join
    from sealing.upload_wire import SUCCESS

    done = join(args.url, args.cafile, load(args.key), args.key, args.data, args.ledger,
                _operator_key(args), _policy(args), args.label, args.assume_collusion, args.wait)
    counts = Counter(done.codes)
    spent = (f"charged eps={done.eps:.6g}" if done.charged
             else "a retry: charged when first answered")
    print(f"rknn-ray holder: {done.spec.job_id} round {done.spec.round}: "
          f"{len(done.codes)} reports, {dict(sorted(counts.items()))}; {spent}", flush=True)
    if not all(c in SUCCESS for c in done.codes):
        print(f"error: rknn-ray holder join: the service refused reports: "
              f"{dict(sorted(counts.items()))}", file=sys.stderr)
        return 2
    return 0


def _join_many(args) -> int:
    from holder.many import join_many
    done = join_many(args.url, args.cafile, args.holders_dir, _operator_key(args), _policy(args),
                     args.label, args.assume_collusion, args.wait)
    for line in done.refused:
        print(f"error: rknn-ray holder join-many: {line}", file=sys.stderr)
    print(f"rknn-ray holder: {done.holders} holders: {done.charged} charged, {done.retried} "
          f"retries, {len(done.refused)} refused; reports {dict(sorted(done.codes.items()))}",
          flush=True)
    return 2 if done.refused else 0


if __name__ == "__main__":
    sys.exit(main())

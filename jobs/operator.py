"""The operator's own key (no Ray is imported here).

    rknn-ray operator keygen --out FILE

Writes the operator's Ed25519 key (PKCS#8 PEM, 0600) and ``FILE.pub``, and prints the public
key: holders and the shuffler service are given that file with ``--operator-key``; the job
(``cluster.holders: remote``) names the private one in ``remote.operator_key``.
"""
from __future__ import annotations

import argparse
import sys


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rknn-ray operator", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)
    kg = sub.add_parser("keygen", help="write the operator's signing key, print its public key")
    kg.add_argument("--out", required=True, help="key file to write (refuses to overwrite)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    from rknn_ray.errors import DataError
    from rknn_ray.remote.operator_key import public_file, public_hex, save_operator_key
    try:
        key = save_operator_key(args.out)
    except (DataError, OSError) as exc:
        print(f"error: rknn-ray operator keygen: {str(exc).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    print(public_hex(key))
    print(f"public key also in {public_file(args.out)} (give it to holders and the shuffler)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

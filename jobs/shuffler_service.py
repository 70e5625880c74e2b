"""The shuffler service's commands (no Ray is imported by any of them).

    rknn-ray shuffler keygen --out FILE
    rknn-ray shuffler cert --out DIR [--host 127.0.0.1 ...]
    rknn-ray shuffler serve --operator-key FILE --holders FILE --key FILE --cert FILE
                            --cert-key FILE --store DIR --port N [--host 127.0.0.1]
                            [--spec FILE [--file FILE ...]]

``keygen`` writes the shuffler's X25519 HPKE layer key (0600) and prints its public half
for the operator's specification; ``cert`` makes a private CA and a server certificate for
trials; ``serve`` runs the HTTPS service (docs/running.md): with ``--spec`` for that one
specification (its store is ``--store`` itself), else it waits for the operator's job to
publish one (``POST /spec``; kept under ``--store``, and served again after a restart). Errors exit 2 with one line.
"""
from __future__ import annotations

import argparse
import sys

EXAMPLES = """\
examples:
  rknn-ray shuffler keygen --out shuffler.key
  rknn-ray shuffler cert --out tls/
  rknn-ray shuffler serve --operator-key operator.pub --holders holders.txt \\
      --key shuffler.key --cert tls/server.pem --cert-key tls/server.key --store store/ --port 8443
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rknn-ray shuffler", epilog=EXAMPLES,
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="action", metavar="ACTION", required=True)
    kg = sub.add_parser("keygen", help="write the shuffler's HPKE layer key, print its public key")
    kg.add_argument("--out", required=True, help="key file to write (refuses to overwrite)")
    ce = sub.add_parser("cert", help="a private CA and a server certificate for trials")
    ce.add_argument("--out", required=True, help="folder for ca.pem, server.pem, server.key")
    ce.add_argument("--host", action="append", help="IP or DNS name the certificate names "
                                                     "(repeatable; default 127.0.0.1 and localhost)")
    sv = sub.add_parser("serve", help="run the HTTPS shuffler service")
    sv.add_argument("--spec", help="a signed round specification to serve from the start "
                                   "(default: wait for the operator's job to publish one)")
    sv.add_argument("--operator-key", required=True,
                    help="the operator's Ed25519 public key, 64 hex digits (verifies the "
                         "specification and batch fetches)")
    sv.add_argument("--holders", required=True, help="registered holders: one hex Ed25519 public "
                                                      "key per line (then, optionally, its record count)")
    sv.add_argument("--key", help="this shuffler's HPKE key (from keygen)")
    sv.add_argument("--relay", action="store_true",
                    help="no key: relay the local and central models' reports (sealed for the "
                         "server only; checked, counted and stored alike, but not anonymized)")
    sv.add_argument("--cert", required=True, help="TLS certificate chain (PEM)")
    sv.add_argument("--cert-key", required=True, help="TLS private key (PEM)")
    sv.add_argument("--store", required=True, help="folder of the store (one per specification)")
    sv.add_argument("--port", required=True, type=int, help="TCP port (0: any free one)")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--file", action="append", default=[],
                    help="a file the specification names by digest (the published encoder's "
                         "predictor.json, encoder.npz), served at /files/<sha256> (repeatable)")
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return {"keygen": _keygen, "cert": _cert, "serve": _serve}[args.action](args)
    except (ValueError, OSError) as exc:      # our one-line errors, and unreadable files
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: rknn-ray shuffler {args.action}: {text}", file=sys.stderr)
        return 2


def _keygen(args) -> int:
    from shuffler.service_files import save_layer_key
    pair = save_layer_key(args.out)
    print(pair.public_bytes().hex())
    return 0


def _cert(args) -> int:
    from shuffler.certs import make_certs
    files = make_certs(args.out, tuple(args.host or ("127.0.0.1", "localhost")))
    print(f"CA {files.ca} (give to clients); certificate {files.cert}, key {files.key} (the service's)")
    return 0


def _serve(args) -> int:
    from pathlib import Path

    from shuffler.service import Host, serve, bind, tls_context
    from shuffler.service_files import load_layer_key, read_holders, read_operator_key

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is not a TCP port (0..65535)")
    operator = read_operator_key(args.operator_key)
    holders = read_holders(args.holders)
    if bool(args.key) == bool(args.relay):
        raise ValueError("give --key (a shuffler: the shuffle model) or --relay (local and "
                         "central models), one of the two")
    keypair = load_layer_key(args.key) if args.key else None
    ctx = tls_context(args.cert, args.cert_key)
    host = Host(operator, holders, keypair, Path(args.store))
    Path(args.store).mkdir(parents=True, exist_ok=True)
    if args.spec:
        spec_path = Path(args.spec)
        if not spec_path.is_file():
            raise ValueError(f"--spec: no file at {spec_path}; give the operator's signed "
                             "specification")
        from sealing.round_spec import verify
        files = _named_files(verify(spec_path.read_bytes(), operator), args.file)
        host.publish(spec_path.read_bytes(), store=Path(args.store), files=files)
    elif args.file:
        raise ValueError("--file is read with --spec; a published specification's files come "
                         "with it (POST /files)")
    else:
        host.resume()
    sock = bind(args.host, args.port)
    serve(host, ctx, sock)
    return 0


def _named_files(spec, paths: list) -> dict:
    """--file contents by SHA-256; each must be one the specification names (by digest)."""
    import hashlib
    from pathlib import Path
    named = {e.sha256: e.name for e in spec.encoder}
    files = {}
    for path in map(Path, paths):
        if not path.is_file():
            raise ValueError(f"--file: no file at {path}")
        body = path.read_bytes()
        digest = hashlib.sha256(body).hexdigest()
        if digest not in named:
            raise ValueError(f"--file: {path} is not a file the specification names (its "
                             "SHA-256 matches none of its encoder files); give the published ones")
        files[digest] = body
    return files


if __name__ == "__main__":
    sys.exit(main())

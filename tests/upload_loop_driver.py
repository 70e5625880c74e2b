"""A holder uploading many reports in a loop (tests/test_shuffler_service.py's kill -9 test).

    python tests/upload_loop_driver.py URL CAFILE KEYFILE WORLD_FOLDER N LOG

Seals N reports (report id i = SHA-256(holder key | i)[:16], so retries carry the same ids),
uploads them 5 per request with idempotent retries, and writes one line per answered report
(``report-id-hex code``) to LOG, flushed as each answer arrives.
"""
import hashlib
import sys

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sealing.hpke_report import seal_report
from sealing.round_spec import RoundSpec, SIGNATURE_LEN
from sealing.upload_client import Connection, send_entries, sign_reports


def main(url, cafile, keyfile, folder, n, log):
    raw = bytes.fromhex(open(keyfile).read().strip())
    key = Ed25519PrivateKey.from_private_bytes(raw)
    spec = RoundSpec.from_bytes(open(f"{folder}/round.spec", "rb").read()[:-SIGNATURE_LEN])
    spec_hash = spec.content_hash()
    reports = []
    for i in range(int(n)):
        rid = hashlib.sha256(raw + i.to_bytes(8, "little")).digest()[:16]
        payload = i.to_bytes(4, "little") * (spec.payload_len // 4)
        reports.append(seal_report(spec.server_key, payload, spec_hash, rid, list(spec.shuffler_keys)))
    out = open(log, "a")

    def answered(entries, codes):
        for e, c in zip(entries, codes):
            out.write(f"{e.report[34:50].hex()} {c}\n")
        out.flush()
    conn = Connection(url, cafile, timeout=10)
    send_entries(conn, sign_reports(key, reports), per_request=5, retries=60, backoff=0.05,
                 on_answer=answered)
    out.close()


if __name__ == "__main__":
    main(*sys.argv[1:])

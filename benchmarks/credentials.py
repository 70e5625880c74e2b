"""What sender credentials cost next to sealing: CPU time per message (median of repeats).

    python -m benchmarks.credentials [--messages 100000] [--repeats 3] [--json OUT]

Measures thread CPU time (robust on a shared machine, unlike wall time) of: sealing
(X25519 + ChaCha20-Poly1305 per message), signing (per-client key derivation + tag) and
admission (verification, allowance, duplicate slots), and prints a table with the ratios.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from rknn_ray.runio import write_json


def measure(messages: int, repeats: int) -> dict:
    # defers cryptography, pyarrow
    from sealing.credentials import CredentialIssuer, SenderAdmission, with_credentials
    from sealing.envelope import RoundContext, seal_batch, to_arrow
    from server.keys import ServerKeyPair  # defers cryptography

    ctx = RoundContext("bench-credentials", 0)
    pk = ServerKeyPair.generate().public_bytes()
    payloads = np.random.default_rng(0).integers(0, 256, (messages, 16), dtype=np.uint8)
    senders = np.arange(messages, dtype=np.int64)
    issuer = CredentialIssuer(ctx.job_id)
    cred = issuer.shard_credential(0, 0, messages)
    out = {"seal": [], "sign": [], "admit": []}
    for _ in range(repeats):
        t = time.thread_time()
        sealed = seal_batch(pk, payloads, ctx, pad_to=16)
        out["seal"].append(time.thread_time() - t)
        t = time.thread_time()
        seqs, tags = cred.sign(ctx, senders, sealed)
        out["sign"].append(time.thread_time() - t)
        batch = with_credentials(to_arrow(sealed, senders), seqs, tags)
        adm = SenderAdmission(issuer.verifier([(0, messages)]), ctx, 1, sealed.shape[1])
        t = time.thread_time()
        _, kept, _ = adm.admit(batch)
        out["admit"].append(time.thread_time() - t)
        assert kept.size == messages
    med = {k: statistics.median(v) for k, v in out.items()}
    return {"messages": messages, "repeats": repeats,
            "cpu_s_median": med,
            "us_per_message": {k: 1e6 * v / messages for k, v in med.items()},
            "ratio_to_seal": {k: med[k] / med["seal"] for k in ("sign", "admit")}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    res = measure(args.messages, args.repeats)
    print(f"{res['messages']} messages, CPU time, median of {res['repeats']}")
    print(f"{'step':<8} {'s':>8} {'us/msg':>8} {'x seal':>8}")
    for k in ("seal", "sign", "admit"):
        ratio = 1.0 if k == "seal" else res["ratio_to_seal"][k]
        print(f"{k:<8} {res['cpu_s_median'][k]:8.2f} {res['us_per_message'][k]:8.1f} {ratio:8.2f}")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

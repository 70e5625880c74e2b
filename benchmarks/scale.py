"""One shuffle round at scale: single message, Collision, sealed reports.

    python -m benchmarks.scale --clients 100000 [--json] [--out bench_out/scale]

Runs the same library code the actors run (ClientShard: reverse k-NN, randomize,
seal; Shuffler: ShufflePool with a CSPRNG permutation; Server: ReportOpener,
well-formedness checks, Collision estimator) in this one process, so every stage
is timed on its own, one record per client on a synthetic Gaussian mixture
(s = |Y| = 10, k = 1, central target eps = 1, delta = 1e-6). The *crypto floor*
is the bare cost of the primitives alone (per message: X25519 key generation and
exchange, HKDF-SHA256, ChaCha20-Poly1305 seal; and the server's exchange, HKDF
and open), measured in the same run; ``ratio_to_floor`` = whole round / floor.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np


def opening_floor_seconds(num_messages: int, payload_len: int, sample: int = 2000) -> float:
    """CPU seconds of the server-side primitives per message (exchange, HKDF, AEAD open)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    n = max(1, min(sample, num_messages))
    server = X25519PrivateKey.generate()
    server_pub = server.public_key().public_bytes_raw()
    items = []
    for _ in range(n):
        eph = X25519PrivateKey.generate()
        eph_pub = eph.public_key()
        key = HKDF(hashes.SHA256(), 32, salt=eph_pub.public_bytes_raw() + server_pub,
                   info=b"floor").derive(eph.exchange(server.public_key()))
        items.append((eph_pub, ChaCha20Poly1305(key).encrypt(bytes(12), os.urandom(payload_len),
                                                             b"aad")))
    t0 = time.thread_time()
    for eph_pub, ct in items:
        key = HKDF(hashes.SHA256(), 32, salt=eph_pub.public_bytes_raw() + server_pub,
                   info=b"floor").derive(server.exchange(eph_pub))
        ChaCha20Poly1305(key).decrypt(bytes(12), ct, b"aad")
    return (time.thread_time() - t0) * num_messages / n


def run(clients: int, batch: int = 20000, seed: int = 0) -> dict:
    from rknn_ray.data import gaussian_mixture
    from rknn_ray.mechanisms import MechanismParams, build
    from rknn_ray.queries import select_queries
    from rknn_ray.rknn import build_answers
    from rknn_ray.rng import derived_generator, new_client_secret
    from sealing.envelope import RoundContext, crypto_floor_seconds, seal_batch, to_arrow, from_arrow
    from server.keys import ServerKeyPair
    from server.opening import ReportOpener
    from shuffler.pool import ShufflePool

    stages: dict[str, float] = {}

    def timed(name, fn, *a, **kw):
        t = time.perf_counter()
        out = fn(*a, **kw)
        stages[name] = stages.get(name, 0.0) + time.perf_counter() - t
        return out

    t_all = time.perf_counter()
    ds = timed("data", gaussian_mixture, num_samples=clients + 2000, num_classes=10, dim=32,
               seed=seed)
    x, y = ds.train_x, ds.train_y
    qs = timed("queries", select_queries, x[:2000], 10, restarts=1, seed=seed)
    priv_x, priv_y = x[2000:], y[2000:]
    ans = timed("rknn", build_answers, priv_x, priv_y, np.arange(clients), qs.features, 1, 10)
    mech = build("shuffle", "collision", MechanismParams(10, 10, 1, 1.0, delta=1e-6,
                                                         num_clients=clients))
    keys = ServerKeyPair.generate()
    ctx = RoundContext(job_id="scale-bench", round_id=0)
    secret = new_client_secret()
    pool = ShufflePool(mech.min_senders())
    for b, lo in enumerate(range(0, clients, batch)):
        part = ans.select(np.arange(lo, min(lo + batch, clients)))
        msgs = timed("randomize", mech.randomize, part, derived_generator(secret, ctx.job_id, 0, b))
        ct = timed("seal", seal_batch, keys.public_bytes(), msgs.payloads, ctx)
        timed("shuffle", pool.add, to_arrow(ct, msgs.senders))
    senders = pool.num_senders
    opener = ReportOpener(keys, ctx, payload_len=mech.message_size)
    payloads, rejected = [], {}
    t = time.perf_counter()
    released = list(pool.release())
    stages["shuffle"] += time.perf_counter() - t
    for rb in released:
        ct, _ = from_arrow(rb)
        p, rej = timed("open", opener.open_batch, ct)
        ok = timed("decode", mech.well_formed, p)
        payloads.append(p[ok])
        for k, v in rej.items():
            rejected[k] = rejected.get(k, 0) + v
    mech.senders_shuffled = senders
    est = timed("decode", mech.estimate, np.concatenate(payloads), senders)
    wall = time.perf_counter() - t_all
    floor = crypto_floor_seconds(clients, mech.message_size) + \
        opening_floor_seconds(clients, mech.message_size)
    err = np.abs(est - ans.counts())
    return {"clients": clients, "wall_s": wall, "stages_s": stages, "crypto_floor_s": floor,
            "ratio_to_floor": wall / floor, "crypto_stages_s": stages["seal"] + stages["open"],
            "crypto_ratio": (stages["seal"] + stages["open"]) / floor,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "senders": int(senders), "messages": int(sum(len(p) for p in payloads)),
            "rejected": rejected, "eps0": mech.local_eps, "eps": mech.guarantee().eps,
            "max_abs_count_error": float(err.max()), "mean_abs_count_error": float(err.mean())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100000)
    ap.add_argument("--batch", type=int, default=20000)
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--out", default=None, help="also write result.json into this folder")
    args = ap.parse_args(argv)
    res = run(args.clients, args.batch)
    if args.out:
        from rknn_ray.runio import write_json
        write_json(os.path.join(args.out, "scale.json"), res)
    if args.json:
        print(json.dumps(res))
    else:
        print("| stage | seconds |\n|---|---|")
        for k, v in res["stages_s"].items():
            print(f"| {k} | {v:.2f} |")
        print(f"| **round (wall)** | {res['wall_s']:.2f} |\n| crypto floor | {res['crypto_floor_s']:.2f} |")
        print(f"ratio to floor {res['ratio_to_floor']:.2f}; seal+open / floor "
              f"{res['crypto_ratio']:.2f}; peak RSS {res['peak_rss_mb']:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

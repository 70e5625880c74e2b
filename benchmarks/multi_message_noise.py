"""Noise messages per cell of the multi-message protocol: Poisson vs negative-binomial flooding.

    python -m benchmarks.multi_message_noise [--json]

For each (eps, delta, k r) row it calibrates the protocol twice with the exact PLD
accountant (rknn_ray.accounting.multi_message): flooding restricted to Poisson and the
calibration's own choice among Poisson and NB(r) laws. Both reach the same (eps, delta) with the same DLap noise (same error);
each flood mean is the smallest (to 2%) of its law that does. Per cell, all clients
together: 2p/(1-p) geometric-share messages + 2 mu flooding messages; this number does not
depend on n or d. Per client: times d / m (m = honest_fraction * n noise senders).
"""
from __future__ import annotations

import argparse
import json
import time

from rknn_ray.accounting.multi_message import POISSON, calibrate_multi_message

ROWS = [(1.0, 1e-6, 1), (0.5, 1e-6, 1), (2.0, 1e-6, 1), (1.0, 1e-4, 1), (1.0, 1e-8, 1),
        (1.0, 1e-6, 2)]


def per_cell(cal) -> float:
    p = cal.dlap_p
    return 2 * p / (1 - p) + 2 * cal.flood_mean_total


def measure(rows=None, n=60_000, honest_fraction=0.5, s=488, classes=10) -> list[dict]:
    """One dict per (eps, delta, k r) row (default ``ROWS``) at n clients and d = s x classes."""
    rows = ROWS if rows is None else rows
    m, d = int(honest_fraction * n), s * classes
    out = []
    for eps, delta, kr in rows:
        t0 = time.process_time()
        before = calibrate_multi_message(eps, delta, m, 2 * kr, d, flood_shapes=(POISSON,))
        after = calibrate_multi_message(eps, delta, m, 2 * kr, d)
        out.append({"eps": eps, "delta": delta, "kr": kr, "dlap_p": after.dlap_p,
                    "error_variance": after.error_variance,
                    "poisson_mu": before.flood_mean_total, "poisson_per_cell": per_cell(before),
                    "flood_shape": after.flood_shape, "mu": after.flood_mean_total,
                    "per_cell": per_cell(after), "ratio": per_cell(before) / per_cell(after),
                    "per_client_before": before.noise_messages_per_client,
                    "per_client_after": after.noise_messages_per_client,
                    "n": n, "m": m, "d": d, "cpu_s": time.process_time() - t0})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = measure()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("| eps | delta | k r | DLap var | Poisson mu | per cell before | NB r | NB mu | "
          "per cell after | ratio | per client (n=60k, d=4,880) before / after |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['eps']:g} | {r['delta']:g} | {r['kr']} | {r['error_variance']:.2f} | "
              f"{r['poisson_mu']:.0f} | {r['poisson_per_cell']:.0f} | {r['flood_shape']:g} | "
              f"{r['mu']:.0f} | {r['per_cell']:.0f} | {r['ratio']:.2f} | "
              f"{r['per_client_before']:.1f} / {r['per_client_after']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

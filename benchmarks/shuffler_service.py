"""The shuffler service's intake rate and memory: one load process, many holder keys.

    python -m benchmarks.shuffler_service [--sizes 1000 10000] [--holders 500]
                                          [--per-request 100] [--json OUT]

For each size, starts ``rknn-ray shuffler serve`` as its own process (ray and server
unimportable, TLS on 127.0.0.1, a fresh store), seals and signs that many two-layer
reports spread over ``--holders`` registered keys (not timed), then uploads them over one
keep-alive connection, ``--per-request`` per request, and times it (wall clock: every
request is committed with fsync before its answer). After the deadline it times the
operator's fetch of the released batch. Wall time depends on what else the machine
runs; the service's own CPU time per report (psutil) is the steadier number. The service's peak RSS comes from psutil, sampled
every 20 ms, and the kernel's high-water mark (VmHWM).
"""
from __future__ import annotations

import argparse
import math
import tempfile
import threading
from collections import Counter
import time
from pathlib import Path

import psutil
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from benchmarks.shuffler_world import blocked_attempts, make_world, start_service, stop_all
from rknn_ray.runio import write_json
from sealing.hpke_report import seal_report
from sealing.upload_client import Connection, fetch_batch, send_entries, sign_reports

PAYLOAD_LEN = 24
SECONDS_PER_REPORT = 0.002        # upload budget per report the window is sized by (plus sealing)


def seal_seconds(probe: int = 100) -> float:
    """Seconds to seal and sign one two-layer report here now (the window must outlast it)."""
    keys = [X25519PrivateKey.generate().public_key().public_bytes_raw() for _ in range(2)]
    holder = Ed25519PrivateKey.generate()
    t = time.perf_counter()
    sign_reports(holder, [seal_report(keys[0], bytes(PAYLOAD_LEN), bytes(32), bytes(16), keys[1:])
                          for _ in range(probe)])
    return (time.perf_counter() - t) / probe


class PeakRss(threading.Thread):
    """The largest RSS of a process seen while running (sampled)."""

    def __init__(self, pid: int, every: float = 0.02):
        super().__init__(daemon=True)
        self.proc, self.every, self.peak, self.done = psutil.Process(pid), every, 0, False

    def run(self):
        while not self.done:
            try:
                self.peak = max(self.peak, self.proc.memory_info().rss)
            except psutil.Error:
                return
            time.sleep(self.every)


def hwm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def measure(n: int, holders: int, per_request: int, folder: Path) -> dict:
    holders = min(holders, n)
    world = make_world(folder, holders=holders, allowance=math.ceil(n / holders), floor=1,
                       payload_len=PAYLOAD_LEN,
                       closes_in=10 + n * (2 * seal_seconds() + SECONDS_PER_REPORT))
    try:
        proc, url = start_service(world)
        idle_rss = psutil.Process(proc.pid).memory_info().rss
        t = time.perf_counter()
        entries = []
        for h, key in enumerate(world.holders):
            count = len(range(h, n, holders))
            entries += sign_reports(key, [world.seal(bytes([h % 256]) * PAYLOAD_LEN) for _ in range(count)])
        prep_s = time.perf_counter() - t
        sampler = PeakRss(proc.pid)
        sampler.start()
        conn = Connection(url, world.certs.ca)
        cpu = psutil.Process(proc.pid).cpu_times()
        t = time.perf_counter()
        codes = send_entries(conn, entries, per_request=per_request)
        upload_s = time.perf_counter() - t
        after = psutil.Process(proc.pid).cpu_times()
        service_cpu_s = (after.user + after.system) - (cpu.user + cpu.system)
        conn.close()
        upload_peak = sampler.peak
        time.sleep(max(0.0, world.spec.deadline - time.time()) + 0.2)
        t = time.perf_counter()
        header, records = fetch_batch(url, world.certs.ca, world.operator, world.spec_hash)
        released = sum(1 for _ in records)
        fetch_s = time.perf_counter() - t
        sampler.done = True
        sampler.join()
        return {"reports": n, "holders": holders, "per_request": per_request,
                "accepted": codes.count("accepted"), "codes": dict(Counter(codes)), "seal_and_sign_s": prep_s,
                "upload_s": upload_s, "accepted_per_s": codes.count("accepted") / upload_s,
                "service_cpu_s": service_cpu_s, "service_cpu_us_per_report": 1e6 * service_cpu_s / n,
                "batch_fetch_s": fetch_s, "batch_records": released,
                "batch_bytes": 54 + released * (4 + header.record_len),
                "service_idle_rss_mib": idle_rss / 2**20,
                "service_peak_rss_upload_mib": upload_peak / 2**20,
                "service_peak_rss_mib": max(sampler.peak, hwm_bytes(proc.pid)) / 2**20,
                "ray_or_server_import_attempts": len(blocked_attempts(world))}
    finally:
        stop_all(world)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--holders", type=int, default=500, help="registered holder keys (the load spreads over them)")
    ap.add_argument("--per-request", type=int, default=100)
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="shuffler-bench-") as tmp:
        for n in args.sizes:
            rows.append(measure(n, args.holders, args.per_request, Path(tmp) / str(n)))
    print(f"{'reports':>8} {'holders':>7} {'accepted':>8} {'upload s':>8} {'accepted/s':>10} "
          f"{'CPU us/rep':>10} {'fetch s':>7} {'idle MiB':>8} {'peak MiB':>8}")
    for r in rows:
        print(f"{r['reports']:>8} {r['holders']:>7} {r['accepted']:>8} {r['upload_s']:>8.2f} "
              f"{r['accepted_per_s']:>10.0f} {r['service_cpu_us_per_report']:>10.0f} {r['batch_fetch_s']:>7.2f} "
              f"{r['service_idle_rss_mib']:>8.1f} {r['service_peak_rss_mib']:>8.1f}")
    if args.json:
        write_json(args.json, {"benchmark": "shuffler_service", "machine_cpus": psutil.cpu_count(),
                               "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

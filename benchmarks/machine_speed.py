"""How fast this machine is now, in a few fixed measures, so timings from two machines compare.

    python -m benchmarks.machine_speed [--repeats 3] [--json OUT]

Why: machines of one kind here differ, and so does one machine from hour to hour (they
share hosts). The same commit's test suite took 701 s on one machine and 1,739 s on the
next (2026-12-06); a wall time or CPU total means little without the speed of the machine
that gave it. `.ci/run` prints this table first, so every CI log carries it.

Each measure is the fastest of ``--repeats`` (the least disturbed), on one core:

* ``python_loop_ms``: ``sum(range(10**6))``, the interpreter alone;
* ``sha256_mb_s``: SHA-256 of 1 MB, compiled code streaming memory;
* ``x25519_us``: one X25519 multiplication (libsodium, what a report's seal and peel pay);
* ``syscall_ns``: one trivial system call (``getppid``) from Python: what every request,
  pipe and file write pays on top of its work (a VM's kernel entry, its mitigations);
* ``process_numpy_cpu_s``: CPU of a new interpreter that imports numpy and exits (a
  process start, what the suite's ~900 processes each pay first);
* ``process_ray_cpu_s``: the same importing ray.

The CPU of the machine's other processes during the measures (``busy_cores``) says how
much the numbers were disturbed: near 0 on an idle machine.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import resource
import subprocess
import sys
import time

def _best(fn, repeats: int) -> float:
    """The fastest of ``repeats`` calls, in seconds of this thread's CPU."""
    out = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        out.append(time.thread_time() - t)
    return min(out)


def _child_cpu(code: str, repeats: int) -> float:
    """The smallest user + system CPU of a new interpreter running ``code``."""
    out = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ,
                       "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return min(out)


def _system_busy() -> tuple[float, float]:
    """(busy, total) jiffies of all cores since boot (/proc/stat), or zeros elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return float(sum(fields) - idle), float(sum(fields))


def measure(repeats: int = 3) -> dict:
    """The measures (module docstring), each the fastest of ``repeats``, with the machine's
    description."""
    from nacl.bindings import crypto_scalarmult
    busy0, total0 = _system_busy()
    own0 = time.process_time() + _children_cpu()
    wall0 = time.perf_counter()
    block = os.urandom(1 << 20)
    point, scalar = os.urandom(32), os.urandom(32)
    getppid = os.getppid
    out = {
        "python_loop_ms": _best(lambda: sum(range(10 ** 6)), repeats) * 1e3,
        "sha256_mb_s": 1.0 / max(_best(lambda: hashlib.sha256(block).digest(), repeats), 1e-9),
        "x25519_us": _best(lambda: [crypto_scalarmult(scalar, point) for _ in range(200)],
                           repeats) / 200 * 1e6,
        "syscall_ns": _best(lambda: [getppid() for _ in range(100_000)], repeats) / 1e5 * 1e9,
        "process_numpy_cpu_s": _child_cpu("import numpy", repeats),
        "process_ray_cpu_s": _child_cpu("import ray", repeats),
    }
    busy1, total1 = _system_busy()
    wall = time.perf_counter() - wall0
    own = time.process_time() + _children_cpu() - own0
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    others = max(0.0, (busy1 - busy0) / ticks - own)
    out["busy_cores"] = others / wall if total1 > total0 and wall > 0 else None
    out["machine"] = f"{os.cpu_count()} cores, {_cpu_model()}, Python {platform.python_version()}"
    out["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return out


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def table(row: dict) -> str:
    busy = row["busy_cores"]
    return "\n".join([
        f"machine speed ({row['machine']}, {row['date']}; fastest of repeats, one core):",
        f"  python loop {row['python_loop_ms']:.1f} ms | SHA-256 {row['sha256_mb_s']:.0f} MB/s | "
        f"X25519 {row['x25519_us']:.0f} us | syscall {row['syscall_ns']:.0f} ns | new process + "
        f"numpy {row['process_numpy_cpu_s']:.2f} CPU s, + ray {row['process_ray_cpu_s']:.2f} "
        "CPU s | other load "
        + ("unknown" if busy is None else f"{busy:.2f} cores")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each measure (the fastest "
                    "counts)")
    ap.add_argument("--json", default=None, help="also write the measures to this JSON file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    row = measure(args.repeats)
    print(table(row), flush=True)
    if args.json:
        from rknn_ray.runio import write_json  # defers the project's I/O helpers to --json
        write_json(args.json, {"benchmark": "machine_speed", "rows": [row]})
    return 0


if __name__ == "__main__":
    sys.exit(main())

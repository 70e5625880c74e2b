"""What starting a Ray worker costs: Ray's setup_worker.py against actors/worker_start.py.

    python -m benchmarks.worker_start [--actors 8] [--repeats 3] [--json OUT]

Each cell is a fresh local instance (in a child process of its own) started one way, with
the job's runtime env (the worker setup hook a job sets when another instance runs on the
machine) or with none; it starts ``--actors`` actors at once and each reports its own
process's CPU time (user + system, from the process's start: the launcher's and Ray's
set-up included, since exec keeps the process) on its first call. Reports the median CPU
per worker and the wall time until all were ready, the median over repeats.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from rknn_ray.runio import write_json

CELL = r"""
import json, os, sys, time
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
import ray
from rknn_ray.job import ray_env
launcher, with_env, n = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
kw = {"runtime_env": ray_env.WORKER_RUNTIME_ENV} if with_env else {}
if launcher == "rknn":
    with ray_env.workers_started_without_ray_twice():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _system_config={"prestart_worker_first_driver": False}, **kw)
else:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config={"prestart_worker_first_driver": False}, **kw)

@ray.remote(num_cpus=0)
class Probe:
    def cpu(self):
        t = os.times()
        return t.user + t.system, os.environ.get("RKNN_RAY_WORKER_START")

t0 = time.perf_counter()
got = ray.get([Probe.remote().cpu.remote() for _ in range(n)])
wall = time.perf_counter() - t0
print(json.dumps({"cpu": [c for c, _ in got], "marked": [m for _, m in got], "wall": wall}))
ray.shutdown()
"""


def cell(launcher: str, with_env: bool, actors: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", CELL, launcher, "1" if with_env else "0",
                           str(actors)], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"error: the {launcher} cell failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(actors: int, repeats: int) -> dict:
    rows = []
    for with_env in (True, False):
        for launcher in ("ray", "rknn"):
            cpus, walls, marked = [], [], True
            for _ in range(repeats):
                got = cell(launcher, with_env, actors)
                cpus += got["cpu"]
                walls.append(got["wall"])
                seen = [m == "1" for m in got["marked"]]
                marked &= all(seen) if launcher == "rknn" else not any(seen)
            rows.append({"launcher": launcher, "runtime_env": with_env,
                         "worker_cpu_s_median": statistics.median(cpus),
                         "ready_wall_s_median": statistics.median(walls),
                         "workers": len(cpus), "launcher_confirmed": marked})
    return {"actors": actors, "repeats": repeats, "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    res = measure(args.actors, args.repeats)
    print(f"{args.actors} actors at once, median of {args.repeats} fresh instances")
    print(f"{'runtime env':<12} {'launcher':<28} {'CPU s/worker':>12} {'ready s':>8}")
    for r in res["rows"]:
        name = "Ray's setup_worker.py" if r["launcher"] == "ray" else "actors/worker_start.py"
        print(f"{'job hook' if r['runtime_env'] else 'none':<12} {name:<28} "
              f"{r['worker_cpu_s_median']:12.2f} {r['ready_wall_s_median']:8.2f}")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What starting a Ray worker costs: Ray's own way, actors/worker_start.py, and a fork of the
preloaded parent (actors/worker_fork.py, the default for an instance this project starts).

    python -m benchmarks.worker_start [--actors 8] [--repeats 3] [--imports MODULE]
                                      [--pinned] [--json OUT]

Each cell is a fresh local instance (in a child process of its own) started one way, with
the job's runtime env (the worker setup hook a job sets when another instance runs on the
machine) or with none; it starts ``--actors`` actors at once and each reports its own
process's CPU time (user + system, from the process's start: the launcher's and Ray's
set-up included, since exec keeps the process) on its first call. A forked worker's own CPU
starts at the fork, so its launcher's CPU and its share of the parent's (its imports, once
per instance, divided by the workers it forked) are added to it. Reports the median CPU per
worker and the wall time until all were ready, the median over repeats.

``--imports actors.client_shard``: each actor imports that module first, as a job's shard
does (numpy, pyarrow, faiss, the seals' cryptography). ``--pinned``: the instances run with
the thread counts pinned (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS = 1, as the
test suite runs), where the preloaded parent also holds those libraries
(actors/worker_zygote.py).
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
module = sys.argv[4] if len(sys.argv) > 4 else ""
kw = {"runtime_env": ray_env.WORKER_RUNTIME_ENV} if with_env else {}
os.environ["RKNN_RAY_FORKED_WORKERS"] = "1" if launcher == "fork" else "0"
if launcher != "ray":
    with ray_env.workers_started_without_ray_twice():
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _system_config={"prestart_worker_first_driver": False}, **kw)
else:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _system_config={"prestart_worker_first_driver": False}, **kw)

import psutil
from rknn_ray.job import forked_workers
if launcher == "fork":       # the first workers do not wait for a parent that is not ready
    ready = os.path.join(forked_workers._parents[-1][1], "ready")
    while not os.path.exists(ready):
        time.sleep(0.05)

@ray.remote(num_cpus=0)
class Probe:
    def __init__(self, module):
        if module:
            import importlib
            importlib.import_module(module)

    def cpu(self):
        t = os.times()
        parent = " ".join(psutil.Process(os.getppid()).cmdline())
        forked = "worker_zygote.py" in parent
        mark = ("fork" if forked else "start" if os.environ.get("RKNN_RAY_WORKER_START") else "ray")
        return t.user + t.system, mark, os.getppid() if forked else None

t0 = time.perf_counter()
probes = [Probe.remote(module) for _ in range(n)]
got = ray.get([p.cpu.remote() for p in probes])
wall = time.perf_counter() - t0
extra = [0.0] * n
if launcher == "fork":
    launchers = {}               # this instance's: children of its raylet, a child of ours
    for p in psutil.Process().children(recursive=True):
        if "worker_fork.py" in " ".join(p.cmdline()):
            launchers[p.pid] = sum(p.cpu_times()[:2])
    parents = {g[2] for g in got if g[2]}
    share = sum(sum(psutil.Process(q).cpu_times()[:2]) for q in parents) / n
    per_launcher = sum(launchers.values()) / max(1, len(launchers))
    extra = [per_launcher + share] * n
print(json.dumps({"cpu": [c + e for (c, _, _), e in zip(got, extra)],
                  "marked": [m for _, m, _ in got], "wall": wall}))
ray.shutdown()
"""


PINS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def cell(launcher: str, with_env: bool, actors: int, imports: str = "",
         pinned: bool = False) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS" and k not in PINS}
    if pinned:
        env.update({k: "1" for k in PINS})
    done = subprocess.run([sys.executable, "-c", CELL, launcher, "1" if with_env else "0",
                           str(actors), imports], capture_output=True, text=True, env=env,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(__file__)) or ".")
    if done.returncode != 0:
        raise SystemExit(f"error: the {launcher} cell failed: {done.stderr.strip()[-400:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(actors: int, repeats: int, imports: str = "", pinned: bool = False) -> dict:
    rows = []
    for with_env in (True, False):
        for launcher in ("ray", "start", "fork"):
            cpus, walls, marked = [], [], True
            for _ in range(repeats):
                got = cell(launcher, with_env, actors, imports, pinned)
                cpus += got["cpu"]
                walls.append(got["wall"])
                # without a runtime env Ray skips the set-up script: the worker_start mark
                # is there only with one
                want = launcher if (launcher == "fork" or with_env) else "ray"
                marked &= all(m == want for m in got["marked"])
            rows.append({"launcher": launcher, "runtime_env": with_env,
                         "worker_cpu_s_median": statistics.median(cpus),
                         "ready_wall_s_median": statistics.median(walls),
                         "workers": len(cpus), "launcher_confirmed": marked})
    return {"actors": actors, "repeats": repeats, "imports": imports, "pinned": pinned,
            "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--actors", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--imports", default="", metavar="MODULE",
                    help="each actor imports this first (e.g. actors.client_shard)")
    ap.add_argument("--pinned", action="store_true",
                    help="thread counts pinned to 1 (the parent then preloads the libraries)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    res = measure(args.actors, args.repeats, args.imports, args.pinned)
    print(f"{args.actors} actors at once, median of {args.repeats} fresh instances"
          + (f", each importing {args.imports}" if args.imports else "")
          + (", thread counts pinned" if args.pinned else ""))
    print(f"{'runtime env':<12} {'launcher':<28} {'CPU s/worker':>12} {'ready s':>8}")
    for r in res["rows"]:
        name = {"ray": "Ray's own", "start": "actors/worker_start.py",
                "fork": "+ forked (worker_fork.py)"}[r["launcher"]]
        print(f"{'job hook' if r['runtime_env'] else 'none':<12} {name:<28} "
              f"{r['worker_cpu_s_median']:12.2f} {r['ready_wall_s_median']:8.2f}")
    if args.json:
        write_json(args.json, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

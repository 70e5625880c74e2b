"""A user's table at scale through ``data.dataset: table``: stage times and memory.

    python -m benchmarks.table_scale --records N --holders H [--model central|shuffle]
        [--features 32] [--classes 10] [--files F] [--public 2000] [--queries 50]
        [--bound 10] [--shards 2] [--out DIR] [--tag=-TAG] [--keep] [--reuse] [--json]

Writes its own table under DIR (default bench_out/table_scale): the private part a folder of
F parquet files (N rows; ``features`` float32 columns f0.., string labels c0.., string holder
ids h0..h{H-1} drawn at random), a public part (``--public`` rows, string row ids) and an
evaluation part; then runs the real job (rknn_ray.job.run: Ray started by the job, a fresh
ledger, ``student.trainer: local``, 1 epoch) with ``privacy.model`` central (laplace, eps 1)
or shuffle (``mechanism: collision``, eps 4, delta below 1/(10 N), a budget delta below 1/N, the default amplification bound); a holder keeps
at most ``--bound`` records (default 10). ``--holders 0``: no client column (each record its
own client).

Printed (and written as JSON to benchmarks/results/table-scale-<model>-<N>.json, or to
``--out`` with ``--json``): the job's ``timings_s`` (data, ray_start, scan, queries, actors,
round_*, student, ...), the job's wall time, ``data_path_s`` (wall minus Ray's start, the
rounds, labels and student: what reading the table costs), the table's size on disk, and
``peak_rss_mb``: the peak over time of the RSS summed over every process of the job (this
one, its descendants, and every process whose command line names ray, raylet, gcs or
default_worker and the job's Ray session), sampled from /proc every 0.2 s in a thread.
Shared pages (Ray's object store) count once per process that maps them, so the sum is an
upper bound; ``peak_rss_kinds_mb`` splits the largest processes' RSS at the peak into
anonymous, file-backed and shared-memory MB, and ``own_peaks_mb`` gives each process's own
peak (at whatever time). The written table is deleted afterwards unless ``--keep``
(``--reuse``: run on the table an earlier ``--keep`` run wrote with the same shape, and keep
it).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time

import numpy as np

from benchmarks.scale import Sampler
from rknn_ray.runio import write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")
PAGE = os.sysconf("SC_PAGE_SIZE")
RAY_WORDS = ("ray", "raylet", "gcs_server", "default_worker")
#: stages that are not the data path besides the rounds (round_<i>; the job's timings_s keys)
NOT_DATA = ("ray_start", "labels", "student")


# ---------------------------------------------------------------- the table
def write_table(folder: str, records: int, holders: int, features: int = 32, classes: int = 10,
                files: int | None = None, public: int = 2000, seed: int = 0) -> dict:
    """The three parts in ``folder`` (private/ a folder of parquet files); their sizes."""
    import pyarrow as pa  # defers pyarrow
    import pyarrow.parquet as pq
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 2.0, (classes, features)).astype(np.float32)
    names = pa.array([f"c{i}" for i in range(classes)], pa.string())
    ids = pa.array([f"h{i}" for i in range(holders)], pa.string()) if holders else None
    files = files or max(1, -(-records // 1_000_000))

    def rows(n, **extra):
        y = rng.integers(0, classes, n)
        x = means[y] + rng.standard_normal((n, features), dtype=np.float32)
        cols = {f"f{j}": x[:, j] for j in range(features)}
        return pa.table({**cols, **{k: v(y) for k, v in extra.items()}})

    priv = os.path.join(folder, "private")
    os.makedirs(priv, exist_ok=True)
    cuts = np.linspace(0, records, files + 1).astype(np.int64)
    for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
        extra = {"label": lambda y: names.take(pa.array(y))}
        if holders:
            extra["holder"] = lambda y: ids.take(pa.array(rng.integers(0, holders, len(y))))
        pq.write_table(rows(int(b - a), **extra), os.path.join(priv, f"part-{i:04d}.parquet"))
    pq.write_table(rows(public, row_id=lambda y: pa.array([f"r{i}" for i in range(len(y))])),
                   os.path.join(folder, "public.parquet"))
    pq.write_table(rows(public, label=lambda y: names.take(pa.array(y))),
                   os.path.join(folder, "evaluation.parquet"))
    size = sum(os.path.getsize(os.path.join(priv, f)) for f in os.listdir(priv))
    return {"private_files": files, "private_mb": round(size / 2 ** 20, 1)}


def job_config(folder: str, model: str, holders: int, classes: int, queries: int,
               shards: int, bound: int = 10, records: int = 1) -> dict:
    """The job's config dict (tests/table_files.py's shape); shuffle's delta below
    1/(10 ``records``)."""
    private = {"path": os.path.join(folder, "private"), "label": "label"}
    if holders:
        private["client"] = "holder"
    data = {"dataset": "table", "classes": [f"c{i}" for i in range(classes)],
            "private": private,
            "public": {"path": os.path.join(folder, "public.parquet"), "id": "row_id"},
            "evaluation": {"path": os.path.join(folder, "evaluation.parquet"), "label": "label"}}
    if holders:
        data["max_records_per_client"] = bound
    privacy = ({"model": "central", "mechanism": "laplace", "eps": 1.0, "budget_eps": 100.0}
               if model == "central" else
               {"model": "shuffle", "mechanism": "collision", "eps": 4.0,
                "delta": 10.0 ** -(len(str(max(1, records))) + 1),
                "budget_eps": 100.0,
                "budget_delta": 10.0 ** -len(str(max(1, records)))})
    cfg = {"data": data, "privacy": privacy, "queries": {"s": queries},
           "represent": {"encoder": "pca", "dim": 16},
           "student": {"trainer": "local", "epochs": 1}, "cluster": {"shards": shards},
           "run": {"progress": False, "name": f"table-scale-{model}"}}
    if model == "shuffle":
        cfg["shuffle"] = {"onion_layers": 0}
    return {k: v for k, v in cfg.items()}


# ---------------------------------------------------------------- memory
def _children() -> dict:
    """pid -> parent pid of every process (from /proc)."""
    parents = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as fh:
                    stat = fh.read()
                parents[int(d)] = int(stat[stat.rindex(b")") + 2:].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return parents


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return 0


def _rss_parts(pid: int) -> list:
    """[anonymous, file-backed, shared-memory] resident MB of ``pid`` (/proc/pid/status):
    which kind of page a process's RSS is (Ray's object store is shared memory)."""
    parts = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith((b"RssAnon:", b"RssFile:", b"RssShmem:")):
                    name, kb = line.split()[:2]
                    parts[name] = round(int(kb) / 1024)
    except (OSError, ValueError):
        pass
    return [parts.get(k, 0) for k in (b"RssAnon:", b"RssFile:", b"RssShmem:")]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class JobMemory(Sampler):
    """Peak of the RSS summed over the job's processes (module docstring), every ``period`` s
    in a thread (benchmarks.scale.Sampler); ``session``: Ray's session name once the job
    started Ray (a Ray process of another session on a shared machine is not counted)."""

    def __init__(self, period: float = 0.2):
        super().__init__(period)
        self.peak, self.peak_by = 0, {}
        self.me = os.getpid()
        self._ours: set = set()
        self._names: dict = {}
        self.peak_parts: dict = {}          # pid -> [anon, file, shmem] MB at the peak
        self.own_peak: dict = {}            # pid -> (its own peak RSS, its name then)

    def _session(self) -> str | None:
        try:
            import ray  # defers ray
            if ray.is_initialized():
                node = ray._private.worker._global_node  # noqa: SLF001 - the session's name
                return getattr(node, "session_name", None)
        except Exception:  # noqa: BLE001 - a sample without Ray's session
            return None
        return None

    def sample(self) -> None:
        parents = _children()
        tree, frontier = {self.me}, [self.me]
        kids: dict = {}
        for pid, ppid in parents.items():
            kids.setdefault(ppid, []).append(pid)
        while frontier:
            for c in kids.get(frontier.pop(), []):
                if c not in tree:
                    tree.add(c)
                    frontier.append(c)
        session = self._session()
        if session:
            for pid in parents:
                if pid in tree or pid in self._ours:
                    continue
                cmd = _cmdline(pid)
                if session in cmd and any(w in cmd for w in RAY_WORDS):
                    self._ours.add(pid)
        pids = tree | (self._ours & set(parents))
        by = {pid: _rss(pid) for pid in pids}
        total = sum(by.values())
        for pid, rss in by.items():
            if rss > self.own_peak.get(pid, (0, ""))[0]:
                self.own_peak[pid] = (rss, self._name(pid))
        if total > self.peak:
            self.peak = total
            self.peak_by = by
            top = sorted(by, key=lambda p: -by[p])[:12]
            self.peak_parts = {pid: _rss_parts(pid) for pid in top}
            for pid in by:
                if pid not in self._names:
                    self._names[pid] = self._name(pid)

    def _name(self, pid: int) -> str:
        cmd = _cmdline(pid) or "?"
        if pid == self.me:
            return "driver"
        if cmd.startswith("ray::"):
            return cmd.split()[0][:40]
        for w in ("default_worker", "gcs_server", "dashboard", "log_monitor", "monitor.py",
                  "runtime_env", "raylet"):
            if w in cmd:
                return w
        return os.path.basename(cmd.split()[0])[:40]

    def largest(self, n: int = 5) -> list:
        """The ``n`` largest processes at the peak: [name, MB]."""
        top = sorted(self.peak_by.items(), key=lambda kv: -kv[1])[:n]
        return [[self._names.get(pid, "?"), round(rss / 2 ** 20)] for pid, rss in top]

    def largest_parts(self, n: int = 12) -> list:
        """The ``n`` largest processes at the peak: [name, MB, anonymous, file, shared MB]."""
        top = sorted(self.peak_by.items(), key=lambda kv: -kv[1])[:n]
        return [[self._names.get(pid, "?"), round(rss / 2 ** 20),
                 *self.peak_parts.get(pid, [None] * 3)] for pid, rss in top]

    def own_peaks(self, n: int = 6) -> list:
        """The ``n`` processes with the largest peaks of their own (at any time): [name, MB]."""
        top = sorted(self.own_peak.values(), key=lambda v: -v[0])[:n]
        return [[name, round(rss / 2 ** 20)] for rss, name in top]


# ---------------------------------------------------------------- the run
def run(records: int, holders: int, model: str = "central", features: int = 32,
        classes: int = 10, files: int | None = None, public: int = 2000, queries: int = 50,
        shards: int = 2, out: str = "bench_out/table_scale", keep: bool = False,
        bound: int = 10, reuse: bool = False) -> dict:
    from rknn_ray.config import Config  # defers yaml
    from rknn_ray.job import run as run_job  # defers cryptography, dp_accounting, faiss, ray
    from rknn_ray.runio import prepare_run_dir
    out = os.path.abspath(out)
    folder = os.path.join(out, f"table-{records}-{holders}")
    marker = os.path.join(folder, "written.json")
    shape = {"records": records, "holders": holders, "features": features, "classes": classes,
             "files": files, "public": public}
    t = time.perf_counter()
    if reuse and os.path.exists(marker) and json.load(open(marker))["shape"] == shape:
        written = json.load(open(marker))["written"]          # --reuse: the same table
    else:
        shutil.rmtree(folder, ignore_errors=True)
        written = write_table(folder, records, holders, features, classes, files, public)
        with open(marker, "w") as fh:
            json.dump({"shape": shape, "written": written}, fh)
    write_s = time.perf_counter() - t
    ledger = os.path.join(out, f"ledger-{model}-{records}.sqlite")
    for suffix in ("", "-wal", "-shm", ".key", ".release-key"):
        if os.path.exists(ledger + suffix):
            os.remove(ledger + suffix)
    cfg = Config.from_dict(job_config(folder, model, holders, classes, queries, shards,
                                      bound, records))
    run_dir = prepare_run_dir(os.path.join(out, f"run-{model}-{records}"), overwrite=True) \
        if _takes_overwrite() else os.path.join(out, f"run-{model}-{records}")
    if not _takes_overwrite():
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir = prepare_run_dir(run_dir)
    try:
        with JobMemory() as mem:
            t = time.perf_counter()
            res = run_job(cfg, run_dir, ledger_path=ledger)
            wall = time.perf_counter() - t
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    timings = {k: round(float(v), 2) for k, v in res.report["timings_s"].items()}
    rounds = sum(v for k, v in timings.items() if re.fullmatch(r"round_\d+", k))
    other = sum(v for k, v in timings.items() if k in NOT_DATA)
    counts = res.report["counts"]
    return {"records": records, "holders": holders, "model": model, "features": features,
            "classes": classes, "shards": shards, "queries": queries, "bound": bound, **written,
            "write_table_s": round(write_s, 1), "timings_s": timings,
            "wall_s": round(wall, 2), "round_s": round(rounds, 2),
            "data_path_s": round(wall - rounds - other, 2),
            "peak_rss_mb": round(mem.peak / 2 ** 20), "peak_rss_largest_mb": mem.largest(),
            "peak_rss_kinds_mb": mem.largest_parts(), "own_peaks_mb": mem.own_peaks(),
            "clients": counts.get("clients"), "student_accuracy":
                res.report.get("accuracy", {}).get("student"),
            "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "command": "python -m benchmarks.table_scale " + " ".join(sys.argv[1:])}


def _takes_overwrite() -> bool:
    import inspect
    from rknn_ray.runio import prepare_run_dir
    return "overwrite" in inspect.signature(prepare_run_dir).parameters


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--holders", type=int, default=10000)
    ap.add_argument("--model", choices=("central", "shuffle"), default="central")
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--files", type=int, default=None, help="private files (default: one per "
                    "1e6 records)")
    ap.add_argument("--public", type=int, default=2000, help="public and evaluation rows")
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--bound", type=int, default=10, help="records a holder keeps at most")
    ap.add_argument("--out", default="bench_out/table_scale")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    ap.add_argument("--keep", action="store_true", help="keep the written table")
    ap.add_argument("--reuse", action="store_true", help="reuse a table an earlier --keep run "
                    "wrote with the same shape (implies --keep)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.records, args.holders, args.model, args.features, args.classes, args.files,
              args.public, args.queries, args.shards, args.out, args.keep or args.reuse, args.bound,
              args.reuse)
    name = f"table-scale-{args.model}-{args.records}{args.tag}.json"
    write_json(os.path.join(RESULTS, name), res)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"| stage | s |\n|---|---|")
    for k, v in res["timings_s"].items():
        print(f"| {k} | {v:.2f} |")
    print(f"| **job wall** | {res['wall_s']:.2f} |\n| data path | {res['data_path_s']:.2f} |\n"
          f"| round(s) | {res['round_s']:.2f} |")
    print(f"peak RSS over the job's processes {res['peak_rss_mb']} MB (largest: "
          + ", ".join(f"{n} {mb}" for n, mb in res["peak_rss_largest_mb"]) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())

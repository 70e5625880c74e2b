"""The whole remote round against the in-cluster round, on the same data, in one run.

    python -m benchmarks.remote_round [--sizes 1000 10000 100000] [--load-processes 2]
                                      [--json benchmarks/results/remote-round.json]

For each size N: a synthetic table (8 numeric features, two classes, N holders of one
record each, a 2,000-row public part), then

* **in-cluster**: ``rknn-ray run`` on it (shuffle model, Collision, eps 1), client shards
  simulating the holders: the round's time is report.json's ``timings_s.round_0``;
* **remote**: the shuffler service as its own process, ``rknn-ray run`` with
  ``cluster.holders: remote`` (the same config, the registry in place of the private path),
  and ``--load-processes`` load processes, each answering for N/P holders with the holder
  program's own code (holder.answer.payloads_many, as ``holder join-many``: the published
  encoder and the reverse k-NN search shared by the process's holders, each holder's
  messages the bytes it would make alone from its own secret; then per holder the
  mechanism's coins, HPKE sealing for the server then the shuffler, its own Ed25519 key,
  one signed request per holder over one keep-alive TLS connection). The round's time is the
  same ``round_0`` (publish, every holder's upload, early close, batch fetch, opening).
  What the load holders skip: their own ledger (one SQLite transaction per holder; its cost
  is measured apart, ``holder_ledger_ms``) and one process per holder (a process start is
  ~1 s of imports here; tests/test_remote_trial.py runs holders as their own processes).

It prints a table and writes JSON: both rounds, their ratio, the shuffler's accepted reports
per second (from its ``/status`` counts, first to last accepted), and the shuffler process's
peak RSS (VmHWM), which must stay bounded (the store streams to disk). Here every holder's
work shares the machine's cores with the service and the job; so it also gives the holders'
and the shuffler's CPU seconds, and ``round_if_holders_apart_s``: the shuffler's CPU plus the
round after the window closed, what the round would take were each holder on its own machine
(an estimate from this run's measurements, labelled as such).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT)}
CLASSES = ("no", "yes")
D = 8
BLOCK = 64          # holders a load thread answers together (holder.answer.payloads_many)


# ---------------------------------------------------------------------- data

def make_table(folder: Path, n: int, seed: int = 0) -> dict:
    """private.parquet (n holders of one record), public.csv, evaluation.csv."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import csv
    rng = np.random.default_rng(seed)

    def rows(m):
        y = rng.integers(0, 2, m)
        x = rng.normal(size=(m, D)) + (2 * y[:, None] - 1) * 0.8
        return x.astype(np.float32), y

    cols = [f"x{i}" for i in range(D)]
    x, y = rows(n)
    pq.write_table(pa.table({**{c: x[:, i] for i, c in enumerate(cols)},
                             "label": [CLASSES[v] for v in y],
                             "holder": [f"h{i:07d}" for i in range(n)]}), folder / "private.parquet")
    x, _ = rows(2000)
    csv.write_csv(pa.table({"row_id": np.arange(2000), **{c: x[:, i] for i, c in enumerate(cols)}}),
                  folder / "public.csv")
    x, y = rows(500)
    csv.write_csv(pa.table({**{c: x[:, i] for i, c in enumerate(cols)},
                            "label": [CLASSES[v] for v in y]}), folder / "evaluation.csv")
    return {"private": str(folder / "private.parquet"), "public": str(folder / "public.csv"),
            "evaluation": str(folder / "evaluation.csv")}


def config(paths: dict, n: int, remote: dict | None = None) -> dict:
    private = ({"label": "label"} if remote else
               {"path": paths["private"], "label": "label", "client": "holder"})
    cfg = {"run": {"name": "remote-round", "seed": 0, "progress": False},
           "data": {"dataset": "table", "name": "remote-round benchmark", "classes": list(CLASSES),
                    "max_records_per_client": 1, "private": private,
                    "public": {"path": paths["public"], "id": "row_id"},
                    "evaluation": {"path": paths["evaluation"], "label": "label"}},
           "represent": {"encoder": "raw"}, "queries": {"s": 10}, "rknn": {"k": 1},
           "privacy": {"model": "shuffle", "mechanism": "collision", "eps": 1.0, "delta": 1e-6,
                       "budget_eps": 100.0, "budget_delta": min(1e-5, 0.1 / n)},
           "shuffle": {"onion_layers": 0}, "student": {"epochs": 2, "trainer": "local"},
           "cluster": {"shards": 2}}
    if remote:
        cfg["cluster"]["holders"] = "remote"
        cfg["remote"] = remote
    return cfg


def run_job(cfg: dict, folder: Path, name: str) -> subprocess.Popen:
    import yaml
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return subprocess.Popen([sys.executable, "-m", "jobs.distill", "--config", str(path), "--out",
                             str(folder / name), "--ledger", str(folder / f"{name}.sqlite")],
                            cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def finished(proc: subprocess.Popen, folder: Path, name: str) -> dict:
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} job exited {proc.returncode}: {out[-1500:]}")
    return json.loads((folder / name / "report.json").read_text())


# ---------------------------------------------------------------------- holders under load

def write_holders(folder: Path, n: int) -> tuple[Path, Path]:
    """n holders' Ed25519 keys and secrets (raw, one file), and the registry."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    keys = [Ed25519PrivateKey.generate() for _ in range(n)]
    raw = np.frombuffer(b"".join(k.private_bytes_raw() + os.urandom(32) for k in keys),
                        np.uint8).reshape(n, 64)
    kfile = folder / "holders.npy"
    np.save(kfile, raw)
    os.chmod(kfile, 0o600)
    reg = folder / "registry.txt"
    reg.write_text("".join(f"{k.public_key().public_bytes_raw().hex()} 1\n" for k in keys))
    return kfile, reg


def load_main(args) -> int:
    """One load process: holders [lo, hi) answer the published round (holder.answer)."""
    import pyarrow.parquet as pq
    from holder import answer
    from holder.accountant import mechanism_of, own_cost
    from holder.identity import Identity
    from holder.join import published
    from holder.signing import SodiumEd25519PrivateKey
    from sealing.upload_client import Connection, send_entries, sign_reports
    operator = bytes.fromhex(Path(args.operator_pub).read_text().strip())
    keys = np.load(args.keys)[args.lo:args.hi]
    table = pq.read_table(args.private).slice(args.lo, args.hi - args.lo)
    labels = np.array([CLASSES.index(v) for v in table.column("label").to_pylist()], np.int64)
    features = table.drop_columns(["label", "holder"])
    poll, until = Connection(args.url, args.ca), time.monotonic() + 600
    while poll.request("GET", "/spec")[0] == 404 and time.monotonic() < until:
        time.sleep(0.1)         # not yet published: the job is starting (one kept connection)
    poll.close()
    waiting_cpu = time.process_time()   # imports and the wait, before the round's specification
    spec, encoder = published(args.url, args.ca, operator, wait_s=600)
    mech = mechanism_of(spec)
    own_cost(spec, mech)            # what each holder computes before it answers
    import threading
    from collections import Counter
    codes: Counter = Counter()
    lock = threading.Lock()

    bounds = np.arange(len(keys) + 1)             # one record per holder
    inputs = answer.inputs_many(encoder, features, bounds)

    phases: Counter = Counter()     # CPU seconds of the holders' threads, by step

    def holders(part):          # a connection per thread: requests in flight while others seal
        conn = Connection(args.url, args.ca)
        mine: Counter = Counter()
        spent: Counter = Counter()
        clock = time.thread_time
        for at in range(0, len(part), BLOCK):
            block = part[at:at + BLOCK]
            t = clock()
            idents = [Identity(SodiumEd25519PrivateKey(keys[i, :32].tobytes()),
                               keys[i, 32:].tobytes()) for i in block]
            rows = np.asarray(block)
            spent["keys"] += clock() - t
            t = clock()
            msgs = answer.payloads_many(spec, mech, idents, inputs[rows], labels[rows],
                                        np.arange(len(block) + 1))
            spent["messages"] += clock() - t
            for ident, m in zip(idents, msgs):
                t = clock()
                reports = answer.seal(spec, ident, m)
                t1 = clock()
                entries = sign_reports(ident.key, reports)
                t2 = clock()
                mine.update(send_entries(conn, entries, len(reports)))
                t3 = clock()
                spent["seal"] += t1 - t
                spent["sign"] += t2 - t1
                spent["send"] += t3 - t2
        conn.close()
        with lock:
            codes.update(mine)
            phases.update(spent)
    setup_cpu = time.process_time()     # imports, the published round, every holder's inputs
    t0 = time.perf_counter()
    threads = [threading.Thread(target=holders, args=(range(j, len(keys), args.threads),))
               for j in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"holders": len(keys), "codes": codes, "s": time.perf_counter() - t0,
                      "cpu_s": time.process_time(), "setup_cpu_s": setup_cpu, "waiting_cpu_s": waiting_cpu,
                      "phases_cpu_s": phases}), flush=True)
    return 0


def holder_ledger_ms(folder: Path, reps: int = 50) -> float:
    """Median ms of one holder's own ledger charge (HolderLedger on its own SQLite file)."""
    from holder.accountant import mechanism_of, own_cost
    from holder.ledger import HolderLedger, Policy
    from sealing.round_spec import RoundSpec
    spec = RoundSpec.from_bytes((folder / "remote" / "published" / "round.spec").read_bytes()[:-64])
    cost = own_cost(spec, mechanism_of(spec))
    times = []
    for i in range(reps):
        book = HolderLedger(str(folder / f"ledger-{i}.db"), "bench", np.zeros((1, D), np.float32),
                            Policy(np.inf, 10.0, 1e-5))
        t0 = time.perf_counter()
        book.charge(spec, cost)
        times.append(time.perf_counter() - t0)
    return float(np.median(times) * 1e3)


# ---------------------------------------------------------------------- one size

def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process (/proc/PID/stat)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def peak_rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def one_size(n: int, procs: int, folder: Path, threads: int = 16) -> dict:
    from sealing.upload_client import fetch
    from shuffler.certs import make_certs
    from shuffler.service_files import save_layer_key
    from rknn_ray.remote.operator_key import public_file, save_operator_key
    from rknn_ray.remote.parties import SHUFFLER_BLOCKED, party_command
    folder.mkdir(parents=True)
    load_before = os.getloadavg()[0]
    paths = make_table(folder, n)
    t0 = time.perf_counter()
    inc = finished(run_job(config(paths, n), folder, "in_cluster"), folder, "in_cluster")
    in_wall = time.perf_counter() - t0
    kfile, reg = write_holders(folder, n)
    save_operator_key(folder / "operator.key")
    save_layer_key(folder / "shuffler.key")
    certs = make_certs(folder / "tls")
    env = {**ENV, "RKNN_BLOCK_LOG": str(folder / "blocked.log")}
    service = subprocess.Popen(party_command(sys.executable, SHUFFLER_BLOCKED, "shuffler service", [
        "shuffler", "serve", "--operator-key", str(public_file(folder / "operator.key")),
        "--holders", str(reg), "--key", str(folder / "shuffler.key"), "--cert", str(certs.cert),
        "--cert-key", str(certs.key), "--store", str(folder / "store"), "--port", "0"]),
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    url = service.stdout.readline().split("serving ", 1)[1].split()[0]
    try:
        remote = {"shuffler": url, "ca": str(certs.ca), "operator_key": str(folder / "operator.key"),
                  "registry": str(reg), "window_s": 3600.0}
        t0 = time.perf_counter()
        job = run_job(config(paths, n, remote), folder, "remote")
        # the holders start with the job and wait for its specification (as holder join
        # --wait): their imports overlap the job's start, not its round
        bounds = np.linspace(0, n, procs + 1).astype(int)
        loads = [subprocess.Popen([sys.executable, "-m", "benchmarks.remote_round", "--load",
                                   "--url", url, "--ca", str(certs.ca), "--operator-pub",
                                   str(public_file(folder / "operator.key")), "--keys", str(kfile),
                                   "--private", paths["private"], "--lo", str(lo), "--hi", str(hi),
                                   "--threads", str(threads)],
                                  cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
                 for lo, hi in zip(bounds[:-1], bounds[1:])]
        while json.loads(fetch(url, certs.ca, "/status")[1]).get("published") is not True:
            if job.poll() is not None:
                for p in loads:
                    p.kill()
                finished(job, folder, "remote")
            time.sleep(0.2)
        samples = []
        while any(p.poll() is None for p in loads):
            try:
                st = json.loads(fetch(url, certs.ca, "/status")[1])
                samples.append((time.perf_counter(), int(st.get("accepted", 0))))
            except (OSError, ValueError):
                pass
            time.sleep(0.5)
        load_out = [json.loads(p.stdout.read().strip().splitlines()[-1]) for p in loads]
        rep = finished(job, folder, "remote")
        re_wall = time.perf_counter() - t0
        rss, service_cpu = peak_rss_mb(service.pid), cpu_seconds(service.pid)
    finally:
        service.terminate()
        service.wait(10)
    moving = [(t, a) for t, a in samples if 0 < a]
    rate = ((moving[-1][1] - moving[0][1]) / (moving[-1][0] - moving[0][0])
            if len(moving) > 1 and moving[-1][0] > moving[0][0] else None)
    ledger_ms = holder_ledger_ms(folder)
    codes: dict = {}
    for lo in load_out:
        for c, v in lo["codes"].items():
            codes[c] = codes.get(c, 0) + v
    return {"n": n, "load_processes": procs, "threads_per_process": threads,
            "load_holder_s": [lo["s"] for lo in load_out],
            "in_cluster_round_s": inc["timings_s"]["round_0"], "in_cluster_job_s": in_wall,
            "remote_round_s": rep["timings_s"]["round_0"], "remote_job_s": re_wall,
            "remote_holders_s": rep["timings_s"].get("round_0_holders"),
            "remote_batch_s": rep["timings_s"].get("round_0_batch"),
            "ratio": rep["timings_s"]["round_0"] / inc["timings_s"]["round_0"],
            # where the round's seconds went: every holder's work shares these 2 cores here,
            # where in a deployment each holder computes on its own machine
            "holders_cpu_s": sum(lo["cpu_s"] for lo in load_out),
            "shuffler_cpu_s": service_cpu,
            "holder_cpu_ms_each": sum(lo["cpu_s"] for lo in load_out) / n * 1e3,
            # the load processes' CPU per holder by step (us): before_spec is the imports and
            # the wait for the specification, setup the published round, the holders' own
            # cost and inputs, each once per process; the rest per holder
            "holder_cpu_us_by_step": {
                "before_spec": sum(lo["waiting_cpu_s"] for lo in load_out) / n * 1e6,
                "setup": sum(lo["setup_cpu_s"] - lo["waiting_cpu_s"] for lo in load_out) / n * 1e6,
                **{k: sum(lo["phases_cpu_s"].get(k, 0) for lo in load_out) / n * 1e6
                   for k in ("keys", "messages", "seal", "sign", "send")}},
            "shuffler_cpu_us_per_report": (service_cpu or 0) / n * 1e6,
            "load_avg_1min": [load_before, os.getloadavg()[0]],   # before, after (2 cores)
            "after_window_s": rep["timings_s"]["round_0"] - (rep["timings_s"].get("round_0_holders") or 0),
            "round_if_holders_apart_s": (service_cpu or 0) + rep["timings_s"]["round_0"]
            - (rep["timings_s"].get("round_0_holders") or 0),
            "shuffler_accepted_per_s": rate, "shuffler_peak_rss_mb": rss,
            "opened": rep["remote"]["opened"], "codes": codes,
            "student_in_cluster": inc["accuracy"]["student"],
            "student_remote": rep["accuracy"]["student"],
            "holder_ledger_ms": ledger_ms}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--load-processes", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    for name in ("--url", "--ca", "--operator-pub", "--keys", "--private"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=16, help="connections per load process")
    ap.add_argument("--lo", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--hi", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.load:
        return load_main(args)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rknn-remote-round-") as tmp:
        for n in args.sizes:
            row = one_size(n, args.load_processes, Path(tmp) / f"n{n}", args.threads)
            rows.append(row)
            rate = row["shuffler_accepted_per_s"]
            rate = (f"{rate:,.0f} reports/s" if rate else
                    "reports/s not sampled (the round ended before two reads of /status)")
            print(f"N={n:>7}: in-cluster round {row['in_cluster_round_s']:7.1f} s | remote round "
                  f"{row['remote_round_s']:7.1f} s (holders {row['remote_holders_s']:.1f} s, batch "
                  f"{row['remote_batch_s']:.1f} s) | ratio {row['ratio']:.2f} | holders' CPU "
                  f"{row['holders_cpu_s']:.1f} s, shuffler's {row['shuffler_cpu_s'] or 0:.1f} s: "
                  f"apart ~{row['round_if_holders_apart_s']:.1f} s "
                  f"({row['round_if_holders_apart_s'] / row['in_cluster_round_s']:.2f}x) | shuffler "
                  f"{rate}, peak "
                  f"{row['shuffler_peak_rss_mb'] or 0:.0f} MB | opened {row['opened']} | load "
                  f"{row['load_avg_1min'][0]:.1f} -> {row['load_avg_1min'][1]:.1f}", flush=True)
    out = {"benchmark": "remote_round", "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "machine": f"{os.cpu_count()} cores", "command": "python -m benchmarks.remote_round "
           + " ".join(argv if argv is not None else sys.argv[1:]), "rows": rows}
    if args.json:
        from rknn_ray.runio import write_json
        write_json(args.json, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``rknn-ray trial``: a one-machine trial of a round whose holders run off the cluster.

    rknn-ray trial --config CONFIG --ledger L --out RUN [--parties DIR]
                   [--holders-per-process N] [--parallel P] [--window S] [--set KEY=VALUE ...]

Each party is its own OS process, exactly as on three kinds of machine (docs/running.md,
"Holders off the cluster"):

* the holders: the config's private table is split by holder (``data.private.client``, else
  one holder per record) into one folder per holder with its own rows, Ed25519 key, secret
  and ledger; each runs ``rknn-ray holder join`` (``--holders-per-process N > 1``: ``holder
  join-many`` over N folders, each holder still its own key and ledger), with ``ray``,
  ``server``, ``shuffler``, ``actors`` and ``torch`` unimportable in its process;
* the shuffler service (``rknn-ray shuffler serve``, ``ray`` and ``server`` unimportable),
  over TLS on loopback with a private CA the trial makes;
* the operator's job (``rknn-ray run`` with ``cluster.holders: remote``): it never opens a
  holder's file; it publishes the signed specification, the holders answer, and it fetches
  the shuffled batch.

The run folder is the job's, as ever; the parties' folders (keys, ledgers, the shuffler's
store, logs) are under ``--parties`` (default ``RUN.parties``). Exit: the job's code.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXAMPLES = """\
examples:
  rknn-ray trial --config table_shuffle --ledger trial.sqlite --out runs/trial
  rknn-ray trial --config table_shuffle --ledger trial.sqlite --out runs/trial \\
      --holders-per-process 25 --parallel 2
"""


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rknn-ray trial", epilog=EXAMPLES,
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="a table job's config (name or YAML path)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--ledger", required=True, help="the operator's ledger (SQLite)")
    ap.add_argument("--out", required=True, help="the job's run folder")
    ap.add_argument("--parties", help="folder for the holders, the shuffler and the logs "
                                      "(default RUN.parties; must not exist)")
    ap.add_argument("--holders-per-process", type=int, default=1, metavar="N",
                    help="holders answering in one process (default 1: a process per holder)")
    ap.add_argument("--parallel", type=int, default=4, metavar="P",
                    help="holder processes running at once (default 4)")
    ap.add_argument("--window", type=float, default=600.0, metavar="SECONDS",
                    help="the upload window (closed early once every holder reported)")
    ap.add_argument("--absent", type=int, default=0, metavar="N",
                    help="holders that never answer (the last N of the registry): a trial of "
                         "dropouts, or of a round below its floor")
    ap.add_argument("--operator-wrap", default="", metavar="COMMAND",
                    help="a command the operator's job runs under, for an audit (e.g. "
                         "'strace -f -e trace=%%file -o FILE': which files it opened)")
    return ap


def main(argv=None) -> int:
    from rknn_ray.errors import RknnError  # defers the library's package to a call of main

    args = parser().parse_args(argv)
    try:
        return _trial(args)
    except (KeyboardInterrupt, Terminated) as exc:
        code = 143 if isinstance(exc, Terminated) else 130
        print(f"rknn-ray trial: {'SIGTERM' if code == 143 else 'interrupted'}: every party "
              "it started was stopped (the job's run folder says what it released)",
              file=sys.stderr)
        return code
    except (ValueError, OSError, RuntimeError, RknnError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"error: rknn-ray trial: {text}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------------- the holders' folders

def split_holders(cfg, folder: Path) -> list[tuple[Path, int]]:
    """One folder per holder with its own rows (data.csv), key and secret; (folder, records)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.dataset as ds

    from holder.identity import keygen
    priv = dict(cfg.data.private or {})
    path, label, client = priv.get("path"), priv.get("label"), priv.get("client")
    if not path:
        raise ValueError("the config's data.private.path is not set: the trial splits that "
                         "table by holder (give the in-cluster config of the table)")
    fmt = "parquet" if str(path).endswith(".parquet") or Path(path).is_dir() else "csv"
    table = ds.dataset(path, format=fmt).to_table()
    if label not in table.column_names:
        raise ValueError(f"data.private.label {label!r} is not a column of {path}")
    owners = (table.column(client).cast(pa.string()) if client
              else pa.array([str(i) for i in range(table.num_rows)]))
    keep = [c for c in table.column_names if c != client]
    table = table.select(keep)
    import numpy as np
    import pyarrow.parquet as pq
    # CSV, as a holder would keep a table; Parquet where a column is a list (image pixels)
    parquet = any(pa.types.is_list(t) or pa.types.is_fixed_size_list(t)
                  for t in table.schema.types)
    codes, inverse = np.unique(np.asarray(owners.to_pylist(), dtype=object).astype(str),
                               return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(len(codes) + 1))
    out = []
    for i in range(len(codes)):
        d = folder / f"holder-{i:05d}"
        d.mkdir(parents=True)
        rows = table.take(pa.array(order[bounds[i]:bounds[i + 1]]))
        if parquet:
            pq.write_table(rows, d / "data.parquet")
        else:
            pcsv.write_csv(rows, d / "data.csv")
        keygen(d / "key")
        out.append((d, rows.num_rows))
    return out


def data_file(d: Path) -> Path:
    return d / "data.parquet" if (d / "data.parquet").is_file() else d / "data.csv"


def write_registry(holders: list[tuple[Path, int]], path: Path) -> None:
    from holder.identity import load
    lines = [f"{load(d / 'key').key_id} {n}" for d, n in holders]
    path.write_text("# holder key, records (public under the job's relation)\n"
                    + "\n".join(lines) + "\n")


# ---------------------------------------------------------------------- processes

def _env(parties: Path) -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RKNN_BLOCK_LOG": str(parties / "blocked.log")}


def start_shuffler(parties: Path, registry: Path, operator_pub: Path,
                  relay: bool = False) -> tuple[subprocess.Popen, str]:
    """The service as its own process: a shuffler with its key, or (``relay``: the local and
    central models) a relay without one."""
    from rknn_ray.remote.parties import SHUFFLER_BLOCKED, party_command
    from shuffler.certs import make_certs
    from shuffler.service_files import save_layer_key
    sdir = parties / "shuffler"
    sdir.mkdir()
    if not relay:
        save_layer_key(sdir / "shuffler.key")
    certs = make_certs(sdir / "tls")
    key = ["--relay"] if relay else ["--key", str(sdir / "shuffler.key")]
    argv = party_command(sys.executable, SHUFFLER_BLOCKED, "shuffler service", [
        "shuffler", "serve", "--operator-key", str(operator_pub), "--holders", str(registry),
        *key, "--cert", str(certs.cert), "--cert-key",
        str(certs.key), "--store", str(sdir / "store"), "--port", "0", "--host", "127.0.0.1"])
    log = open(parties / "logs" / "shuffler.log", "ab")
    proc = subprocess.Popen(argv, cwd=ROOT, env=_env(parties), stdout=subprocess.PIPE,
                            stderr=log, text=True)
    line = proc.stdout.readline()
    if "serving " not in line:
        proc.wait(10)
        raise RuntimeError(f"the shuffler service did not start (see {parties}/logs/shuffler.log)")
    return proc, line.split("serving ", 1)[1].split()[0]


def _published(url: str, ca: Path) -> bool:
    from sealing.upload_client import fetch
    try:
        status, body = fetch(url, ca, "/status")
    except OSError:
        return False
    return status == 200 and bool(json.loads(body).get("published"))


def holder_commands(groups: list[list[Path]], url: str, ca: Path, operator_pub: Path,
                    parties: Path) -> list[list[str]]:
    from rknn_ray.remote.parties import HOLDER_BLOCKED, party_command
    cmds = []
    for n, group in enumerate(groups):
        common = [url, "--cafile", str(ca), "--operator-key", str(operator_pub), "--wait", "60"]
        if len(group) == 1:
            d = group[0]
            args = ["holder", "join", *common, "--key", str(d / "key"), "--data",
                    str(data_file(d)), "--ledger", str(d / "ledger.db")]
        else:
            pack = parties / "groups" / f"group-{n:04d}"
            pack.mkdir(parents=True)
            for d in group:              # the group's folder links its holders' own folders
                (pack / d.name).symlink_to(d, target_is_directory=True)
            args = ["holder", "join-many", *common, "--holders-dir", str(pack)]
        cmds.append(party_command(sys.executable, HOLDER_BLOCKED, "holder", args))
    return cmds


def run_holders(cmds: list[list[str]], parties: Path, parallel: int,
                running: dict | None = None) -> list[int]:
    """Each command its own process, ``parallel`` at once; their exit codes. ``running``:
    the caller's dict of the processes still running (stopped by it if the trial is ended)."""
    codes: list = [None] * len(cmds)
    running = {} if running is None else running
    at = 0
    while at < len(cmds) or running:
        while at < len(cmds) and len(running) < max(1, parallel):
            log = open(parties / "logs" / f"holders-{at:05d}.log", "ab")
            running[at] = subprocess.Popen(cmds[at], cwd=ROOT, env=_env(parties), stdout=log,
                                           stderr=subprocess.STDOUT)
            at += 1
        for i, proc in list(running.items()):
            if proc.poll() is not None:
                codes[i] = proc.returncode
                del running[i]
        time.sleep(0.05)
    return codes


class Terminated(Exception):
    """SIGTERM reached the trial: it stops its parties and exits 143."""


def _terminated(*_):
    raise Terminated()


def _stop(proc: subprocess.Popen | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# ---------------------------------------------------------------------- the trial

def operator_config(cfg, url: str, ca: Path, operator_key: Path, registry: Path,
                    window: float) -> dict:
    """The job's config: the table's public side, the registry in place of the private rows."""
    d = cfg.to_dict()
    label = (d["data"].get("private") or {}).get("label")
    d["data"]["private"] = {"label": label}
    d["cluster"]["holders"] = "remote"
    d["remote"] = {**d.get("remote", {}), "shuffler": url, "ca": str(ca),
                   "operator_key": str(operator_key), "registry": str(registry),
                   "window_s": float(window), "close_when_all": True}
    return d


def _trial(args) -> int:
    import yaml

    from jobs.config_files import resolve_config
    from rknn_ray.config import load_config
    from rknn_ray.remote.operator_key import public_file, save_operator_key

    for flag, value, low in (("--parallel", args.parallel, 1),
                             ("--holders-per-process", args.holders_per_process, 1),
                             ("--absent", args.absent, 0)):
        if value < low:
            raise ValueError(f"{flag} {value}: give {low} or more")
    if not 0 < args.window <= 7 * 86400:
        raise ValueError(f"--window {args.window:g}: give seconds in (0, 604800]")
    cfg = load_config(resolve_config(args.config), args.overrides)
    # absolute: the parties run from the project's folder, the user's paths are the user's
    out = Path(args.out).resolve()
    parties = Path(args.parties).resolve() if args.parties else Path(f"{out}.parties")
    ledger = Path(args.ledger).resolve()
    if parties.exists():
        raise ValueError(f"--parties {parties} exists; give a new folder (holders' keys and "
                         "ledgers are never reused by a trial)")
    (parties / "logs").mkdir(parents=True)
    t0 = time.time()
    holders = split_holders(cfg, parties / "holders")
    if args.absent > len(holders):
        shutil.rmtree(parties)     # made by this call a moment ago: the command can be rerun
        raise ValueError(f"--absent {args.absent}: the table has {len(holders)} holders; give "
                         f"at most {len(holders)}")
    registry = parties / "registry.txt"
    write_registry(holders, registry)
    operator_key = parties / "operator" / "operator.key"
    operator_key.parent.mkdir()
    save_operator_key(operator_key)
    print(f"rknn-ray trial: {len(holders)} holders ({sum(n for _, n in holders)} records), each "
          f"its own folder, key and ledger under {parties}/holders", flush=True)
    shuffler, job, codes, holders_running = None, None, [], {}
    signal.signal(signal.SIGTERM, _terminated)   # the finally below stops every party started
    try:
        relay = cfg.privacy.model != "shuffle"
        shuffler, url = start_shuffler(parties, registry, public_file(operator_key), relay)
        ca = parties / "shuffler" / "tls" / "ca.pem"
        print(f"rknn-ray trial: {'relay (no shuffling: the ' + cfg.privacy.model + ' model)' if relay else 'shuffler service'} "
              f"at {url} (its own process; TLS, private CA)", flush=True)
        op_cfg = parties / "operator" / "config.yaml"
        op_cfg.write_text(yaml.safe_dump(operator_config(cfg, url, ca, operator_key, registry,
                                                         args.window), sort_keys=False))
        import shlex
        job = subprocess.Popen([*shlex.split(args.operator_wrap),
                                sys.executable, "-m", "jobs.distill", "--config", str(op_cfg),
                                "--out", str(out), "--ledger", str(ledger)], cwd=ROOT,
                               env={**os.environ, "PYTHONPATH": _env(parties)["PYTHONPATH"]})
        while not _published(url, ca):
            if job.poll() is not None:
                return job.returncode
            time.sleep(0.5)
        per = max(1, int(args.holders_per_process))
        folders = [d for d, _ in holders][:max(0, len(holders) - max(0, int(args.absent)))]
        groups = [folders[i:i + per] for i in range(0, len(folders), per)]
        cmds = holder_commands(groups, url, ca, public_file(operator_key), parties)
        print(f"rknn-ray trial: the operator published its round; {len(cmds)} holder "
              f"process(es), {args.parallel} at a time"
              + (f"; {args.absent} holder(s) absent" if args.absent else ""), flush=True)
        codes = run_holders(cmds, parties, args.parallel, holders_running)
        code = job.wait()
    finally:
        for proc in list(holders_running.values()):
            _stop(proc)
        _stop(job)
        _stop(shuffler)
    failed = sum(c != 0 for c in codes)
    blocked = parties / "blocked.log"
    tried = blocked.read_text().split() if blocked.exists() else []
    print(f"rknn-ray trial: holder processes: {len(codes) - failed} ended 0, {failed} did not "
          f"(logs in {parties}/logs); imports the parties tried of what they must not use: "
          f"{len(tried)}; {time.time() - t0:.0f} s", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())

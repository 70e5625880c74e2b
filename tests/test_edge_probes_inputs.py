"""Edge probes (issue 49): bounded waits, no tracebacks on the new inputs, a calibration cache
that cannot be turned against a job.

One test per numbered item of the issue, each on real files, real processes and real
sockets: the exit code, the one line (with its fix) a person sees, and that nothing was
reserved in the privacy ledger. Every probe here is refused before Ray starts.
"""
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml

from jobs.distill import main
from rknn_ray.accounting.budget_store import BudgetStore
from tests.job_args import distill_args as _args
from tests.table_files import digits_parts, table_config, write, write_parts

ROOT = Path(__file__).resolve().parents[1]


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "Warning" not in err, err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("error: ") and "Fix:" in line, line
    return line


def _refused_job(tmp_path, cfg: dict, capsys, inputs=None) -> str:
    """A table job refused in one line with exit 2, no run folder and no budget."""
    path, out, ledger = tmp_path / "job.yaml", tmp_path / "run", tmp_path / "ledger.sqlite"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(path), "--out", str(out), "--ledger", str(ledger)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert not out.exists()
    assert not ledger.exists() or BudgetStore(str(ledger)).datasets() == []
    return line


def _env(tmp_path, **extra) -> dict:
    env = {**os.environ, "RKNN_RAY_LEDGER": str(tmp_path / "ledger.sqlite"),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", **extra}
    env.pop("RAY_ADDRESS", None)
    return env


# ---------------------------------------------------------------------- 1. bounded waits

@pytest.mark.parametrize("part", ["public", "private"])
def test_a_gs_uri_with_no_answer_is_one_line_within_the_bounded_wait(tmp_path, part):
    """gs:// with no network: pyarrow's first call waited 985 s and no signal ended it (the
    private part: still "loading table" after 180 s). Now the first contact is a child process
    given RKNN_RAY_REMOTE_WAIT_S (here 3 s), wherever the part is opened (the private part:
    by the scan, before any budget)."""
    write_parts(str(tmp_path), "csv")
    cfg = table_config(str(tmp_path), "csv", **{part: {"path": f"gs://rknn-ray-probe/x/{part}.csv"}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "jobs.distill", "--config",
                           str(tmp_path / "job.yaml"), "--out", str(tmp_path / "run")],
                          cwd=ROOT, env=_env(tmp_path, RKNN_RAY_REMOTE_WAIT_S="3"),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 2, done.stderr
    line = _one_error_line(done.stderr)
    assert f"gs://rknn-ray-probe/x/{part}.csv" in line and "did not answer within 3 s" in line
    assert "RKNN_RAY_REMOTE_WAIT_S" in line and time.monotonic() - started < 60
    assert not (tmp_path / "run").exists()
    ledger = tmp_path / "ledger.sqlite"
    assert not ledger.exists() or BudgetStore(str(ledger)).datasets() == []


def test_the_remote_check_is_interrupted_by_sigint_and_kills_its_child(tmp_path):
    """The wait is interruptible: SIGINT during the check ends it at once (exit 130 from
    KeyboardInterrupt) and leaves no child behind."""
    code = ("import sys; from rknn_ray.data.remote import check_remote\n"
            "print('checking', flush=True)\n"
            "try:\n    check_remote('gs://rknn-ray-probe/x', 'data.public', timeout=300)\n"
            "except KeyboardInterrupt:\n    print('interrupted', flush=True); sys.exit(130)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(tmp_path),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "checking"
        time.sleep(2)
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                  text=True).stdout.split()
        assert children, "no child process makes the first contact"
        proc.send_signal(2)
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 130 and "interrupted" in out
        for pid in children:
            assert not Path(f"/proc/{pid}").exists() or \
                Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    finally:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass


def _not_ray_listener(kind: str):
    """A TCP listener that accepts connections and is no Ray GCS: ``silent`` never speaks;
    ``http2`` answers HTTP/2's preface with a SETTINGS frame (as any gRPC server) and then
    nothing."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held = []

    def speak(conn):
        try:
            conn.recv(65536)
            conn.sendall(bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
            while conn.recv(65536):
                pass
        except OSError:
            pass

    def accept():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            held.append(conn)
            if kind == "http2":
                threading.Thread(target=speak, args=(conn,), daemon=True).start()
    threading.Thread(target=accept, daemon=True).start()
    return srv, held


@pytest.mark.parametrize("kind", ["silent", "http2"])
def test_a_ray_address_where_something_not_ray_listens_is_one_line_before_any_budget(
        tmp_path, kind):
    """The TCP check passed, eps was reserved and Ray retried for 214 s with 24 warnings.
    Now the check speaks to the port (gRPC's HTTP/2 handshake, then one call of Ray's GCS,
    each bounded by 5 s) before any budget is reserved."""
    srv, held = _not_ray_listener(kind)
    address = f"127.0.0.1:{srv.getsockname()[1]}"
    out = tmp_path / "addr"
    started = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "jobs.distill",
                               *_args("digits_central.yaml", out)], cwd=ROOT,
                              env={**_env(tmp_path), "RAY_ADDRESS": address},
                              capture_output=True, text=True, timeout=90)
    finally:
        srv.close()
        for c in held:
            c.close()
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_error_line(done.stdout + done.stderr)
    assert "RAY_ADDRESS" in line and address in line and "not a Ray cluster" in line
    assert not out.exists() and not (tmp_path / "ledger.sqlite").exists()
    assert time.monotonic() - started < 40


# ---------------------------------------------------------------------- 2. image folders

def _png(path: Path, width: int, height: int) -> None:
    """A PNG of ``width`` x ``height`` 8-bit grey pixels, written by hand (a 20000 x 20000
    header costs no memory: PIL refuses it from the header)."""
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = zlib.compress(b"".join(b"\0" + bytes(width) for _ in range(min(height, 64))))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height,
                                                                      8, 0, 0, 0, 0))
                     + chunk(b"IDAT", raw) + chunk(b"IEND", b""))


def _image_parts(tmp_path: Path) -> dict:
    for part, layout in (("private", "classes"), ("public", "flat")):
        for i in range(12):
            folder = tmp_path / part / (str(i % 2) if layout == "classes" else "")
            folder.mkdir(parents=True, exist_ok=True)
            _png(folder / f"{i:03d}.png", 8, 8)
    return {"data": {"dataset": "image_folder", "classes": [0, 1],
                     "private": {"path": str(tmp_path / "private")},
                     "public": {"path": str(tmp_path / "public")}},
            "privacy": {"model": "central", "mechanism": "laplace", "eps": 2.0},
            "queries": {"s": 4}, "run": {"progress": False}}


@pytest.mark.parametrize("fault", ["empty first png", "decompression bomb", "folder named png"])
def test_a_bad_file_in_a_public_image_folder_is_one_line(tmp_path, capsys, fault):
    cfg = _image_parts(tmp_path)
    public = tmp_path / "public"
    if fault == "empty first png":
        (public / "000.png").write_bytes(b"")
        want = "000.png' is an empty file"
    elif fault == "decompression bomb":
        _png(public / "005.png", 20000, 20000)
        want = "005.png' is too large to decode safely (Image size (400000000 pixels) exceeds"
    else:
        (public / "000.png").unlink()
        (public / "000.png").mkdir()
        want = "000.png' is a folder, not an image"
    line = _refused_job(tmp_path, cfg, capsys)
    assert want in line, line


# ---------------------------------------------------------------------- 4. values in messages

def test_values_quoted_in_messages_are_bounded_and_inf_is_refused_like_nan(tmp_path, capsys):
    priv, pub, ev = digits_parts(n_private=200, n_public=100)
    write(priv, str(tmp_path / "private.parquet"))
    write(pub, str(tmp_path / "public.parquet"))
    label = ev.column("label").to_pylist()
    label[3] = "y" * 1_000_000
    import pyarrow as pa
    write(ev.set_column(ev.column_names.index("label"), "label", pa.array([str(v) for v in label])),
          str(tmp_path / "evaluation.parquet"))
    line = _refused_job(tmp_path, table_config(str(tmp_path)), capsys)
    assert "not in data.classes" in line and len(line) < 600 and "1,000,002 characters" in line
    # an inf in the evaluation part is refused as a NaN is
    p0 = ev.column("p0").to_numpy().copy()
    p0[5] = np.inf
    write(ev.set_column(0, "p0", pa.array(p0)), str(tmp_path / "evaluation.parquet"))
    line = _refused_job(tmp_path, table_config(str(tmp_path)), capsys)
    assert "data.evaluation" in line and "NaN or infinite" in line and "'p0'" in line
    # an inf in the public part: one line, no numpy RuntimeWarning before it
    write(ev, str(tmp_path / "evaluation.parquet"))
    q0 = pub.column("p0").to_numpy().copy()
    q0[7] = -np.inf
    write(pub.set_column(0, "p0", pa.array(q0)), str(tmp_path / "public.parquet"))
    line = _refused_job(tmp_path, table_config(str(tmp_path)), capsys)
    assert "data.public" in line and "NaN or infinite" in line


def test_a_header_only_public_csv_holds_no_rows(tmp_path, capsys):
    write_parts(str(tmp_path), "csv")
    header = (tmp_path / "public.csv").read_text().splitlines()[0]
    (tmp_path / "public.csv").write_text(header + "\n")
    line = _refused_job(tmp_path, table_config(str(tmp_path), "csv"), capsys)
    assert "data.public" in line and "holds no rows" in line and "type null" not in line


# ---------------------------------------------------------------------- 6. in-memory data

def test_in_memory_data_with_a_missing_label_column_names_the_data_not_a_path(tmp_path):
    from rknn_ray.config import Config
    from tests.table_files import prepared_table
    from rknn_ray.errors import DataError
    priv, pub, _ = digits_parts(n_private=200, n_public=100)
    cfg = Config.from_dict(table_config("/nowhere/cfg-folder", evaluation=None))
    cfg = cfg.with_overrides(["data.evaluation=null", "data.private.label=nope"])
    with pytest.raises(DataError) as info:
        prepared_table(cfg, {"private": priv, "public": pub})
    text = str(info.value)
    assert "'nope' not found in the data given in memory" in text and "/nowhere" not in text


# ---------------------------------------------------------------------- 7. budget set

def test_budget_set_refuses_an_eps_that_limits_nothing(tmp_path):
    ledger = tmp_path / "l.sqlite"
    BudgetStore(str(ledger)).set_budget("d", 4.0, 0.0)
    for eps in ("1e300", "101"):
        done = subprocess.run([sys.executable, "-m", "jobs.cli", "budget", "set", "d", "--eps", eps,
                               "--ledger", str(ledger)], cwd=ROOT, env=_env(tmp_path),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done.stdout
        line = _one_error_line(done.stderr)
        assert "at most 100" in line
    assert BudgetStore(str(ledger)).budget("d")[0] == 4.0
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "budget", "set", "d", "--eps", "100",
                           "--ledger", str(ledger)], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and BudgetStore(str(ledger)).budget("d")[0] == 100.0


# ---------------------------------------------------------------------- 3. the calibration cache

_CALIBRATE = """
import sys
from rknn_ray.accounting.bound_choice import round_bound
from rknn_ray.accounting.calibration_cache import cached_local_eps0
print(repr(cached_local_eps0(round_bound("clones_numerical"), 2.0, 1079, 1e-6)), flush=True)
"""


def _calibrate(folder: Path) -> tuple[float, str]:
    """(eps0, stderr) of a fresh process calibrating with ``folder`` as its cache (a hang or
    a MemoryError there fails the probe: 60 s, 2 GiB of address space)."""
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 ** 31, 2 ** 31))
    done = subprocess.run([sys.executable, "-c", _CALIBRATE], cwd=ROOT, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(ROOT), "RKNN_RAY_CACHE_DIR": str(folder)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return float(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.fixture(scope="module")
def one_entry(tmp_path_factory):
    """(a cache folder holding the one entry a calibration writes, the entry, its eps0)."""
    folder = tmp_path_factory.mktemp("cal") / "cache"
    eps0, err = _calibrate(folder)
    (entry,) = folder.glob("eps0-*.json")
    assert err == ""
    return folder, entry, eps0


@pytest.mark.parametrize("kind", ["fifo", "symlink to /dev/zero", "oversized"])
def test_a_cache_entry_that_is_no_regular_file_is_ignored_in_one_line(one_entry, tmp_path, kind):
    """A FIFO in place of an entry hung the job; a symlink to /dev/zero allocated until
    MemoryError. Now each is ignored with one line and replaced by a fresh calibration."""
    import shutil
    folder, entry, eps0 = one_entry
    cache = tmp_path / "cache"
    shutil.copytree(folder, cache)
    cache.chmod(0o700)
    target = cache / entry.name
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
        want = "not a regular file"
    elif kind == "symlink to /dev/zero":
        target.symlink_to("/dev/zero")
        want = "a symbolic link"
    else:
        target.write_text(" " * (1 << 20) + entry.read_text())    # valid JSON, 1 MiB of it
        want = "larger than 64 KiB"
    got, err = _calibrate(cache)
    assert got == eps0
    (line,) = err.strip().splitlines()
    assert str(target) in line and want in line
    assert target.is_file() and not target.is_symlink() and target.stat().st_size < 4096


def test_a_cache_folder_others_can_write_is_not_read(one_entry, tmp_path):
    """A smaller eps0 passes the bound's check (less utility, still private): planted in a
    folder anyone can write, it was used silently. Now that folder is not read at all."""
    import json
    import shutil
    folder, entry, eps0 = one_entry
    cache = tmp_path / "shared-cache"
    shutil.copytree(folder, cache)
    planted = json.loads(entry.read_text())
    planted["eps0"] = eps0 / 4
    (cache / entry.name).write_text(json.dumps(planted))
    cache.chmod(0o777)
    got, err = _calibrate(cache)
    assert got == eps0
    (line,) = err.strip().splitlines()
    assert str(cache) in line and "mode 777" in line and f"chmod go-w {cache}" in line
    assert json.loads((cache / entry.name).read_text())["eps0"] == eps0 / 4    # left alone
    cache.chmod(0o700)                                 # the owner's own folder: used
    assert _calibrate(cache) == (eps0 / 4, "")
    assert oct(folder.stat().st_mode & 0o777) == "0o700"      # the folder it made: owner-only

"""The ledger file at the edges (issue 18): a path that is not a valid ledger is refused and
left untouched (exit 2, names the file, says how to inspect or restore it, never suggests
starting afresh); a lock is waited on for a bounded, stated time; `rknn-ray budget` never
prints a traceback."""
import os
import subprocess
import sys

import pytest

from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.errors import LedgerError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _budget(*args, env=None):
    """`rknn-ray budget ARGS` run in this process: its exit code and its two streams. (A fresh
    interpreter per call cost ~1.5 CPU s of imports, nine times over.) An exception escaping
    the CLI is printed as the traceback a user would see, so "no traceback" still bites;
    test_a_job_on_a_damaged_ledger_exits_2_before_any_work keeps a real process."""
    import contextlib
    import io
    import traceback
    import types
    from unittest import mock

    from jobs.cli import main
    out, err = io.StringIO(), io.StringIO()
    with mock.patch.dict(os.environ, env or {}), contextlib.redirect_stdout(out), \
            contextlib.redirect_stderr(err):
        try:
            code = main(["budget", *args])
        except SystemExit as exc:                  # argparse, or the CLI itself
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except Exception:                          # noqa: BLE001 - what `python -m` would show
            traceback.print_exc()
            code = 1
    return types.SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def _refused_untouched(result, path, before: bytes, cause: str):
    assert result.returncode == 2, result.stderr
    err = result.stderr
    assert "Traceback" not in err and "Traceback" not in result.stdout
    assert str(path) in err and cause in err
    assert "restore the ledger from a backup" in err and "integrity_check" in err   # the fix
    assert "writable" not in err and "afresh" not in err and "new ledger at" not in err
    assert open(path, "rb").read() == before                                     # untouched


def _ledger_with_spend(path):
    store = BudgetStore(str(path))
    for i in range(30):
        store.reserve(f"ds{i % 3}", "d", f"job-{i}", 0.1, 0.0, (100.0, 0.0))
    return store


def test_a_zero_byte_file_is_refused_not_used_as_a_new_ledger(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"")
    _refused_untouched(_budget("list", "--ledger", str(path)), path, b"", "empty (0 bytes)")
    with pytest.raises(LedgerError, match="empty"):
        BudgetStore(str(path))
    assert path.read_bytes() == b""


def test_a_file_that_is_not_sqlite_is_refused(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"budget: 20\n" * 50)
    _refused_untouched(_budget("list", "--ledger", str(path)), path, path.read_bytes(),
                       "not an SQLite database")


def test_random_bytes_inside_a_page_are_refused_without_a_traceback(tmp_path):
    path = tmp_path / "ledger.sqlite"
    _ledger_with_spend(path)
    data = bytearray(path.read_bytes())
    page = 4096 * 3                                # the releases table's root page (rootpage 4)
    data[page + 16: page + 272] = os.urandom(256)
    path.write_bytes(bytes(data))
    before = path.read_bytes()
    result = _budget("list", "--ledger", str(path))
    _refused_untouched(result, path, before, "is not a valid rknn-ray privacy ledger")
    assert _budget("set", "ds0", "--eps", "200", "--ledger", str(path)).returncode == 2


def test_a_sqlite_file_without_the_ledger_tables_is_refused(tmp_path):
    import sqlite3
    path = tmp_path / "other.sqlite"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE notes (x TEXT)")
    con.commit()
    con.close()
    _refused_untouched(_budget("list", "--ledger", str(path)), path, path.read_bytes(),
                       "no datasets table")


HOLD = """
import sqlite3, sys
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("PRAGMA locking_mode=EXCLUSIVE")
con.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.readline()
"""


def test_a_locked_ledger_is_waited_on_for_a_stated_time_then_refused(tmp_path):
    path = tmp_path / "ledger.sqlite"
    _ledger_with_spend(path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        env = {"RKNN_RAY_LEDGER_TIMEOUT": "1"}
        for args in (["list"], ["set", "ds0", "--eps", "200"]):
            result = _budget(*args, "--ledger", str(path), env=env)
            assert result.returncode == 2, result.stderr
            assert "Traceback" not in result.stderr
            assert "is locked by another process; waited 1 s" in result.stderr
            assert "RKNN_RAY_LEDGER_TIMEOUT" in result.stderr and str(path) in result.stderr
        os.environ["RKNN_RAY_LEDGER_TIMEOUT"] = "0.5"
        try:
            with pytest.raises(LedgerError, match="locked"):
                BudgetStore(str(path)).reserve("ds0", "d", "job-x", 0.1, 0.0, (100.0, 0.0))
        finally:
            del os.environ["RKNN_RAY_LEDGER_TIMEOUT"]
    finally:
        holder.stdin.write("\n")
        holder.stdin.close()
        holder.wait(30)
    assert BudgetStore(str(path)).spent("ds0").eps == pytest.approx(1.0)   # nothing lost


def test_a_bad_lock_timeout_names_the_variable(tmp_path):
    BudgetStore(str(tmp_path / "l.sqlite"))
    result = _budget("list", "--ledger", str(tmp_path / "l.sqlite"),
                     env={"RKNN_RAY_LEDGER_TIMEOUT": "soon"})
    assert result.returncode == 2 and "RKNN_RAY_LEDGER_TIMEOUT" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_job_on_a_damaged_ledger_exits_2_before_any_work(tmp_path):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"")
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "jobs.distill", "--config",
                             "jobs/configs/digits_central.yaml", "--quiet", "--ledger", str(path),
                             "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "empty (0 bytes)" in result.stderr and "Traceback" not in result.stderr
    assert "Started a local Ray instance" not in result.stderr and not out.exists()
    assert path.read_bytes() == b""


def test_looking_at_a_ledger_that_does_not_exist_creates_nothing(tmp_path):
    path = tmp_path / "typo" / "ledger.sqlite"
    listed = _budget("list", "--ledger", str(path))
    assert listed.returncode == 0 and "does not exist yet" in listed.stdout
    refused = _budget("set", "pool-x", "--eps", "5", "--ledger", str(path))
    assert refused.returncode == 2 and "there is no privacy ledger at" in refused.stderr
    assert not path.exists() and not path.parent.exists()

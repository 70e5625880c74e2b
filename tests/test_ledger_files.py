"""Issue 55 items 5-7: the ledger's files and budget, refused in one line before any work.

- A ledger (or its release key, or a file SQLite keeps beside it) that is not a regular
  file -- a FIFO, a directory, a device -- is refused before anything opens it: a FIFO used
  to hang `rknn-ray budget`, `jobs.distill` and `rknn_ray.run(ledger=...)` for ever.
- ``privacy.budget_eps`` is capped like `rknn-ray budget set` (one constant).
- A ledger copied without its ``.key``: `--resume` (and a new job) names the missing key
  before the data, Ray or the scan; a new key is made for a ledger that never had one only.

Every command here is a real process (the CLI as a subprocess, under a timeout).
"""
import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from rknn_ray.accounting.budget_store import KEY_CHECK, BudgetStore
from rknn_ray.accounting.units import MAX_BUDGET_EPS
from rknn_ray.errors import LedgerError
from tests.job_args import distill_args
from tests.test_edge_probes_release import saved_release  # noqa: F401 - a module fixture

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(args, timeout=90, **env):
    """(exit code, stdout, stderr, seconds) of ``python <args>`` in the repository."""
    environ = {**os.environ, "PYTHONPATH": REPO, **env}
    environ.pop("RKNN_RAY_LEDGER", None)
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=environ, capture_output=True,
                          text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - t0


def _one_error_line(out: str, err: str) -> str:
    """The command's one line: ``error: ...``, with nothing else on either stream."""
    assert "Traceback" not in err and "Traceback" not in out, err
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), out + err
    assert "Fix:" in lines[0]
    return lines[0]


# ---------------------------------------------------------------- 5. not a regular file

def _not_files(tmp_path):
    fifo = tmp_path / "fifo.sqlite"
    os.mkfifo(fifo)
    folder = tmp_path / "folder.sqlite"
    folder.mkdir()
    link = tmp_path / "link.sqlite"
    link.symlink_to(fifo)                        # a link is followed: its target is a FIFO
    dangling = tmp_path / "dangling.sqlite"
    dangling.symlink_to(tmp_path / "nowhere")
    return {"a FIFO (named pipe)": fifo, "a directory": folder, "a FIFO (via a link)": link,
            "a symbolic link to nothing": dangling, "a character device": "/dev/null"}


def test_a_ledger_that_is_not_a_regular_file_is_refused_at_once_by_every_command(tmp_path):
    """`rknn-ray budget` (list, set, settle), `jobs.distill` and `rknn_ray.run(ledger=...)`
    on a FIFO, a directory, a link to a FIFO, a dangling link or /dev/null: one line naming
    the ledger and what it is, exit 2, in seconds; nothing is made in its place."""
    api = ("import sys, rknn_ray\n"
           "from rknn_ray.errors import RknnError\n"
           "try:\n"
           "    rknn_ray.run('digits_central', ledger=sys.argv[1], out_dir=sys.argv[2])\n"
           "except RknnError as exc:\n"
           "    print('error:', exc, file=sys.stderr); sys.exit(2)\n")
    for kind, path in _not_files(tmp_path).items():
        word = kind.split(" (via")[0]
        every = kind in ("a FIFO (named pipe)", "a directory")     # the rest: two commands
        for args in [["-m", "jobs.budget", "--ledger", str(path)],
                     ["-m", "jobs.budget", "set", "pool-x", "--eps", "2", "--ledger", str(path)],
                     ["-m", "jobs.budget", "settle", "job-x", "--ledger", str(path)],
                     ["-m", "jobs.distill", *distill_args("digits_central.yaml", tmp_path / "run"),
                      "--ledger", str(path)],
                     ["-c", api, str(path), str(tmp_path / "api-run")]][::1 if every else 3]:
            rc, out, err, took = _cli(args, timeout=120)
            line = _one_error_line(out, err)
            assert rc == 2 and took < 60, (kind, args, took)
            assert str(path) in line and f"is {word}" in line and "ledger" in line, line
            assert not (tmp_path / "run").exists()
            assert not os.listdir(tmp_path / "api-run") if (tmp_path / "api-run").exists() \
                else True                     # the library's prepared folder stays empty
        if kind != "a character device":
            assert not os.path.exists(str(path) + ".key")


def test_a_release_key_or_wal_file_that_is_not_a_regular_file_is_refused(tmp_path):
    """The ledger is fine, the file beside it is a FIFO: refused by name, nothing opened."""
    ledger = str(tmp_path / "ledger.sqlite")
    BudgetStore(ledger)
    os.mkfifo(ledger + ".key")
    rc, out, err, took = _cli(["-m", "jobs.distill", *distill_args(
        "digits_central.yaml", tmp_path / "run"), "--ledger", ledger])
    line = _one_error_line(out, err)
    assert rc == 2 and took < 60
    assert "release key" in line and "is a FIFO (named pipe)" in line, line
    os.unlink(ledger + ".key")
    for side in ("-wal", "-shm"):
        os.mkfifo(ledger + side)
        rc, out, err, _ = _cli(["-m", "jobs.budget", "--ledger", ledger], timeout=60)
        line = _one_error_line(out, err)
        assert rc == 2 and f"{side[1:]} file is a FIFO" in line, line
        os.unlink(ledger + side)
    rc, out, err, _ = _cli(["-m", "jobs.budget", "--ledger", ledger], timeout=60)
    assert rc == 0 and "Traceback" not in err


# ---------------------------------------------------------------- 6. privacy.budget_eps capped

def test_a_config_budget_above_the_cap_is_refused_like_budget_set(tmp_path):
    """privacy.budget_eps: 1e300 is refused in one line naming the key and the cap `budget
    set` uses (one constant), before any ledger is made; the cap itself is accepted."""
    ledger = tmp_path / "ledger.sqlite"
    for value in ("1e300", "100.5"):
        rc, out, err, _ = _cli(["-m", "jobs.distill", *distill_args(
            "digits_central.yaml", tmp_path / "run", f"privacy.budget_eps={value}"),
            "--ledger", str(ledger)])
        line = _one_error_line(out, err)
        assert rc == 2 and "privacy.budget_eps" in line and f"above {MAX_BUDGET_EPS:g}" in line
        assert f"set privacy.budget_eps to at most {MAX_BUDGET_EPS:g}" in line
        assert not ledger.exists() and not (tmp_path / "run").exists()
    from rknn_ray.config import load_config
    cfg = load_config(os.path.join(REPO, "jobs", "configs", "digits_central.yaml"),
                      [f"privacy.budget_eps={MAX_BUDGET_EPS:g}"])
    assert cfg.privacy.budget_eps == MAX_BUDGET_EPS
    import jobs.budget
    assert jobs.budget.MAX_BUDGET_EPS is MAX_BUDGET_EPS         # the one constant


# ---------------------------------------------------------------- 7. the missing release key

def _ledger_rows(path) -> list:
    con = sqlite3.connect(path)
    try:
        return con.execute("SELECT job_id, status, eps FROM releases ORDER BY id").fetchall()
    finally:
        con.close()


def test_resume_with_a_ledger_copied_without_its_key_names_the_key_before_any_work(
        saved_release, tmp_path):      # noqa: F811 - the imported fixture
    """A run folder and its ledger copied without ``ledger.sqlite.key``: `--resume` says the
    key is missing and where to put it, in one line, exit 2, in seconds, before loading the
    data or starting Ray (no stage line at all); no key is made, nothing in the ledger
    changes; a new job on that ledger is refused the same way (no reservation). With the key
    copied back the same resume gets past the check."""
    out, ledger = saved_release
    run = tmp_path / "run"
    shutil.copytree(out, run)
    copied = tmp_path / ledger.name
    for f in ledger.parent.glob(ledger.name + "*"):
        if not f.name.endswith(".key"):
            shutil.copy(f, tmp_path / f.name)
    key = str(copied) + ".key"
    before = _ledger_rows(copied)
    rc, out_text, err, took = _cli(["-m", "jobs.distill", "--resume", str(run),
                                    "--ledger", str(copied)])
    assert "Traceback" not in err
    lines = [line for line in (out_text + err).splitlines() if line.strip()]
    assert len(lines) == 1, lines                 # no "loading", no "starting Ray" line
    (line,) = lines
    print(f"--resume refused in {took:.1f} s: {line}")
    assert rc == 2 and line.startswith("error: ") and took < 10, (took, line)
    assert f"the ledger's release key {key} is missing: copy it beside the ledger" in line
    assert not os.path.exists(key) and _ledger_rows(copied) == before
    assert not (run / "report.json").exists() and (run / "release.npz").exists()

    rc, out_text, err, took = _cli(["-m", "jobs.distill", *distill_args(
        "digits_central.yaml", tmp_path / "new"), "--ledger", str(copied)])
    line = _one_error_line(out_text, err)
    assert rc == 2 and "release key" in line and "is missing" in line and took < 30
    assert not os.path.exists(key) and _ledger_rows(copied) == before   # no reservation

    shutil.copy(str(ledger) + ".key", key)        # the key back: past the check (the release's
    store = BudgetStore(str(copied))              # tag verifies under it)
    from rknn_ray.job.release_file import check_release, release_tag_key
    check_release(str(run), release_tag_key(store))


def test_a_new_key_is_made_for_a_ledger_that_never_had_one_only(tmp_path):
    """A new ledger gets its key (and records a check of it); deleting the key afterwards,
    or putting another ledger's key beside it, is refused; a ledger from before the check
    that has recorded releases and no key is refused too (its releases were tagged under
    a key it lost); one with no release gets a key."""
    path = str(tmp_path / "a.sqlite")
    store = BudgetStore(path)
    first = store.side_key("release.npz")
    assert os.stat(path + ".key").st_mode & 0o777 == 0o600
    assert BudgetStore(path).side_key("release.npz") == first          # the same key again
    os.rename(path + ".key", path + ".key.saved")
    with pytest.raises(LedgerError, match="release key .*a.sqlite.key is missing: copy it "
                                          "beside the ledger"):
        BudgetStore(path).side_key("release.npz")
    assert not os.path.exists(path + ".key")
    other = str(tmp_path / "b.sqlite")
    BudgetStore(other).side_key("release.npz")
    shutil.copy(other + ".key", path + ".key")
    with pytest.raises(LedgerError, match="is not the release key of the ledger"):
        BudgetStore(path).side_key("release.npz")
    os.replace(path + ".key.saved", path + ".key")
    assert BudgetStore(path).side_key("release.npz") == first

    # a ledger written before the check: its key file gone, releases recorded
    old = str(tmp_path / "old.sqlite")
    store = BudgetStore(old)
    store.reserve("pool-a", "digits: record pool", "job-1", 1.0, 0.0, (5.0, 1e-6))
    con = sqlite3.connect(old)
    con.execute("UPDATE releases SET status = 'released'")
    con.execute("DELETE FROM meta WHERE key = ?", (KEY_CHECK,))
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="is missing"):
        BudgetStore(old).side_key("release.npz")
    con = sqlite3.connect(old)
    con.execute("DELETE FROM releases")
    con.commit()
    con.close()
    BudgetStore(old).side_key("release.npz")                  # no release: a key is made
    assert os.path.isfile(old + ".key")


def test_a_refusal_never_suggests_a_budget_above_the_cap(tmp_path):
    """A job whose total eps is above the cap is told to lower privacy.eps: the `rknn-ray
    budget set` command a refusal otherwise quotes would itself be refused."""
    from rknn_ray.errors import PrivacyBudgetError
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    store.reserve("pool-a", "digits: record pool", "job-1", 1.0, 0.0, (20.0, 1e-6))
    with pytest.raises(PrivacyBudgetError) as refused:
        store.reserve("pool-a", "digits: record pool", "job-2", 150.0, 0.0, (20.0, 1e-6))
    assert f"Fix: lower privacy.eps: the total eps=151 is above {MAX_BUDGET_EPS:g}" \
        in str(refused.value) and "budget set pool-a" not in str(refused.value)
    with pytest.raises(PrivacyBudgetError, match="budget set pool-a --eps 31"):
        store.reserve("pool-a", "digits: record pool", "job-3", 30.0, 0.0, (20.0, 1e-6))

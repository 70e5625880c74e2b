"""SIGTERM to the suite leaves no process behind (issue 57; tests/run_cleanup.py).

A nested ``pytest -n 2`` with the suite's conftest runs, on each worker, a test that starts
the worker's Ray and (on the first worker) a job-like process in a session of its own with its
own Ray (whose agents overwrite their environment with their titles), then sleeps; once both
are up, the run is sent SIGTERM, as a CI runner or a user's ``kill``
does. Every process of that run -- its xdist workers, their Ray (GCS, raylet, agents, worker
processes) -- is gone afterwards, and it ended as an interrupt (its fixtures torn down), not
with pluggy's teardown warning.
"""
import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.run_cleanup import RAY_DIR, RUN_DIR, RUN_OWNER, run_members, worker_groups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sigterm_to_the_suite_leaves_no_process_behind(tmp_path):
    markers, run_dir = tmp_path / "markers", tmp_path / "run"
    markers.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in (RUN_OWNER,) and not k.startswith("PYTEST_")}
    env.update({RUN_DIR: str(run_dir), "SLEEPING_RAY_MARKERS": str(markers),
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": ROOT})
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "each",
         "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "nested"),
         os.path.join("tests", "fixtures", "sleeping_ray_tests.py")],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while len(os.listdir(markers)) < 2 and time.monotonic() < deadline \
                and proc.poll() is None:
            time.sleep(0.5)
        assert len(os.listdir(markers)) == 2, proc.communicate(timeout=60)[0][-3000:]
        with _reading(run_dir):                                  # the nested run's members
            groups = worker_groups()
            running = set(run_members(groups))
        # the first worker's job-like process (a session of its own, its own Ray): the processes
        # holding that Ray's session files, found here without the sweep's rules
        sessions = [s for m in os.listdir(markers) if (s := (markers / m).read_text())]
        assert len(sessions) == 1, sessions
        own = {p for s in sessions for p in _holding(s)}
        running |= own
        names = {p: _name(p) for p in running}
        assert len(groups) == 2 and any("gcs_server" in n for n in names.values()), names
        assert sum("Agent" in names[p] for p in own) >= 2, {p: names[p] for p in own}
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:            # the check failed: end the nested run by force
            os.killpg(proc.pid, signal.SIGKILL)
            with _reading(run_dir):
                for pid in run_members(worker_groups()):
                    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    left = {p: names[p] for p in running if _alive(p)}
    assert not left, (left, out[-2000:])
    assert "KeyboardInterrupt" in out and "PluggyTeardownRaisedWarning" not in out, out[-2000:]
    assert not run_dir.exists()                   # the run's folder went with it


def _name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return "?"


@contextlib.contextmanager
def _reading(run_dir):
    """run_members() of the nested run: its folder; not this run's Ray folder (whose processes,
    this session's Ray, are not the nested run's)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(RUN_DIR, str(run_dir))
        mp.delenv(RAY_DIR, raising=False)
        yield


def _holding(folder: str) -> set[int]:
    """Pids with a file under ``folder`` open."""
    found = set()
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}").startswith(folder.rstrip("/") + "/"):
                    found.add(int(name))
                    break
            except OSError:
                continue
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

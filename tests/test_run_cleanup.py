"""SIGTERM to the suite leaves no process behind (issue 57; tests/run_cleanup.py).

A nested ``pytest -n 2`` with the suite's conftest runs, on each worker, a test that starts the
worker's Ray and sleeps; once both are up, the run is sent SIGTERM, as a CI runner or a user's ``kill``
does. Every process of that run -- its xdist workers, their Ray (GCS, raylet, agents, worker
processes) -- is gone afterwards, and it ended as an interrupt (its fixtures torn down), not
with pluggy's teardown warning.
"""
import os
import signal
import subprocess
import sys
import time

from tests.run_cleanup import RUN_DIR, RUN_OWNER, run_members, worker_groups

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
        os.environ[RUN_DIR], saved = str(run_dir), os.environ[RUN_DIR]   # read the nested run
        try:
            groups = worker_groups()
            running = set(run_members(groups))
        finally:
            os.environ[RUN_DIR] = saved
        names = {p: _name(p) for p in running}
        assert len(groups) == 2 and any("gcs_server" in n for n in names.values()), names
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:            # the check failed: end the nested run by force
            os.killpg(proc.pid, signal.SIGKILL)
            os.environ[RUN_DIR], saved = str(run_dir), os.environ[RUN_DIR]
            try:
                for pid in run_members(worker_groups()):
                    os.kill(pid, signal.SIGKILL)
            finally:
                os.environ[RUN_DIR] = saved
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


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

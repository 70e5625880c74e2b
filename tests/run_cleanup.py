"""A test run that leaves no process behind, however it ends (issue 57).

Stopped by SIGTERM, pytest used to die at once: its xdist workers and the Ray processes they
had started (dashboard and runtime-env agents, re-parented to init, which ignore SIGTERM and
overwrite their environment with their process title) kept running. Now:

* SIGTERM becomes KeyboardInterrupt, so pytest tears its fixtures down (``ray.shutdown``) as
  it does for Ctrl-C, and the controller passes SIGTERM on to its xdist workers;
* each xdist worker leads a process group of its own (everything it starts -- its Ray, the
  jobs the tests run and their Ray -- is in it) and asks the kernel for SIGTERM when its
  controller dies (``PR_SET_PDEATHSIG``);
* when the run ends, however it ends, the controller ends what is left in those groups, and
  every process whose environment names the run's folder (``RKNN_RAY_TEST_RUN_DIR``, one file
  per worker group in it; Ray's worker processes lead groups of their own but keep their
  environment): SIGTERM, then SIGKILL after a grace.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import tempfile
import time

RUN_DIR = "RKNN_RAY_TEST_RUN_DIR"
RUN_OWNER = "RKNN_RAY_TEST_RUN_OWNER"     # the controller's pid: only it sweeps
RAY_DIR = "RKNN_RAY_TEST_RAY_DIR"         # the run's RAY_TMPDIR
PR_SET_PDEATHSIG = 1
GRACE_S = 5.0


def start_run() -> str:
    """The run's folder of worker groups (the controller makes it; workers inherit it), and
    a folder of the run's own for Ray's temporary files (``RAY_TMPDIR``: every Ray the run
    starts keeps its session files there)."""
    if not os.environ.get(RUN_DIR):
        os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="rknn-ray-test-run-")
        os.environ[RUN_OWNER] = str(os.getpid())
        _own_ray_folder()
    elif not os.environ.get(RUN_OWNER):      # a folder given, no owner: this process starts
        os.makedirs(os.environ[RUN_DIR], mode=0o700, exist_ok=True)      # the run (tests)
        os.environ[RUN_OWNER] = str(os.getpid())
        _own_ray_folder()
    return os.environ[RUN_DIR]


def _own_ray_folder() -> None:
    """A short folder of the run's own for RAY_TMPDIR (Ray's socket paths must stay under 108
    bytes, so not inside a test's deep tmp_path)."""
    os.environ[RAY_DIR] = os.environ["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rknn-ray-test-ray-")


def owns_run() -> bool:
    """This process started the run (a pytest a test starts inherits the run: not its own)."""
    return os.environ.get(RUN_OWNER) == str(os.getpid())


def stop_on_sigterm(worker: bool) -> None:
    """SIGTERM -> KeyboardInterrupt here; a worker leads its own process group (recorded in
    the run's folder) and is sent SIGTERM when its controller dies."""
    if worker:
        os.setpgid(0, 0)
        with open(os.path.join(start_run(), f"group-{os.getpid()}"), "w") as fh:
            fh.write(str(os.getpid()))
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):     # not Linux / glibc: the sweep still runs
            pass

    def interrupt(signum, frame):
        signal.signal(signum, signal.SIG_IGN)      # once: teardown may take a while
        if owns_run():          # the workers lead their own groups: Ctrl-C no longer reaches
            for group in worker_groups():          # them from the terminal, so pass it on
                _signal_group(group, signal.SIGTERM)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, interrupt)
    if not worker:
        signal.signal(signal.SIGINT, interrupt)


def worker_groups() -> list[int]:
    folder = os.environ.get(RUN_DIR)
    if not folder or not os.path.isdir(folder):
        return []
    return [int(name.split("-", 1)[1]) for name in os.listdir(folder) if name.startswith("group-")]


def run_members(groups: list[int]) -> list[int]:
    """Live pids (not this one) of the run: in one of the workers' ``groups``, with the
    run's folder in their environment (Ray's worker processes lead groups of their own), or
    with a file open in it (Ray's dashboard and runtime-env agents overwrite their environment
    with their title, and a job started in a session of its own takes them out of the
    groups; they keep their session's logs open, and RAY_TMPDIR puts those in the run's
    Ray folder)."""
    want, mine, found = set(groups), os.getpid(), []
    tag = f"{RUN_DIR}={os.environ.get(RUN_DIR)}".encode()
    folders = [f for f in (os.environ.get(RUN_DIR), os.environ.get(RAY_DIR)) if f]
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == mine:
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":                              # a zombie is gone already
                continue
            if int(fields[2]) in want:                        # its process group
                found.append(int(name))
                continue
            with open(f"/proc/{name}/environ", "rb") as fh:
                if tag in fh.read().split(b"\0"):
                    found.append(int(name))
                    continue
            if _holds_open(name, folders):
                found.append(int(name))
        except (OSError, IndexError, ValueError):    # gone, or not ours to read
            continue
    return found


def _holds_open(pid: str, folders: list[str]) -> bool:
    """``pid`` has a file under one of ``folders`` open (or one as its working folder)."""
    inside = tuple(f.rstrip("/") + "/" for f in folders)
    if not inside:
        return False
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(inside):
                return True
        except OSError:
            continue
    return os.readlink(f"/proc/{pid}/cwd").startswith(inside)


def sweep_run(grace_s: float = GRACE_S) -> list[int]:
    """End what is left in the workers' groups (SIGTERM, then SIGKILL after ``grace_s``) and
    remove the run's folder. Returns the pids found at first. Only the run's own controller
    sweeps."""
    if not owns_run():
        return []
    groups = worker_groups()
    found = run_members(groups)
    for group in groups:
        _signal_group(group, signal.SIGTERM)
    for pid in found:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and run_members(groups):
        time.sleep(0.2)
    for group in groups:
        _signal_group(group, signal.SIGKILL)
    for pid in run_members(groups):
        _signal(pid, signal.SIGKILL)
    shutil.rmtree(os.environ[RUN_DIR], ignore_errors=True)
    if os.environ.get(RAY_DIR):
        shutil.rmtree(os.environ[RAY_DIR], ignore_errors=True)
    return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass

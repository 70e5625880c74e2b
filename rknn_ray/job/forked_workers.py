"""Ray workers of a local instance forked from a preloaded parent (actors/worker_fork.py).

A local instance this project starts names :mod:`actors.worker_fork` as its workers' script
and runs :mod:`actors.worker_zygote` beside it, so that a new actor imports Ray alone instead
of Ray and all of its dependencies (~0.35 CPU s less a worker: benchmarks/worker_start.py).
The parent starts in the background: until it is ready (and if it ever fails) workers start
exactly as Ray starts them. Linux only (fork, pidfds, passing descriptors over a socket);
``RKNN_RAY_FORKED_WORKERS=0`` turns it off.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

import actors.worker_fork
import actors.worker_zygote

#: ``0`` starts workers as Ray does (no preloaded parent), e.g. to compare or to rule it out
SWITCH_ENV = "RKNN_RAY_FORKED_WORKERS"
_parents: list[tuple[subprocess.Popen, str]] = []


PREFIX = "rknn-ray-workers-"
PID_FILE = "parent.pid"


def remove_stale_folders(root: str | None = None) -> list[str]:
    """Folders of parents that were killed outright (SIGKILL: no way out through their own
    clean-up): this user's, whose parent is recorded and gone."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(root) if n.startswith(PREFIX)]
    except OSError:
        return removed
    for name in names:
        folder = os.path.join(root, name)
        try:
            if os.stat(folder).st_uid != os.getuid():
                continue
            with open(os.path.join(folder, PID_FILE)) as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError):
            continue                 # not ours, or being made right now: left alone
        if not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def start_parent() -> str:
    """Start a preloaded parent; the path its socket will have once it is ready."""
    remove_stale_folders()
    folder = tempfile.mkdtemp(prefix=PREFIX)     # 0700: this user's only
    log = open(os.path.join(folder, "parent.log"), "wb")
    script = os.path.abspath(actors.worker_zygote.__file__)
    proc = subprocess.Popen([sys.executable, script, folder], stdin=subprocess.DEVNULL,
                            stdout=log, stderr=log, start_new_session=True, close_fds=True)
    log.close()
    with open(os.path.join(folder, PID_FILE), "w") as fh:
        fh.write(str(proc.pid))
    _parents.append((proc, folder))
    return os.path.join(folder, actors.worker_zygote.READY)


@atexit.register
def stop_parents() -> None:
    """The parents of this process's instances, stopped with it (their workers already were
    or are being stopped by Ray's shutdown)."""
    while _parents:
        proc, folder = _parents.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def workers_forked_from_a_preloaded_parent():
    """While a local instance starts (``ray.init(address="local")``): its raylet learns the
    worker script and the parent's socket; anything started after leaves as it came."""
    if not sys.platform.startswith("linux") or not hasattr(os, "pidfd_open") \
            or os.environ.get(SWITCH_ENV) == "0":
        yield
        return
    try:
        # Ray's private API: the node fills worker_path only where it is absent
        from ray._private.parameter import RayParams
    except ImportError:
        yield
        return
    script = os.path.abspath(actors.worker_fork.__file__)
    plain_init = RayParams.__init__

    def init(self, *args, **kwargs):
        plain_init(self, *args, **kwargs)
        if self.worker_path is None:
            self.worker_path = script

    env = actors.worker_fork.SOCKET_ENV
    before = os.environ.get(env)
    os.environ[env] = start_parent()      # the raylet's environment, read when it starts
    RayParams.__init__ = init
    try:
        yield
    finally:
        RayParams.__init__ = plain_init
        if before is None:
            os.environ.pop(env, None)
        else:
            os.environ[env] = before

"""Starts a Ray worker as a fork of a parent that has already imported what Ray's worker needs.

Every actor is a new Ray worker process, and each spent ~0.35 CPU s importing Ray's own
dependencies (requests, jsonschema, protobuf, asyncio, ssl, numpy, pyarrow, ...) before it did
anything (benchmarks/worker_start.py). A local instance this project starts
(rknn_ray.job.ray_env.workers_started_without_ray_twice) names this file as the worker's
script and runs one preloaded parent beside it (:mod:`actors.worker_zygote`): the raylet
starts this script as before, which hands its arguments, environment, working directory and
standard streams to the parent over a Unix socket; the parent forks, and the child runs
Ray's ``default_worker.py`` with them, so only Ray itself is imported in the child.

This process stays as the raylet's handle on the worker: it forwards the signals Ray sends
and ends as the worker ended (its exit code or its signal); if it is killed, the worker kills
itself (it watches this process). Ray sees the worker's own pid where the worker reports it
(its state API, its logs); the raylet's per-process view (the dashboard's memory column)
sees this small process. Without the parent (not started, not ready yet, gone) it execs
``default_worker.py`` exactly as Ray would. Run as a script by the raylet: it imports
nothing of Ray or of this project.
"""
import json
import os
import select
import signal
import socket
import sys

#: the parent's socket, set only in the environment of the instance's raylet
SOCKET_ENV = "RKNN_RAY_WORKER_PARENT"
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def default_worker() -> str:
    """Ray's own default_worker.py, found without importing Ray."""
    from importlib.util import find_spec
    spec = find_spec("ray")
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "default_worker.py")


def exec_default_worker(args: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, default_worker(), *args])


def request(args: list[str]) -> bytes:
    """What the parent needs to start the worker as this process would have."""
    blocked = sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, []))
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    body = json.dumps({"args": args, "env": dict(os.environ), "cwd": os.getcwd(),
                       "executable": sys.executable,
                       "launcher": os.getpid(), "blocked": blocked,
                       "sigint_ignored": ignored}).encode()
    return len(body).to_bytes(4, "big") + body


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:          # not started, not listening yet, or gone: start as Ray would
        sock.close()
        return None
    return sock


def wait_for(sock: socket.socket, pid: int, reader) -> int:
    """The worker's exit code: from the parent (its reaper), or 1 if the parent went first and
    the worker then ended (a pidfd sees a process that is not our child end)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        pidfd = None
    line = reader.readline()
    if line.strip():
        return int(line)
    if pidfd is not None:        # the parent is gone; the worker may still run
        select.select([pidfd], [], [])
    return 1


def main(args: list[str]) -> None:
    path = os.environ.get(SOCKET_ENV)
    sock = connect(path) if path and hasattr(os, "pidfd_open") else None
    if sock is None:
        exec_default_worker(args)
    try:
        socket.send_fds(sock, [request(args)], [0, 1, 2])
        reader = sock.makefile("r")
        answer = reader.readline()
    except OSError:
        answer = ""
    if not answer.strip():       # the parent did not start it: nothing was forked
        sock.close()
        exec_default_worker(args)
    pid = int(answer)

    def forward(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass
    for signum in FORWARDED:
        signal.signal(signum, forward)
    code = wait_for(sock, pid, reader)
    if code < 0:                 # killed by a signal: end the same way, as the raylet expects
        if -code not in (signal.SIGKILL, signal.SIGSTOP):     # those two keep their default
            signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


if __name__ == "__main__":
    main(sys.argv[1:])

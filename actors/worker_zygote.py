"""The preloaded parent of a local instance's Ray workers (see :mod:`actors.worker_fork`).

Started beside a local instance, in its own session, it imports Ray's worker dependencies and
listens on a Unix socket in a private folder. What it never imports: Ray (its C++ config reads
the worker's ``RAY_*`` variables once, when Ray loads). The libraries this project's actors
import (numpy, pyarrow, pandas, faiss, the sealing code's cryptography) size their thread
pools from variables they read once, at load (OpenBLAS's and OpenMP's thread counts): it
preloads them only where the instance pins those counts (:data:`PINNED`), and forks a worker
from them only when that worker's load-time variables are the ones it loaded them under, its
interpreter is this one and no path of its own holds another copy of them (else the worker
starts as Ray starts it). It forks with one thread, holding libraries and nothing else (no
secret, no key).

For each launcher it forks a child that takes the launcher's arguments, environment, working
directory, standard streams, signal mask and SIGINT handling, gets its own process group (as
the raylet gives a worker), watches the launcher (if it is killed, so is the worker) and runs
Ray's ``default_worker.py``. Python's ``random`` reseeds itself at fork, numpy's global
generator and multiprocessing's authentication key are drawn again here, OpenSSL reseeds its
generator in a forked process, and everything else draws from the OS after it; what
it keeps of the parent is Python's string-hash seed (one per instance, not per process).
The parent reaps each child and tells its launcher how it ended.

It ends with the thread that started it (the kernel's parent-death signal, SIGTERM) and
removes its folder on the way out; a folder left by one killed outright is removed by the next
start (rknn_ray.job.forked_workers). Run as a script: it imports nothing of Ray or of this project.
"""
import ctypes
import json
import os
import re
import runpy
import select
import shutil
import signal
import socket
import sys
import threading
import traceback

#: what Ray 2.5x's default_worker.py imports beyond Ray (~0.2 of its ~0.3 CPU s of imports
#: here); a module that is missing is skipped
PRELOAD = ("requests", "jsonschema", "asyncio", "ssl", "yaml", "psutil", "tqdm", "tqdm.auto",
           "msgpack", "google.protobuf.message", "google.protobuf.json_format",
           "google.protobuf.descriptor_pool", "google.protobuf.reflection",
           "google.protobuf.internal.builder", "google.protobuf.timestamp_pb2", "filelock",
           "multiprocessing", "uuid", "subprocess", "logging.handlers", "concurrent.futures",
           "dataclasses", "typing_extensions", "packaging.version", "colorama", "pdb",
           "tarfile", "argparse", "runpy", "uvloop")
#: what the project's actors import (a shard: numpy, pyarrow, faiss, the seals' cryptography,
#: randomgen; the server: PyNaCl; the table scanner: pandas): ~0.3-0.45 CPU s an actor
LIBRARIES = ("numpy", "numpy.random", "pyarrow", "pyarrow.parquet", "pyarrow.csv", "pandas",
             "faiss", "cryptography.hazmat.primitives.hpke",
             "cryptography.hazmat.primitives.asymmetric.x25519",
             "cryptography.hazmat.primitives.asymmetric.ed25519",
             "cryptography.hazmat.primitives.ciphers.aead", "nacl.bindings", "randomgen")
#: LIBRARIES load only where all of these are set (the test suite sets them; a user may)
PINNED = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
#: the variables those libraries (OpenMP, OpenBLAS, MKL, Arrow and its allocators, numpy,
#: faiss) may read at load: a worker is forked from them only if its own are the same
LOAD_TIME = re.compile(r"(OMP|GOMP|KMP|OPENBLAS|GOTO|MKL|ARROW|JE_ARROW|MIMALLOC|NPY|NUMPY|"
                       r"FAISS)_")
#: Arrow's jemalloc starts a purging thread at load; off in this parent only (Arrow's default
#: pool is mimalloc, so a worker does not allocate through jemalloc unless told to)
NO_JEMALLOC_THREAD = ("JE_ARROW_MALLOC_CONF", "background_thread:false")
PR_SET_PDEATHSIG = 1
READY = "ready"             # the file name the socket takes once the imports are done


def load_time_env(env) -> dict:
    return {k: v for k, v in env.items() if LOAD_TIME.match(k)}


def preload() -> list[str]:
    """Import PRELOAD, and LIBRARIES where the thread counts are pinned; what loaded."""
    names = list(PRELOAD)
    if all(os.environ.get(k) for k in PINNED):
        names += LIBRARIES
        os.environ.setdefault(*NO_JEMALLOC_THREAD)
    loaded = []
    for name in names:
        try:
            __import__(name)
        except ImportError:
            continue
        loaded.append(name)
    if "ray" in sys.modules or len(os.listdir("/proc/self/task")) != 1:
        raise SystemExit("a preloaded module loaded Ray or started a thread: not forking from it "
                         "(workers start as Ray starts them)")
    return loaded


def libraries_in(paths: list[str], names: list[str]) -> bool:
    """Whether one of these folders holds its own copy of a preloaded library (a job's
    working_dir or py_modules): the worker must import that one, not ours."""
    tops = {n.split(".")[0] for n in names if n in LIBRARIES}
    return any(os.path.exists(os.path.join(p, top)) or os.path.exists(os.path.join(p, top + ".py"))
               for p in paths for top in tops)


def forkable(request: dict, loaded: list[str], env_at_load: dict, worker_script: str) -> bool:
    """Whether the worker this request describes would load what this parent holds as it
    holds it: the same interpreter, and where the libraries are loaded, the same load-time
    variables and no other copy of them on its own path."""
    if request.get("executable", sys.executable) != sys.executable:
        return False
    if not any(name in LIBRARIES for name in loaded):
        return True
    if load_time_env(request["env"]) != env_at_load:
        return False
    own = worker_path(worker_script, request["env"].get("PYTHONPATH", ""), [])
    return not libraries_in(own, loaded)


def die_with_parent() -> None:
    """SIGTERM when the starter goes (handled: the folder is removed on the way out)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """The launcher's request and its three descriptors (they ride on the first bytes: the
    first read must be the one that takes them)."""
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
        more = conn.recv(1 << 16)
        if not more:
            for fd in fds:
                os.close(fd)
            raise OSError("the launcher closed its request early")
        data += more
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise OSError("the launcher's request came without its three streams")
    return json.loads(data[4:4 + int.from_bytes(data[:4], "big")]), fds


def watch_launcher(pid: int) -> None:
    """The launcher is the raylet's handle on this worker: when it dies, so does the worker."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        os.kill(os.getpid(), signal.SIGKILL)
        return
    select.select([pidfd], [], [])
    os.kill(os.getpid(), signal.SIGKILL)


def own_base_path() -> list[str]:
    """This interpreter's path without what came from its script and its PYTHONPATH: what
    every interpreter of this Python shares (the standard library, site-packages)."""
    mine = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    return [p for p in sys.path[1:] if os.path.abspath(p) not in mine]


def worker_path(worker_script: str, pythonpath: str, base_path: list[str]) -> list[str]:
    """``sys.path`` as ``python <worker_script>`` would start with under ``pythonpath`` (the
    script's folder, then PYTHONPATH, absolute and without repeats, as site.py leaves them;
    a runtime env's working_dir and py_modules arrive this way)."""
    path: list[str] = []
    own = [os.path.dirname(os.path.abspath(worker_script)),
           *[os.path.abspath(p) for p in pythonpath.split(os.pathsep) if p]]
    for entry in [*own, *base_path]:        # base_path as site.py left it (path hooks too)
        if entry not in path:
            path.append(entry)
    return path


def become_worker(request: dict, fds: list[int], worker_script: str, keep: list,
                  base_path: list[str]) -> None:
    """In the forked child: the launcher's process as Ray started it, then Ray's worker."""
    for sock in keep:
        sock.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)    # the parent's own way out is not the worker's
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.setpgid(0, 0)                 # its own group, as the raylet starts a worker
    signal.signal(signal.SIGINT, signal.SIG_IGN if request.get("sigint_ignored")
                  else signal.default_int_handler)
    blocked = [signal.Signals(n) for n in request.get("blocked", [])]
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.path[:] = worker_path(worker_script, os.environ.get("PYTHONPATH", ""), base_path)
    if "multiprocessing.process" in sys.modules:     # its own key, as a new interpreter draws
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)
    if "numpy.random" in sys.modules:                # numpy's global generator, from the OS
        sys.modules["numpy.random"].seed()
    threading.Thread(target=watch_launcher, args=(int(request["launcher"]),), daemon=True).start()
    sys.argv = [worker_script, *request["args"]]
    code = 0
    try:
        runpy.run_path(worker_script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # noqa: BLE001 - a worker's crash: its traceback, then its code
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def reap(launchers: dict) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = launchers.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            conn.close()


def serve(folder: str, worker_script: str, loaded: list[str], env_at_load: dict) -> None:
    base_path = own_base_path()
    wake_r, wake_w = os.pipe()        # a child's exit wakes the loop (no polling while idle)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_w)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pending = os.path.join(folder, "binding")
    server.bind(pending)
    server.listen(128)
    os.rename(pending, os.path.join(folder, READY))     # launchers connect only once ready
    launchers: dict[int, socket.socket] = {}
    while True:
        try:
            readable, _, _ = select.select([server, wake_r], [], [])
        except InterruptedError:
            readable = []
        if wake_r in readable:
            os.read(wake_r, 4096)
        reap(launchers)
        if server not in readable:
            continue
        conn, _ = server.accept()
        conn.settimeout(10)        # a launcher stopped mid-request holds up no other worker
        try:
            request, fds = receive(conn)
        except (OSError, ValueError):
            conn.close()
            continue
        if not forkable(request, loaded, env_at_load, worker_script):
            for fd in fds:          # no answer: the launcher starts the worker as Ray would
                os.close(fd)
            conn.close()
            continue
        # SIGTERM is the parent's way out (its folder removed): held while forking, so that a
        # child never runs that way out before it has the worker's handlers
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        try:
            pid = os.fork()
        except OSError:            # no fork now (a process limit): the launcher starts it
            pid = -1
        if pid == 0:
            try:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                become_worker(request, fds, worker_script, [server, conn, *launchers.values()],
                              base_path)
            finally:
                os._exit(1)        # never back into the parent's loop or its clean-up
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM])
        if pid < 0:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        for fd in fds:
            os.close(fd)
        launchers[pid] = conn
        try:
            conn.sendall(f"{pid}\n".encode())
        except OSError:
            pass


def stop(_signum, _frame) -> None:
    """Out through main's finally (the folder goes with the parent); a second SIGTERM (the
    parent-death signal and a sweep's, together) must not cut that clean-up short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def run(folder: str, worker_script: str) -> None:
    """Preload, then fork a worker for each launcher until stopped; the folder goes after."""
    env_at_load = load_time_env(os.environ)
    loaded = preload()
    try:
        serve(folder, worker_script, loaded, env_at_load)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(folder: str) -> None:
    signal.signal(signal.SIGTERM, stop)
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # a Ctrl-C is the driver's to handle
    from importlib.util import find_spec
    run(folder, os.path.join(os.path.dirname(find_spec("ray").origin), "_private", "workers",
                             "default_worker.py"))


if __name__ == "__main__":
    main(sys.argv[1])

"""Starting or joining Ray the way these machines need it.

With ``RAY_ADDRESS`` set (``ray job submit``, a cluster) we join that cluster and
touch nothing else. Otherwise we start a local instance bound to loopback:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` must be set before Ray starts (README, "Running on a cluster").

A local instance is also started so that its console stays readable
(:func:`local_ray_env`): token authentication is chosen explicitly (what Ray does
anyway for a new local instance, minus its warning that it did), and Ray Train's
preemption watcher, which only matters for nodes that can be taken away and logs a
red ``core_worker`` error line at every start, is off. Explicit settings in the
environment always win; nothing here applies to a cluster joined through RAY_ADDRESS.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import threading

import ray

import actors.worker_start
from rknn_ray.errors import ConfigError, first_line
from rknn_ray.job.forked_workers import workers_forked_from_a_preloaded_parent
from rknn_ray.job.progress import console_write

#: how long the check of a RAY_ADDRESS waits for its GCS to answer (Ray itself retries for
#: minutes, and then exits from inside ray.init)
RAY_ADDRESS_WAIT_S = 5.0
#: how long joining a checked RAY_ADDRESS (ray.init) may take before it is given up (Ray
#: retried for 214 s when something that was not its GCS answered); ``$RKNN_RAY_JOIN_WAIT_S``
#: overrides it
RAY_JOIN_WAIT_S = 120.0
JOIN_WAIT_ENV = "RKNN_RAY_JOIN_WAIT_S"
# what a gRPC server (Ray's GCS, a Ray Client server) answers first: HTTP/2's client preface
# and an empty SETTINGS frame in, the server's SETTINGS frame (type 4, no ACK flag) out
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_ADDRESS_FIX = ("set RAY_ADDRESS to the cluster's GCS address <head ip>:6379 (what `ray start "
                "--head` printed), or unset it to start a local instance")

# Ray waits a hard-coded 30 s for a new local raylet to register; on a machine whose
# cores are busy with other work that is not always enough, and a second try usually is.
STARTUP_TIMEOUT = "timed out during startup"
START_ATTEMPTS = 3


def quiet_ray_logs() -> None:
    """Hide Train's repeated 'State API' warning (logged and forwarded from another
    process; rknn_ray.training.logs.quiet_train_logs knows where)."""
    from rknn_ray.training.logs import quiet_train_logs, set_console_guard  # defers torch
    set_console_guard(console_write)    # forwarded worker lines go above the job's bars
    quiet_train_logs()


LOCAL_ENV = {
    # Train V2 starts a PreemptionWatcher actor per run; on one machine nothing is preempted
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


def local_ray_env() -> None:
    """Environment for a local instance this process is about to start (set-if-unset)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    for key, value in LOCAL_ENV.items():
        os.environ.setdefault(key, value)
    if "RAY_AUTH_MODE" not in os.environ:
        # Ray enables token auth for a new local instance by default and warns that it did;
        # choosing it ourselves keeps the protection without the warning. Ray caches its
        # config when imported, so refresh it (as Ray's own _enable_token_auth does).
        os.environ["RAY_AUTH_MODE"] = "token"
        try:
            # Ray's private API: a Ray that moved it fails only this call
            from ray._raylet import Config
            Config.initialize("")
        except Exception:  # noqa: BLE001 - Ray moved it: its warning simply shows again
            os.environ.pop("RAY_AUTH_MODE", None)


#: the hook (actors.worker_hook.pin_ray_address) lives outside this package: a worker that
#: imports it does not load the job layer
WORKER_RUNTIME_ENV = {"worker_process_setup_hook": "actors.worker_hook.pin_ray_address"}


def other_ray_on_this_machine() -> bool:
    """Whether another Ray instance (a GCS process) already runs here: only then do our
    workers need :func:`actors.worker_hook.pin_ray_address`. A job runtime env costs every
    worker CPU at start and keeps the workers Ray prestarts from being used (actors are ready
    later; figures in docs/results.md, "Costs behind design choices"), so a lone instance
    goes without. (One started beside ours later can still
    confuse Train's cleaner; its traceback is dropped from the console by
    :mod:`rknn_ray.training.logs`.) True when Ray's process scan itself fails."""
    try:
        # Ray's private API: a Ray that moved it fails only this call
        from ray._private.services import find_gcs_addresses
        return bool(find_gcs_addresses())
    except Exception:  # noqa: BLE001 - a private Ray helper: when unsure, pin
        return True


@contextlib.contextmanager
def variables_set_while(**values):
    """Set these environment variables for the block and put back only these after it: a
    ``ray.init`` inside sets its own (``RAY_AUTH_MODE``), which the processes that later join
    the instance need, so restoring the whole environment would lock them out."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def workers_started_without_ray_twice():
    """While a local instance starts: its raylet starts each worker through
    :mod:`actors.worker_start`, which applies the runtime env's variables and execs the worker
    with the standard library alone, rather than Ray's setup_worker.py, which imports all of
    Ray (~0.5 CPU s a worker here: benchmarks/worker_start.py) before the worker imports it again.
    Anything but a plain Python worker still goes to Ray's own script; off Linux (where Ray
    starts workers differently on Windows), Ray's script alone. Each worker is then forked
    from a parent that has imported Ray's dependencies already
    (:mod:`rknn_ray.job.forked_workers`)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    try:
        # Ray's private API: the raylet's worker command names <ray>/_private/workers/<this>,
        # and an absolute path replaces the whole join; a Ray that moved it keeps its own
        from ray._private import ray_constants
        before = ray_constants.SETUP_WORKER_FILENAME
    except (ImportError, AttributeError):
        yield
        return
    ray_constants.SETUP_WORKER_FILENAME = os.path.abspath(actors.worker_start.__file__)
    try:
        with workers_forked_from_a_preloaded_parent():
            yield
    finally:
        ray_constants.SETUP_WORKER_FILENAME = before


@contextlib.contextmanager
def ray_processes_in_their_own_session():
    """Start the processes of a local instance (GCS, raylet, their helpers) each in its own
    session, so that a signal to the job's process group (``timeout``, Slurm's scancel,
    systemd, ``kill -- -PGID``) reaches the driver only: it then still has its Ray to shut
    down and writes its record (with Ray's processes in the group, the GCS died with the
    driver's signal, and the driver hung 60 s waiting for it and wrote nothing).

    Ray already does this on Windows; on Linux it only blocks SIGINT in them. They still
    die with the driver: Ray starts them with the kernel's parent-death signal, so without
    that (no ``prctl``) they stay in the group, where Ray's reaper can find them."""
    # Ray's private API: a Ray that moved it fails only this call
    from ray._private import services, utils
    base = services.ConsolePopen
    if not sys.platform.startswith("linux") or not utils.detect_fate_sharing_support():
        yield
        return

    class OwnSessionPopen(base):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = base


def check_ray_address(address: str, wait_s: float = RAY_ADDRESS_WAIT_S) -> str:
    """The GCS address Ray will join for ``address`` (RAY_ADDRESS), once something answers
    there within ``wait_s``; else a ConfigError in one line. A URL (the dashboard's, which
    ``ray job submit`` takes), text that is not host:port, 'auto' with no cluster on this
    machine and a port nobody listens on are said at once instead of Ray's tracebacks or
    its minutes of retries. ``local`` (start one) and ``ray://`` (Ray Client) pass as given."""
    text = str(address).strip()
    if text == "local":
        return text
    scheme = text.split("://", 1)[0] if "://" in text else None
    if scheme is not None and scheme != "ray":
        raise ConfigError("RAY_ADDRESS", f"{address!r} is a {scheme}:// URL (a dashboard "
                          "address, which `ray job submit --address` takes); a job joins the "
                          "cluster's GCS at host:port", _ADDRESS_FIX)
    target = text[len("ray://"):] if scheme == "ray" else text
    host, _, port = target.rpartition(":")
    if text != "auto" and (not host or not port.isdigit() or not 0 < int(port) < 65536):
        raise ConfigError("RAY_ADDRESS", f"{address!r} is not host:port", _ADDRESS_FIX)
    if scheme is None:
        # Ray's private API: a Ray that moved it fails only this call
        from ray._private.services import canonicalize_bootstrap_address
        try:                # what Ray joins: 'auto' found on this machine, localhost rewritten
            target = canonicalize_bootstrap_address(text)
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError / ValueError
            what = ("found no running Ray instance on this machine" if text == "auto"
                    else f"cannot be used ({first_line(exc)})")
            raise ConfigError("RAY_ADDRESS", f"{address!r} {what}", _ADDRESS_FIX) from None
        host, _, port = target.rpartition(":")
    via = "" if target == text else f" (Ray joins it as {target})"
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=wait_s)
    except OSError as exc:
        why = "no answer" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise ConfigError("RAY_ADDRESS", f"nothing answers at {address!r}{via} ({why}; waited "
                          f"at most {wait_s:g} s): no Ray cluster runs there", _ADDRESS_FIX) from None
    with sock:
        why = None if _tls() else _grpc_handshake(sock, wait_s)
    if why is None and not _tls() and scheme is None:
        why = _gcs_answers(target, wait_s)
    if why:
        raise ConfigError("RAY_ADDRESS", f"something listens at {address!r}{via} but it is not "
                          f"a Ray cluster ({why}; waited at most {wait_s:g} s)", _ADDRESS_FIX)
    return target


def _tls() -> bool:
    """Whether Ray speaks TLS to its GCS here (then its handshake is TLS's, not checked)."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true", "yes")


def _grpc_handshake(sock: socket.socket, wait_s: float) -> str | None:
    """None when the peer on ``sock`` answers HTTP/2's preface with a SETTINGS frame within
    ``wait_s`` (as Ray's GCS, a gRPC server, does at once); else why not, in words."""
    sock.settimeout(wait_s)
    head = b""
    try:
        sock.sendall(_H2_PREFACE)
        while len(head) < 9:
            chunk = sock.recv(9 - len(head))
            if not chunk:
                return "it closed the connection at gRPC's handshake"
            head += chunk
    except socket.timeout:
        return "it did not answer gRPC's handshake"
    except OSError as exc:
        return f"gRPC's handshake failed: {exc.strerror or exc}"
    if head[3] != 4 or head[4] & 1:
        return "it answered gRPC's handshake with something else"
    return None


def _gcs_answers(target: str, wait_s: float) -> str | None:
    """None when ``target`` answers one call of Ray's GCS (its cluster id) within ``wait_s``,
    or refuses it for want of the cluster's token (a Ray with token auth); else why it is not
    a Ray GCS. Unsure (Ray's generated stubs moved): None."""
    try:
        # Ray's private API: a Ray that moved it skips only this call
        import grpc
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except Exception:  # noqa: BLE001 - the handshake above is then the check
        return None
    with grpc.insecure_channel(target) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=wait_s)
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return None                 # a Ray GCS that wants its token: Ray sends it
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                return "it did not answer Ray's GCS call"
            if code == grpc.StatusCode.UNIMPLEMENTED:
                return "a gRPC server without Ray's GCS service"
            return f"Ray's GCS call failed: {code.name.lower()}"
    return None


class JoinTimeout(BaseException):
    """Raised by the timer around joining a cluster (not an Exception: Ray's retry loops
    catch those and try again)."""


def join_wait_s() -> float:
    try:
        value = float(os.environ.get(JOIN_WAIT_ENV, ""))
    except ValueError:
        return RAY_JOIN_WAIT_S
    return value if 0 < value < float("inf") else RAY_JOIN_WAIT_S


@contextlib.contextmanager
def _bounded_join(seconds: float):
    """Raise JoinTimeout in this (the main) thread after ``seconds``; elsewhere, or where a
    timer is already set, no bound."""
    if (threading.current_thread() is not threading.main_thread()
            or not hasattr(signal, "setitimer") or signal.getitimer(signal.ITIMER_REAL)[0]):
        yield
        return

    def expired(signum, frame):
        raise JoinTimeout
    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def ensure_ray(num_cpus: int | None = None, *, address: str | None = None,
               object_store_mb: int | None = None, log_to_driver: bool = True) -> bool:
    """Init Ray if needed; returns True when this call started a local instance.

    The one way this project starts Ray (the CLIs, the job, the benchmarks): ``address``
    (else ``RAY_ADDRESS``) joins that cluster; otherwise a loopback instance of our own with
    ``num_cpus`` (default all) and, if given, an object store of ``object_store_mb`` MiB.
    """
    quiet_ray_logs()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        check_ray_address(address)      # one line now, not Ray's traceback or minutes of retries
        wait = join_wait_s()
        try:
            with _bounded_join(wait):
                ray.init(address=address, log_to_driver=log_to_driver)
        except ConnectionError as exc:  # something answered there, but not a GCS we may join
            raise ConfigError("RAY_ADDRESS", f"Ray could not join {address!r} ({first_line(exc)})",
                              _ADDRESS_FIX) from None
        except JoinTimeout:
            ray.shutdown()
            raise ConfigError("RAY_ADDRESS", f"joining the cluster at {address!r} did not finish "
                              f"within {wait:g} s (${JOIN_WAIT_ENV})", _ADDRESS_FIX) from None
        quiet_ray_logs()        # again: init adds the handler that prints forwarded worker lines
        return False
    local_ray_env()
    store = None if object_store_mb is None else int(object_store_mb) * 2 ** 20
    # pinned workers run a setup hook, so the workers Ray prestarts for the first driver
    # (plain ones) would never serve this job's actors: each is a process started for
    # nothing (~1 CPU s here), so none is prestarted
    env = {"runtime_env": WORKER_RUNTIME_ENV,
           "_system_config": {"prestart_worker_first_driver": False}} \
        if other_ray_on_this_machine() else {}
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            # address="local": always our own instance, never a cluster that a `ray start`
            # (jobs.local_cluster, another user) left running on this machine
            with ray_processes_in_their_own_session(), workers_started_without_ray_twice():
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count(),
                         include_dashboard=False, log_to_driver=log_to_driver, **env,
                         configure_logging=True, logging_level=logging.WARNING,
                         **({"object_store_memory": store} if store else {}))
            quiet_ray_logs()    # again: init adds the handler that prints forwarded worker lines
            return True
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if STARTUP_TIMEOUT not in str(exc) or attempt == START_ATTEMPTS:
                raise
            ray.shutdown()      # stop the half-started processes before the next try
            print(f"Ray's raylet did not register within Ray's fixed 30 s (a busy machine); "
                  f"starting it again ({attempt + 1}/{START_ATTEMPTS})", file=sys.stderr)
    return True

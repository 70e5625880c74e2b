"""Ray workers forked from a preloaded parent (actors/worker_fork.py, actors/worker_zygote.py):
each one as Ray would have started it (arguments, environment, working directory, streams,
process group, signal mask and handlers), with its own randomness, tied to the launcher the
raylet holds, and started as Ray starts it whenever the parent is not there."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors import worker_fork, worker_zygote

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


PINS = {name: "1" for name in worker_zygote.PINNED}


def unpinned_env() -> dict:
    return {k: v for k, v in os.environ.items() if k not in worker_zygote.PINNED}


def start_parent(tmp_path: Path, pinned: bool = False) -> tuple[subprocess.Popen, str]:
    folder = tmp_path / "parent"
    folder.mkdir(mode=0o700)
    env = {**unpinned_env(), **(PINS if pinned else {})}
    proc = subprocess.Popen([sys.executable, worker_zygote.__file__, str(folder)],
                            start_new_session=True, env=env)
    ready = folder / worker_zygote.READY
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    return proc, str(ready)


@pytest.fixture(params=[False, True], ids=["unpinned", "pinned"])
def parent(tmp_path, request):
    proc, ready = start_parent(tmp_path, pinned=request.param)
    yield proc, ready, request.param
    proc.kill()
    proc.wait()


def launch(ready: str | None, *args: str, worker: str | None = None, **kw) -> subprocess.Popen:
    """The launcher as the raylet runs it, with ``worker`` standing in for default_worker.py
    (the parent runs whatever script it names for the fork it makes; tests give a probe)."""
    env = {k: v for k, v in os.environ.items() if k != worker_fork.SOCKET_ENV}
    if ready:
        env[worker_fork.SOCKET_ENV] = ready
    env["PROBE_VALUE"] = "seen"
    return subprocess.Popen([sys.executable, worker_fork.__file__, *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_without_the_parent_the_launcher_starts_ray_s_own_worker(tmp_path):
    # no socket at all, and a socket path nobody listens on: default_worker.py itself runs
    for ready in (None, str(tmp_path / "nobody" / "ready")):
        out = launch(ready, "--help")
        stdout, _ = out.communicate(timeout=120)
        assert out.returncode == 0
        assert "--node-ip-address" in stdout and "--raylet-name" in stdout


def test_the_parent_holds_no_ray_and_no_thread_when_it_forks(parent):
    proc, _, pinned = parent
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "_raylet" not in maps                    # Ray's C++ core never loaded in the parent
    assert len(os.listdir(f"/proc/{proc.pid}/task")) == 1
    # their pools size at load: loaded only where the thread counts are pinned
    for library in ("numpy", "libarrow", "faiss"):
        assert (library in maps) == pinned, library
    status = Path(f"/proc/{proc.pid}/status").read_text()
    assert "_ssl" in maps or "libssl" in maps or "SigCgt" in status     # imports done: ssl loaded


PROBE = '''
import json, os, random, signal, sys
import numpy as np
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0),
                  "args": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VALUE"),
                  "socket_env": os.environ.get("%s"),
                  "np": int(np.random.randint(0, 2**62)), "py": random.getrandbits(62),
                  "urandom": os.urandom(8).hex(), "ray": "ray" in sys.modules,
                  "openssl": __import__("cryptography.hazmat.primitives.asymmetric.x25519",
                                        fromlist=["x"]).X25519PrivateKey.generate()
                                                     .private_bytes_raw().hex(),
                  "sodium": __import__("nacl.utils", fromlist=["x"]).random(8).hex(),
                  "preloaded": "numpy" in sys.modules and "faiss" in sys.modules,
                  "sigint": str(signal.getsignal(signal.SIGINT)),
                  "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
                  "path": sys.path,
                  "authkey": __import__("multiprocessing").current_process().authkey.hex()}))
sys.stdout.flush()
code = int(os.environ.get("PROBE_EXIT", "0"))
if os.environ.get("PROBE_SLEEP"):
    import time; time.sleep(float(os.environ["PROBE_SLEEP"]))
sys.exit(code)
''' % worker_fork.SOCKET_ENV


@pytest.fixture
def probe_parent(tmp_path, monkeypatch):
    """A parent whose forks run a probe script instead of default_worker.py, with the
    libraries preloaded (the thread counts pinned, here and in the launchers)."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    folder = tmp_path / "pparent"
    folder.mkdir(mode=0o700)
    for name, value in PINS.items():
        monkeypatch.setenv(name, value)
    code = f"import sys; import actors.worker_zygote as z; z.run(sys.argv[1], {str(probe)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code, str(folder)], start_new_session=True,
                            cwd=Path(worker_zygote.__file__).parents[1])
    ready = folder / worker_zygote.READY
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    yield str(ready)
    proc.kill()
    proc.wait()


def run_probe(ready: str, *args: str, cwd=None, extra_env=None) -> tuple[dict, int, int]:
    import json
    env_before = dict(os.environ)
    try:
        os.environ.update(extra_env or {})
        out = launch(ready, *args, cwd=cwd)
    finally:
        os.environ.clear()
        os.environ.update(env_before)
    stdout, stderr = out.communicate(timeout=120)
    return json.loads(stdout.strip().splitlines()[-1]), out.returncode, out.pid


def test_a_fork_is_the_process_ray_would_have_started(probe_parent, tmp_path):
    seen, code, launcher = run_probe(probe_parent, "--a=1", "--b", "two", cwd=tmp_path)
    assert code == 0
    assert seen["args"] == ["--a=1", "--b", "two"] and seen["cwd"] == str(tmp_path)
    assert seen["env"] == "seen" and seen["socket_env"] == probe_parent
    assert seen["pid"] != launcher and seen["pgid"] == seen["pid"]    # its own group
    assert seen["sigint"] == str(signal.default_int_handler) and seen["blocked"] == []
    assert seen["ray"] is False and seen["preloaded"] is True


def test_a_fork_finds_modules_where_a_new_interpreter_would(probe_parent, tmp_path):
    # the script's folder first, then the launcher's PYTHONPATH (a runtime env's working_dir
    # and py_modules arrive this way); never the parent's own folder (actors/, where a
    # module named server.py would shadow the server package) or its PYTHONPATH
    extra = tmp_path / "mods"
    extra.mkdir()
    seen, _, _ = run_probe(probe_parent, extra_env={"PYTHONPATH": str(extra)})
    assert seen["path"][0] == str(tmp_path) and seen["path"][1] == str(extra)
    import json
    fresh = subprocess.run([sys.executable, "-c", "import sys, json; print(json.dumps(sys.path))"],
                           capture_output=True, text=True, cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(extra)}).stdout
    assert seen["path"][2:] == json.loads(fresh)[2:]       # the rest: the same
    assert str(Path(worker_zygote.__file__).parent) not in seen["path"]


def test_each_fork_draws_its_own_randomness(probe_parent):
    draws = [run_probe(probe_parent)[0] for _ in range(4)]
    assert all(d["preloaded"] for d in draws)        # numpy was loaded (and seeded) before fork
    # numpy's global generator, random, the OS, multiprocessing's key, OpenSSL, libsodium
    for key in ("np", "py", "urandom", "authkey", "openssl", "sodium"):
        assert len({d[key] for d in draws}) == 4, key


def ray_s_own_worker_ran(ready: str, env: dict, executable: str = sys.executable) -> bool:
    """Launch with ``--help`` under ``env``: True if Ray's default_worker.py printed its help
    (the parent declined to fork: the launcher started the worker as Ray would), False if
    the parent's probe ran."""
    out = subprocess.run([executable, worker_fork.__file__, "--help"], capture_output=True,
                         text=True, timeout=120,
                         env={**env, worker_fork.SOCKET_ENV: ready, "PROBE_VALUE": "seen"})
    if "--raylet-name" in out.stdout:
        return True
    import json
    assert json.loads(out.stdout.strip().splitlines()[-1])["env"] == "seen", out.stderr
    return False


def test_a_worker_is_forked_only_under_the_thread_counts_its_libraries_loaded_with(
        probe_parent):
    # what OpenBLAS and OpenMP read at load must be what the worker would read itself
    assert not ray_s_own_worker_ran(probe_parent, dict(os.environ))
    assert ray_s_own_worker_ran(probe_parent, {**os.environ, "OMP_NUM_THREADS": "2"})
    assert ray_s_own_worker_ran(probe_parent, unpinned_env())
    assert ray_s_own_worker_ran(probe_parent, {**os.environ, "ARROW_IO_THREADS": "3"})


def test_a_worker_with_its_own_copy_of_a_library_or_another_interpreter_is_not_forked(
        probe_parent, tmp_path):
    vendored = tmp_path / "working_dir"
    (vendored / "numpy").mkdir(parents=True)       # a job's working_dir with its own numpy
    assert ray_s_own_worker_ran(probe_parent, {**os.environ, "PYTHONPATH": str(vendored)})
    other = tmp_path / "bin" / "python3"           # the interpreter of a virtualenv, say
    other.parent.mkdir()
    other.symlink_to(sys.executable)
    assert ray_s_own_worker_ran(probe_parent, dict(os.environ), executable=str(other))


def test_the_launcher_exits_with_the_worker_s_code(probe_parent):
    _, code, _ = run_probe(probe_parent, extra_env={"PROBE_EXIT": "7"})
    assert code == 7


def test_a_killed_launcher_takes_its_worker_with_it(probe_parent):
    import json
    env = {**os.environ, "PROBE_SLEEP": "300"}
    env[worker_fork.SOCKET_ENV] = probe_parent
    out = subprocess.Popen([sys.executable, worker_fork.__file__], env=env,
                           stdout=subprocess.PIPE, text=True)
    worker = json.loads(out.stdout.readline())["pid"]
    os.kill(out.pid, signal.SIGKILL)          # what the raylet does to a worker it gives up on
    out.wait()
    deadline = time.monotonic() + 30
    while Path(f"/proc/{worker}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{worker}").exists()


def test_a_worker_killed_outright_ends_its_launcher_the_same_way(probe_parent):
    import json
    env = {**os.environ, "PROBE_SLEEP": "300"}
    env[worker_fork.SOCKET_ENV] = probe_parent
    out = subprocess.Popen([sys.executable, worker_fork.__file__], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = json.loads(out.stdout.readline())["pid"]
    os.kill(worker, signal.SIGKILL)           # a test's kill -9, the kernel's OOM killer
    assert out.wait(timeout=60) == -signal.SIGKILL
    assert out.stderr.read() == ""            # and nothing on the worker's console


def test_a_signal_to_the_launcher_reaches_the_worker(probe_parent):
    import json
    env = {**os.environ, "PROBE_SLEEP": "300"}
    env[worker_fork.SOCKET_ENV] = probe_parent
    out = subprocess.Popen([sys.executable, worker_fork.__file__], env=env,
                           stdout=subprocess.PIPE, text=True)
    json.loads(out.stdout.readline())
    out.send_signal(signal.SIGTERM)           # Ray's graceful stop of a worker
    assert out.wait(timeout=60) == -signal.SIGTERM      # the worker's death, as the raylet sees it


def test_workers_of_a_local_instance_are_forked_from_its_parent(ray_session):
    import ray

    @ray.remote
    class Where:
        def where(self):
            import random
            return (os.getppid(), os.environ.get(worker_fork.SOCKET_ENV), os.urandom(8).hex(),
                    random.getrandbits(64))

    deadline = time.monotonic() + 60
    while True:            # the first workers may predate a ready parent: they start as Ray's
        actors = [Where.remote() for _ in range(3)]
        seen = ray.get([a.where.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        ready = seen[0][1]
        parents = {p for p, *_ in seen}
        if ready and os.path.exists(ready) and len(parents) == 1:
            break
        assert time.monotonic() < deadline, seen
        time.sleep(1)
    (parent_pid,) = parents
    assert Path(f"/proc/{parent_pid}/cmdline").read_bytes().split(b"\0")[1].endswith(
        b"worker_zygote.py")
    assert len({s[2] for s in seen}) == 3 and len({s[3] for s in seen}) == 3


def test_a_stopped_parent_removes_its_folder(tmp_path):
    proc, ready = start_parent(tmp_path)
    proc.send_signal(signal.SIGTERM)          # what its parent-death signal sends
    assert proc.wait(timeout=60) == 0
    assert not Path(ready).parent.exists()


def test_a_folder_left_by_a_parent_killed_outright_goes_at_the_next_start(tmp_path):
    from rknn_ray.job import forked_workers
    gone, alive, making = (tmp_path / f"{forked_workers.PREFIX}{n}" for n in ("a", "b", "c"))
    for folder in (gone, alive, making):
        folder.mkdir(mode=0o700)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (gone / forked_workers.PID_FILE).write_text(str(dead.pid))       # killed, folder left
    (alive / forked_workers.PID_FILE).write_text(str(os.getpid()))   # a live parent's
    # `making` has no pid yet: a parent being started right now
    assert forked_workers.remove_stale_folders(str(tmp_path)) == [str(gone)]
    assert alive.exists() and making.exists() and not gone.exists()

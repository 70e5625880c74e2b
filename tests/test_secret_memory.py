"""Issue 21.2: a client shard's secret never crosses Ray's control plane.

The audit's check, automated: a driver (a subprocess, so this test process is not it) runs a
secure round; the test then reads every process of that Ray instance through
/proc/PID/maps + /proc/PID/mem and searches for each shard's secret, taken from the shard's
node-local key store. It must be in its own shard's process and nowhere else: not in the
driver, not in gcs_server, not in the raylet (which maps the object store), not in any other
worker. A canary the driver passed as an actor argument (how secrets used to travel) is
found in gcs_server, and bytes it put in the object store are found in the raylet: the scan
sees what crosses the control plane and what sits in the object store. Reading
another process's memory needs ptrace rights: root, or (Yama ptrace_scope 1) being its
ancestor, which this test is; a PermissionError here means the CI lacks them.
"""
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.procmem import find_bytes, holds_only_file_bytes, scan_range, touched_runs

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc/PID/mem")
def test_shard_secrets_are_in_their_shards_only_never_in_driver_gcs_or_object_store(tmp_path):
    store = tmp_path / "keys"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "driver.log"
    driver = subprocess.Popen([sys.executable, "-m", "tests.secret_scan_driver", str(store)],
                              cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log.open("w"), text=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the driver ended before its round finished:\n{log.read_text()[-3000:]}"
        info = json.loads(line)
        assert info["messages"] == info["clients"] > 1000          # a full round went out
        procs = [psutil.Process(driver.pid)] + psutil.Process(driver.pid).children(recursive=True)
        names = {p.pid: p.name() for p in procs}
        shards = [p.pid for p in procs if names[p.pid] == "ray::ClientShardImpl"]
        gcs = [pid for pid, n in names.items() if n == "gcs_server"]
        raylet = [pid for pid, n in names.items() if n == "raylet"]
        assert len(shards) == 2 and len(gcs) == 1 and len(raylet) == 1, names

        # the node-local store, read by the test only (it is not the driver)
        folder = store / info["job_id"]
        keys = sorted(folder.iterdir())
        assert [k.name for k in keys] == ["shard-0.key", "shard-1.key"]
        assert oct(folder.stat().st_mode & 0o777) == "0o700"
        assert all(oct(k.stat().st_mode & 0o777) == "0o600" for k in keys)
        secrets = [k.read_bytes() for k in keys]
        assert all(len(s) == 32 for s in secrets) and secrets[0] != secrets[1]

        canary, stored = bytes.fromhex(info["canary"]), bytes.fromhex(info["stored"])
        scans = {pid: find_bytes(pid, *secrets, canary, stored)[0] for pid in names}
        found = {pid: [len(h) for h in hits[:2]] for pid, hits in scans.items()}
        # each shard holds its own secret, not the other's: the scan sees a secret where it is
        assert sorted(tuple(h > 0 for h in found[pid]) for pid in shards) == [(False, True),
                                                                               (True, False)]
        elsewhere = {f"{names[pid]} ({pid})": hits for pid, hits in found.items()
                     if pid not in shards and any(hits)}
        assert not elsewhere, f"a shard secret outside its shard: {elsewhere}"
        assert found[driver.pid] == [0, 0] and found[gcs[0]] == [0, 0]
        assert found[raylet[0]] == [0, 0]
        # controls: what crosses the control plane as an actor argument IS found in the GCS,
        # and what is in the object store is found in the raylet (which maps it)
        assert scans[gcs[0]][2] and scans[raylet[0]][3]

        driver.stdin.write("\n")
        driver.stdin.flush()
        assert json.loads(driver.stdout.readline()) == {"closed": True}
        assert driver.wait(timeout=120) == 0
        assert not folder.exists()          # the session deleted the job's secrets on close
    finally:
        if driver.poll() is None:        # a failed assertion: end the driver and its Ray
            tree = psutil.Process(driver.pid).children(recursive=True)
            driver.kill()
            driver.wait()
            for p in tree:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass


def test_the_scan_skips_only_what_holds_a_files_own_bytes():
    """Library code and constants are skipped (~2/3 of a worker's bytes); anything a process
    can write, or that is not a file on disk, is read."""
    assert holds_only_file_bytes("r-xp", "/usr/lib/libtorch_cpu.so")
    assert holds_only_file_bytes("r--p", "/usr/bin/python3.11")
    for perms, name in (("rw-p", "/usr/lib/libc.so.6"), ("r--s", "/dev/shm/plasma"),
                        ("rw-s", "/tmp/ray/plasma"), ("r--p", "/memfd:plasma (deleted)"),
                        ("r--p", "/tmp/x.so (deleted)"), ("r--p", ""), ("rw-p", "[heap]"),
                        ("r--p", "[stack]")):
        assert not holds_only_file_bytes(perms, name), (perms, name)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc/PID/pagemap")
def test_of_anonymous_memory_only_the_written_pages_are_read_and_a_secret_there_is_found():
    size, at = 64 << 20, 40 << 20
    area = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    secret = os.urandom(32)
    area[at - 8:at + 24] = secret                  # straddles a page boundary: two pages
    lo = _address(area)                            # page-aligned, as mmap returns it
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        runs = touched_runs(pagemap, lo, lo + size)
    assert runs == [(lo + at - 4096, lo + at + 4096)]
    # the runs' bytes hold the secret (this process, not find_bytes over all of it: under the
    # test session it maps Ray's object store, far over find_bytes' shared-mapping limit)
    with open("/proc/self/mem", "rb", buffering=0) as mem:
        (found,), read = scan_range(mem, *runs[0], [secret], len(secret) - 1)
    assert found == [lo + at - 8] and read == 2 * 4096


def _address(area: mmap.mmap) -> int:
    import ctypes
    return ctypes.addressof(ctypes.c_char.from_buffer(area))

"""A shuffler service as its own OS process, and everything it is started with (tests and
benchmarks/shuffler_service.py): operator, server and holder keys, a signed specification,
a CA and a server certificate, the holder registry.

The service runs through ``rknn-ray shuffler serve`` under :data:`BLOCK_SHIM`, which makes
``ray`` and ``server`` unimportable in its process and logs every attempt, so a test sees
both that it ran without them and that it never tried.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sealing.hpke_report import seal_report
from sealing.round_spec import EncoderFile, RoundSpec, sign
from rknn_ray.remote.parties import RUN_CLI, block_finder  # noqa: F401 - the tests' import path
from server.keys import ServerKeyPair
from shuffler.certs import make_certs
from shuffler.service_files import save_layer_key

ROOT = Path(__file__).resolve().parents[1]
BLOCKED = ("ray", "server")


BLOCK_FINDER = block_finder(BLOCKED, "shuffler service")
BLOCK_SHIM = BLOCK_FINDER + RUN_CLI


@dataclass
class World:
    """One round's parties' keys and files under ``folder``."""
    folder: Path
    spec: RoundSpec
    spec_file: Path
    operator: Ed25519PrivateKey
    server: ServerKeyPair
    holders: list[Ed25519PrivateKey]
    certs: object
    shuffler_key: Path
    holders_file: Path
    operator_file: Path
    procs: list = field(default_factory=list)
    files: list = field(default_factory=list)     # served at /files/<sha256> (--file)

    @property
    def spec_hash(self) -> bytes:
        return self.spec.content_hash()

    def seal(self, payload: bytes, report_id: bytes | None = None, spec_hash: bytes | None = None) -> bytes:
        """A report for this round (or another spec hash), sealed for the server then the shuffler."""
        return seal_report(self.spec.server_key, payload, spec_hash or self.spec_hash,
                           report_id or secrets.token_bytes(16), list(self.spec.shuffler_keys))


def make_world(folder: str | Path, *, holders: int = 4, registered: int | None = None,
               opens_in: float = -60, closes_in: float = 600, allowance: int = 3,
               floor: int = 2, payload_len: int = 24, spec_changes: dict | None = None,
               files: list | None = None) -> World:
    """Keys, a signed specification (window from now+``opens_in`` to now+``closes_in``),
    certificates and registry; ``registered`` holders (default all) are in the registry.
    ``spec_changes``: fields of the specification to set (its encoder, mechanism, ...);
    ``files``: what the service serves by digest (``serve --file``)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = time.time()
    operator, server = Ed25519PrivateKey.generate(), ServerKeyPair.generate()
    key_file = folder / "shuffler.key"
    layer = save_layer_key(key_file)
    spec = RoundSpec(
        job_id="trial-job", round=0, opens_at=int(now + opens_in), deadline=int(np.ceil(now + closes_in)),
        model="shuffle", mechanism="collision", mechanism_params={"bins": 8},
        eps0=2.0, eps=1.0, delta=1e-6, min_senders=floor, k=3, connection_rule="rknn",
        queries=np.zeros((2, 3), np.float32), encoder=(EncoderFile("predictor.json", "ab" * 32, 1),),
        server_key=server.public_bytes(), shuffler_keys=(layer.public_bytes(),),
        payload_len=payload_len, allowance=allowance)
    spec = spec.replace(**(spec_changes or {}))
    spec_file = folder / "round.spec"
    spec_file.write_bytes(sign(spec, operator.sign))
    holder_keys = [Ed25519PrivateKey.generate() for _ in range(holders)]
    holders_file = folder / "holders.txt"
    listed = holder_keys[:holders if registered is None else registered]
    holders_file.write_text("# registered holders\n" + "".join(
        k.public_key().public_bytes_raw().hex() + "\n" for k in listed))
    operator_file = folder / "operator.pub"
    operator_file.write_text(operator.public_key().public_bytes_raw().hex() + "\n")
    certs = make_certs(folder / "tls")
    return World(folder, spec, spec_file, operator, server, holder_keys, certs, key_file,
                 holders_file, operator_file, files=[Path(f) for f in files or ()])


def write_holder_keys(world: World) -> list[Path]:
    """Each holder's private key as 64 hex digits in a 0600 file (for client processes)."""
    paths = []
    for i, key in enumerate(world.holders):
        path = world.folder / f"holder{i}.key"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(key.private_bytes_raw().hex())
        paths.append(path)
    return paths


def serve_args(world: World, store: Path, port: int = 0, with_spec: bool = True) -> list[str]:
    """``with_spec=False``: the service waits for the operator to publish (POST /spec)."""
    spec = ["--spec", str(world.spec_file), *[a for f in world.files for a in ("--file", str(f))]]
    return ["shuffler", "serve", *(spec if with_spec else []), "--operator-key",
            str(world.operator_file), "--holders", str(world.holders_file), "--key",
            str(world.shuffler_key), "--cert", str(world.certs.cert), "--cert-key",
            str(world.certs.key), "--store", str(store), "--port", str(port), "--host", "127.0.0.1"]


def start_service(world: World, store: Path | None = None, port: int = 0,
                  timeout: float = 30.0, with_spec: bool = True) -> tuple[subprocess.Popen, str]:
    """The service as its own process (ray and server blocked); ``(process, url)`` once it
    listens. The process is also kept in ``world.procs`` for :func:`stop_all`."""
    store = store or world.folder / "store"
    log = world.folder / "service.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RKNN_BLOCK_LOG": str(world.folder / "blocked.log")}
    proc = subprocess.Popen([sys.executable, "-c", BLOCK_SHIM, *serve_args(world, store, port, with_spec)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=open(log, "ab"),
                            text=True)
    world.procs.append(proc)
    deadline = time.monotonic() + timeout
    os.set_blocking(proc.stdout.fileno(), False)
    line = ""
    while time.monotonic() < deadline:
        line += proc.stdout.readline() or ""
        if line.endswith("\n"):
            break
        if proc.poll() is not None:
            raise RuntimeError(f"shuffler service exited {proc.returncode}: {log.read_text()[-500:]}")
        time.sleep(0.02)
    else:
        raise TimeoutError(f"shuffler service did not start in {timeout} s: {log.read_text()[-500:]}")
    url = line.split("serving ", 1)[1].split()[0]
    return proc, url


def blocked_attempts(world: World) -> list[str]:
    path = world.folder / "blocked.log"
    return path.read_text().split() if path.exists() else []


def stop_all(world: World) -> None:
    """End every process this world started (SIGTERM, then SIGKILL after 5 s)."""
    for proc in world.procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in world.procs:
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        if proc.stdout:
            proc.stdout.close()

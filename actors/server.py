"""Server: holds the private key, opens reports in its own opener processes, releases counts.

The key pair is generated inside this actor (or loaded from a key file the user
names); only the public key leaves it, and the opener processes are this actor's
own children (:mod:`server.opener_pool`). Batches arrive one call at a time
(``submit``); at most ``window`` of them are being opened at once, so a fast sender
waits instead of filling memory. Reports that fail to open, decode or are
duplicates are counted by kind and dropped; nothing a sender does crashes the
server. Central noise is drawn once, in ``finish``, from the OS CSPRNG unless the
run asked for a seeded generator.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import FIRST_COMPLETED, wait

import ray

from rknn_ray.mechanisms.base import Mechanism
from rknn_ray.rng import make_generator
from sealing.envelope import ID_LEN, RoundContext, from_arrow
from sealing.replay import ReplayGuard
from server.accumulator import RoundAccumulator
from server.keys import ServerKeyPair
from server.opener_pool import OpenerPool
from sealing.credentials import SenderAdmission


OPEN_CHUNK = 8192       # at most this many rows per opener task
MIN_CHUNK = 256         # below this a split costs more hand-off than it saves


def open_chunk(rows: int, processes: int) -> int:
    """Rows per opener task: a batch is shared out evenly over the openers (a 10,000-row
    batch as 8192 + 1808 kept one opener busy four times longer than the other)."""
    p = max(1, processes)
    tasks = -(-max(1, rows) // OPEN_CHUNK)
    tasks = -(-tasks // p) * p                 # a multiple of the openers: none idles at the end
    return max(MIN_CHUNK, -(-rows // tasks))


class ServerImpl:
    def __init__(self, job_id: str, key_file: str | None = None, openers: int | None = 0,
                 window: int = 16):
        """``openers``: opener processes, started (and warmed) now; None leaves the count to
        the first round (:meth:`begin_round`), when the round's size is known."""
        self.job_id = job_id
        self._keys = ServerKeyPair.load(key_file) if key_file else ServerKeyPair.generate()
        self._guard = ReplayGuard(ID_LEN)          # report ids, across every round of the job
        self._pool = None if openers is None else OpenerPool(self._keys, openers)
        self._window = max(1, int(window))
        self._lock = threading.Lock()
        self._inflight: set = set()
        self._acc: RoundAccumulator | None = None
        self._admission = None
        self._errors: list[BaseException] = []
        self.timings: dict[str, float] = {}

    def public_key(self) -> bytes:
        return self._keys.public_bytes()

    def begin_round(self, ctx: RoundContext, mechanism: Mechanism,
                    admission: tuple | None = None, openers: int = 0,
                    spec_hash: bytes | None = None) -> None:
        """Start a round. ``admission = (verifier, ctx, allowance, report_width)`` in the central
        and local models,
        where the server is the party that sees senders: each batch is admitted by sender
        credential and per-sender allowance (:mod:`sealing.credentials`) before opening.
        ``openers``: the opener processes to start when the Server was made without a count
        (the first round's; later rounds reuse them). They warm while the clients seal.
        ``spec_hash``: a remote round (rknn_ray/job/remote_session.py): its batches are the
        shuffler service's released HPKE records for that signed specification
        (:meth:`submit_records`), sender identities already dropped."""
        self._drain()
        if self._pool is None:
            self._pool = OpenerPool(self._keys, openers)
        self._pool.begin_round(ctx, mechanism, spec_hash)
        self._acc = RoundAccumulator(mechanism, self._guard)
        self._admission = None
        if admission is not None:
            self._admission = SenderAdmission(*admission)
            self._acc.rejected.update(dict.fromkeys(self._admission.rejected, 0))
        self._errors = []
        self.timings = {"open_wall": 0.0}
        self._t0 = None

    def submit(self, batch) -> int:
        """Queue one Arrow batch for opening; returns its number of rows (0 if unreadable)."""
        if self._acc is None:
            raise RuntimeError("begin_round first")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        if self._admission is not None:
            ciphertexts, _senders, rejects = self._admission.admit(batch)
            dropped = sum(rejects.values())
            with self._lock:
                self._acc.received += dropped
                self._acc.rejected.update(rejects)
            if len(ciphertexts) == 0:
                return 0
        else:
            try:
                ciphertexts, _senders = from_arrow(batch)     # any sender column is ignored
            except Exception:  # noqa: BLE001 - a batch that is not our format is counted, not fatal
                with self._lock:
                    self._acc.received += 1
                    self._acc.rejected["malformed"] += 1
                return 0
        return self._queue(ciphertexts)

    def _queue(self, ciphertexts) -> int:
        step = open_chunk(ciphertexts.shape[0], self._pool.processes)
        for start in range(0, max(1, ciphertexts.shape[0]), step):   # big batches: in parallel
            fut = self._pool.submit(ciphertexts[start:start + step])
            with self._lock:
                self._inflight.add(fut)
            fut.add_done_callback(self._collect)
            while True:
                with self._lock:
                    pending = set(self._inflight)
                if len(pending) < self._window:
                    break
                wait(pending, return_when=FIRST_COMPLETED)
        return int(ciphertexts.shape[0])

    def submit_records(self, records) -> int:
        """Queue one chunk of a released remote batch ((M, width) uint8 server-layer HPKE
        records, no sender column) for opening; returns its number of rows."""
        if self._acc is None:
            raise RuntimeError("begin_round first")
        if self._t0 is None:
            self._t0 = time.perf_counter()
        return self._queue(records)

    def _collect(self, fut) -> None:
        with self._lock:
            self._inflight.discard(fut)
            try:
                self._acc.accumulate(fut.result())
            except BaseException as exc:  # noqa: BLE001 - surfaced by finish()
                self._errors.append(exc)

    def _drain(self) -> None:
        while True:
            with self._lock:
                pending = set(self._inflight)
            if not pending:
                return
            wait(pending)

    def opened(self) -> int:
        """Reports opened so far this round (accepted + rejected): for progress bars only."""
        with self._lock:
            return 0 if self._acc is None else int(self._acc.received)

    def tally(self) -> dict:
        """Wait for every queued batch and say what was opened, releasing nothing.

        ``messages``: reports opened, well formed and fresh (what the release would count);
        the driver computes the guarantee from it before :meth:`finish` releases.
        """
        self._drain()
        if self._errors:
            raise RuntimeError(f"opening failed: {self._errors[0]!r}") from self._errors[0]
        with self._lock:
            return {"messages": int(self._acc.accepted), "received": int(self._acc.received),
                    "rejected": dict(self._acc.rejected)}

    def finish(self, rng_kind: str = "secure", seed: int | None = None) -> dict:
        """Wait for every queued batch, then release the round's counts (once)."""
        self._drain()
        if self._errors:
            raise RuntimeError(f"opening failed: {self._errors[0]!r}") from self._errors[0]
        if self._t0 is not None:
            self.timings["open_wall"] = time.perf_counter() - self._t0
        t0 = time.perf_counter()
        rng = make_generator(rng_kind, seed) if rng_kind == "seeded" else None
        release = self._acc.finalize(rng)
        self.timings["finalize"] = time.perf_counter() - t0
        out = {"counts": release.counts, "messages": release.accepted,
               "received": release.received, "rejected": release.rejected,
               "timings": dict(self.timings)}
        if self._admission is not None:
            out["authenticated_senders"] = self._admission.authenticated_senders
        return out

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.close()


Server = ray.remote(ServerImpl)


def remote_class(impl: type = ServerImpl):
    """The Ray actor class that runs ``impl`` (ServerImpl or a test's subclass)."""
    return Server if impl is ServerImpl else ray.remote(impl)

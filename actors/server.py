"""Server: holds the private key, opens reports, estimates the label counts.

The key pair is generated inside this actor (or loaded from a key file the user
names); only the public key leaves it. Reports that fail to open or decode are
counted by kind ("tampered", "malformed", "wrong_round", "replayed", ...) and
dropped; the server never crashes on them. Central noise is added here, from the
OS CSPRNG unless the run asked for a seeded generator.
"""
from __future__ import annotations

import time
from collections import Counter

import numpy as np
import ray

from rknn_ray.mechanisms.base import Mechanism
from rknn_ray.rng import make_generator
from sealing.envelope import RoundContext, from_arrow
from server.keys import ServerKeyPair
from server.opening import ReportOpener


class ServerImpl:
    def __init__(self, job_id: str, key_file: str | None = None):
        self.job_id = job_id
        self._keys = ServerKeyPair.load(key_file) if key_file else ServerKeyPair.generate()
        self._opener = None
        self._payloads: list[np.ndarray] = []
        self.rejected: Counter = Counter()
        self.received = 0
        self.mechanism: Mechanism | None = None
        self.timings: dict[str, float] = {}

    def public_key(self) -> bytes:
        return self._keys.public_bytes()

    def begin_round(self, ctx: RoundContext, mechanism: Mechanism) -> None:
        self._opener = ReportOpener(self._keys, ctx)
        self.mechanism = mechanism
        self._payloads, self.rejected, self.received = [], Counter(), 0
        self.timings = {"open": 0.0, "decode": 0.0}

    def receive(self, batches: list) -> int:
        """Open a list of Arrow batches; returns how many messages were accepted."""
        accepted = 0
        batches = [ray.get(b) if isinstance(b, ray.ObjectRef) else b for b in batches]
        for batch in batches:
            ciphertexts, _senders = from_arrow(batch)   # any sender column is ignored
            self.received += ciphertexts.shape[0]
            t0 = time.perf_counter()
            payloads, rejected = self._opener.open_batch(ciphertexts)
            self.rejected.update(rejected)
            t1 = time.perf_counter()
            size = self.mechanism.message_size
            if payloads.shape[0] and payloads.shape[1] != size:
                self.rejected["malformed"] += payloads.shape[0]
                continue
            ok = self.mechanism.well_formed(payloads)
            self.rejected["malformed"] += int((~ok).sum())
            self._payloads.append(payloads[ok])
            accepted += int(ok.sum())
            self.timings["open"] += t1 - t0
            self.timings["decode"] += time.perf_counter() - t1
        return accepted

    def num_accepted(self) -> int:
        return int(sum(p.shape[0] for p in self._payloads))

    def set_mechanism(self, mechanism: Mechanism) -> None:
        """Swap in the mechanism calibrated for the n actually shuffled (shuffle model)."""
        self.mechanism = mechanism

    def estimate(self, num_clients: int, rng_kind: str = "secure",
                 seed: int | None = None) -> dict:
        """Decode, debias and (central model) add noise: the released counts."""
        t0 = time.perf_counter()
        size = self.mechanism.message_size
        payloads = (np.concatenate(self._payloads) if self._payloads
                    else np.zeros((0, size), dtype=np.uint8))
        rng = make_generator(rng_kind, seed) if rng_kind == "seeded" else None
        counts = self.mechanism.estimate(payloads, num_clients, rng)
        self.timings["estimate"] = time.perf_counter() - t0
        return {"counts": counts, "messages": int(payloads.shape[0]),
                "received": int(self.received), "rejected": dict(self.rejected),
                "timings": dict(self.timings)}


Server = ray.remote(ServerImpl)

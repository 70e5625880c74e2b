"""Opener processes inside the server's trust domain, feeding one accumulator.

Opening costs a key parse, an X25519 exchange, a key derivation and an AEAD open per
report (the server's share of the crypto floor), and ``cryptography`` holds the GIL, so threads do not scale: the
Server actor starts child *processes* (spawn) and hands each the private key over a pipe
from their parent. The key never goes through Ray (no object store, no task argument);
the children die with the actor. ``processes=0`` opens in the calling process
(tests, the in-process benchmark): same code, no pool.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from rknn_ray.mechanisms.base import Mechanism
from sealing.envelope import RoundContext
from server.accumulator import OpenedBatch, open_and_check
from server.keys import ServerKeyPair
from server.opening import ReportOpener

_CHILD_KEY: ServerKeyPair | None = None


def _child_init(raw_private_key: bytes) -> None:
    global _CHILD_KEY
    _CHILD_KEY = ServerKeyPair(X25519PrivateKey.from_private_bytes(raw_private_key))


def _child_warm() -> int:
    """Import what opening and decoding need, so the first real batch does not pay for it."""
    # the warm-up itself: an opener process imports the mechanisms here, before its first batch
    import rknn_ray.mechanisms  # noqa: F401  (registers every mechanism)
    time.sleep(0.2)             # keep this worker busy so the pool starts the next one too
    return os.getpid()


def _opener(keys: ServerKeyPair, ctx: RoundContext, mechanism: Mechanism,
            spec_hash: bytes | None):
    """The simulation's envelopes, or (``spec_hash`` given: a remote round) HPKE reports
    bound to that round specification (docs/wire-format.md)."""
    if spec_hash is None:
        return ReportOpener(keys, ctx, mechanism.message_size)
    from server.hpke_opening import HpkeBatchOpener
    return HpkeBatchOpener(keys, spec_hash, mechanism.message_size)


def _child_open(ctx: RoundContext, mechanism: Mechanism, ciphertexts: np.ndarray,
                spec_hash: bytes | None = None) -> OpenedBatch:
    return open_and_check(_opener(_CHILD_KEY, ctx, mechanism, spec_hash), mechanism, ciphertexts)


class OpenerPool:
    """``submit(ciphertexts)`` -> Future of an :class:`OpenedBatch` for the current round."""

    def __init__(self, keypair: ServerKeyPair, processes: int):
        self.keypair, self.processes = keypair, int(processes)
        self._ctx: RoundContext | None = None
        self._mechanism: Mechanism | None = None
        self._spec_hash: bytes | None = None
        self._executor = None
        if self.processes > 0:
            raw = keypair.raw_private_bytes()
            self._executor = ProcessPoolExecutor(self.processes, mp_context=mp.get_context("spawn"),
                                                 initializer=_child_init, initargs=(raw,))
            for _ in range(self.processes):     # start and warm every child now, not mid-round
                self._executor.submit(_child_warm)

    def begin_round(self, ctx: RoundContext, mechanism: Mechanism,
                    spec_hash: bytes | None = None) -> None:
        """The round's context and mechanism; ``spec_hash``: its reports are HPKE reports of
        that round specification (a remote round), not the simulation's envelopes."""
        self._ctx, self._mechanism, self._spec_hash = ctx, mechanism, spec_hash

    def submit(self, ciphertexts: np.ndarray) -> Future:
        if self._ctx is None:
            raise RuntimeError("call begin_round(ctx, mechanism) before submitting reports")
        if self._executor is not None:
            return self._executor.submit(_child_open, self._ctx, self._mechanism, ciphertexts,
                                         self._spec_hash)
        done: Future = Future()
        opener = _opener(self.keypair, self._ctx, self._mechanism, self._spec_hash)
        done.set_result(open_and_check(opener, self._mechanism, ciphertexts))
        return done

    def close(self) -> None:
        """Stop the children and wait for them: the job kills the server actor right after
        (rknn_ray/job/session.py), and children still exiting then would find multiprocessing's
        resource tracker gone and print its KeyError tracebacks on the user's console."""
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

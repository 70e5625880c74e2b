"""Randomness sources, with the rules of docs/threat-model.md ("Randomness") built in.

* ``secure`` (default): every private draw comes from a ChaCha20 keystream
  (``randomgen.ChaCha``, 20 rounds: a numpy bit generator whose output is the
  ChaCha20 keystream, checked against the ``cryptography`` package in the tests).
  Server-side noise keys it with 256 fresh bits from the OS CSPRNG; a client keys
  it per (client secret, job, round, batch) with HMAC-SHA256, so a retried client
  re-creates the same report instead of re-randomizing (which would double its
  privacy loss). No Philox, PCG or Mersenne Twister is on this path.
* ``seeded``: a reproducible PCG64 stream and shard secrets derived from
  ``run.seed``, for tests and simulations only. Such a run is **not private**
  (anyone who knows the seed predicts every draw): the CLI refuses it without
  ``--insecure-seeded`` and the report, the ledger and the console say so.

Public, non-private randomness (data splits, partitions, k-means seeds, student
shuffling) uses :func:`seeded_generator`: it protects nothing and must be reproducible.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import sys

import numpy as np
from randomgen import ChaCha

from rknn_ray.errors import ConfigError

RNG_KINDS = ("secure", "seeded")
CHACHA_ROUNDS = 20
NOT_PRIVATE = ("run.rng=seeded: every shard secret and the server's noise are derived from "
               "run.seed, so anyone who knows the seed can predict them. NOT PRIVATE: a "
               "simulation for tests and reproducibility only")


def chacha_generator(key: bytes) -> np.random.Generator:
    """A numpy Generator over the ChaCha20 keystream of a 32-byte key (counter 0, nonce 0)."""
    if len(key) != 32:
        raise ValueError(f"a ChaCha20 key has 32 bytes, got {len(key)}")
    return np.random.Generator(ChaCha(key=int.from_bytes(key, "little"), counter=0,
                                      rounds=CHACHA_ROUNDS))


def secure_generator() -> np.random.Generator:
    """ChaCha20 keyed by 256 fresh bits from the OS CSPRNG (server noise, shuffles)."""
    return chacha_generator(os.urandom(32))


def seeded_generator(seed: int) -> np.random.Generator:
    """A reproducible generator (tests, simulation, and public randomness only)."""
    return np.random.Generator(np.random.PCG64(seed))


def make_generator(kind: str, seed: int | None = None) -> np.random.Generator:
    """The generator a run asked for: ``secure`` or ``seeded`` (needs ``seed``)."""
    if kind == "secure":
        return secure_generator()
    if kind == "seeded":
        if seed is None:
            raise ValueError("rng 'seeded' needs a seed: set run.seed")
        return seeded_generator(int(seed))
    raise ValueError(f"unknown rng kind {kind!r}; use one of {RNG_KINDS}")


def new_client_secret() -> bytes:
    """A fresh 32-byte secret for one client shard, drawn inside the shard itself
    (:mod:`rknn_ray.shard_secrets`): never made by the driver or passed through Ray."""
    return os.urandom(32)


def derived_key(secret: bytes, *labels: object) -> bytes:
    """HMAC-SHA256(secret, labels): a 32-byte key, identical for identical inputs."""
    msg = b"rknn-ray/derive" + b"".join(b"\x00" + str(label).encode() for label in labels)
    return hmac.digest(secret, msg, "sha256")      # = hmac.new(...).digest(), OpenSSL's one-shot


def derived_generator(secret: bytes, *labels: object) -> np.random.Generator:
    """ChaCha20 keyed by :func:`derived_key` (deterministic per secret and labels)."""
    return chacha_generator(derived_key(secret, *labels))


def check_consent(cfg, insecure_seeded: bool) -> None:
    """A seeded run is predictable: it runs only when the caller says so (the CLIs'
    ``--insecure-seeded``), and it says so on stderr."""
    if cfg.run.rng != "seeded":
        return
    if not insecure_seeded:
        raise ConfigError("run.rng", "'seeded' makes every client secret and the server's noise "
                          "predictable from run.seed: the release would not be private",
                          "use run.rng=secure (the default), or add --insecure-seeded to run a "
                          "reproducible simulation that is marked NOT PRIVATE everywhere")
    print(f"WARNING: {NOT_PRIVATE}", file=sys.stderr)


class GeneratorPool:
    """ChaCha20 generators re-keyed in place, for a caller that makes many short-lived ones
    (a process answering for many holders): ``ChaCha(key=...)`` costs ~30 us, most of it
    seeding from OS entropy that the key then replaces; re-keying an existing one ~8 us. A
    re-keyed generator is :func:`chacha_generator` of its key, draw for draw (its counter,
    block and buffered half-word reset: tests/test_rng_pool.py). The generators :meth:`keyed`
    returns are valid until its next call: the caller must not keep them (not thread-safe:
    one pool per thread)."""

    def __init__(self):
        self._made: list[np.random.Generator] = []

    def keyed(self, keys: list[bytes]) -> list[np.random.Generator]:
        while len(self._made) < len(keys):
            self._made.append(chacha_generator(bytes(32)))
        out = self._made[:len(keys)]
        for g, key in zip(out, keys):
            if len(key) != 32:
                raise ValueError(f"a ChaCha20 key has 32 bytes, got {len(key)}")
            g.bit_generator.seed(key=int.from_bytes(key, "little"), counter=0)
        return out

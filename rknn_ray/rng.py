"""Randomness sources, with the rules of DESIGN.md built in.

* ``secure`` (default): every draw comes from the operating system's CSPRNG
  (``secrets`` / ``os.urandom``), wrapped in a numpy ``Generator`` whose bit
  generator is re-seeded from the OS for each call site that asks for one.
* ``seeded``: a reproducible ``numpy`` PCG64 stream, for tests and simulations.
  Reports state which was used (``report.json: "rng"``).

Per-client randomness is *derived*, not drawn: ``client_generator(secret, round_id,
client_id)`` hashes a client's secret seed with the round id, so a retried or
restarted client re-creates the same report instead of re-randomizing (which would
double its privacy loss).
"""
from __future__ import annotations

import hashlib
import os
import secrets

import numpy as np

RNG_KINDS = ("secure", "seeded")



def secure_generator() -> np.random.Generator:
    """A numpy Generator keyed by 256 fresh bits from the OS CSPRNG.

    PCG64 is not a cryptographic generator; for noise that protects data we
    therefore key a Philox counter-based generator (a keyed bijection) with a
    fresh 128-bit key from ``secrets``. Integer noise samplers in
    :mod:`rknn_ray.mechanisms.noise` use exact integer arithmetic on its output.
    """
    key = secrets.randbits(128)
    counter = secrets.randbits(256)
    return np.random.Generator(np.random.Philox(key=key, counter=counter))


def seeded_generator(seed: int) -> np.random.Generator:
    """A reproducible generator (tests and simulation only)."""
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
    """A fresh 32-byte secret for one client shard (never leaves the shard)."""
    return os.urandom(32)


def derived_seed(secret: bytes, *labels: object) -> int:
    """A 256-bit integer derived from ``secret`` and labels (round id, client id...).

    SHA-256 in this role is a PRF keyed by ``secret``; identical inputs give
    identical seeds, which is what makes retries re-send the same report.
    """
    h = hashlib.sha256(secret)
    for label in labels:
        h.update(b"\x00" + str(label).encode())
    return int.from_bytes(h.digest(), "big")


def derived_generator(secret: bytes, *labels: object) -> np.random.Generator:
    """A Philox generator keyed by :func:`derived_seed` (deterministic per labels)."""
    seed = derived_seed(secret, *labels)
    return np.random.Generator(np.random.Philox(key=seed & ((1 << 128) - 1),
                                                counter=seed >> 128))

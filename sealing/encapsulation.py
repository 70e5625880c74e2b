"""The key half of sealing, made once per report: fresh ephemeral X25519, the exchange with
the recipient's key, the key derivation (:func:`derive_key`, BLAKE2b). None of it depends
on the report, its round or the data, so a client may make it before the round
(:class:`EncapsulationPool`) and seal in the round with only the AEAD and the credential
tag left to do.

What may never happen is a second use: every report's AEAD key is used with the fixed nonce
of :mod:`sealing.envelope`, so two reports under one key would leak their XOR and forge
tags. An encapsulation is therefore handed out by :meth:`EncapsulationPool.take` exactly
once (it leaves the pool as it is taken), the pool refuses to be pickled (no copy of it
can leave its process, so a Ray retry, a checkpoint or a second actor never holds the same
keys), and a restarted process starts with an empty pool. The keys are bound to one
recipient key and one layer (both public keys and the layer are hashed into the key); the
round is bound by the AEAD's associated data at sealing, so a key made before the round
seals for that round alone.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from hashlib import blake2b

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

try:   # the body of X25519PublicKey.from_public_bytes without its per-call import and
    # backend check: 2.3 instead of 5.7 us, paid once per report by whoever opens it
    from cryptography.hazmat.bindings._rust import openssl as _rust_openssl
    parse_public_key = _rust_openssl.x25519.from_public_bytes
except (ImportError, AttributeError):   # another cryptography layout: the public API
    parse_public_key = X25519PublicKey.from_public_bytes

KEY_LEN = 32                  # X25519 public key / AEAD key
KDF_LABEL = b"rknn-ray/seal"
CHUNK = 4096                  # encapsulations per primitive-at-a-time pass


def layer_info(prefix: bytes) -> bytes:
    """The key derivation's context: a fixed label plus version and layer (domain-separates
    the layers and the wire versions)."""
    return KDF_LABEL + prefix[:2]


def derive_key(shared: bytes, eph_pub: bytes, recipient_pub: bytes, info: bytes) -> bytes:
    """The AEAD key of one report: BLAKE2b-256 of (X25519 secret | ephemeral public key |
    recipient public key | ``info``).

    The construction of libsodium's ``crypto_kx`` (a hash of the shared point and both
    public keys), plus the layer's context. Format version 2 of :mod:`sealing.envelope`
    (version 1's HKDF-SHA256 cost several times the CPU, mostly the library's per-call
    object set-up, paid once per report on each side).
    """
    return blake2b(shared + eph_pub + recipient_pub + info, digest_size=KEY_LEN).digest()


def recipient_key(key: bytes | X25519PublicKey) -> tuple[X25519PublicKey, bytes]:
    """A recipient's public key as (key object, its 32 raw bytes); ValueError on a wrong length."""
    if isinstance(key, X25519PublicKey):
        return key, key.public_bytes_raw()
    key = bytes(key)
    if len(key) != KEY_LEN:
        raise ValueError(f"a recipient public key is {KEY_LEN} raw X25519 bytes, got {len(key)}; "
                         "pass ServerKeyPair.public_bytes()")
    return X25519PublicKey.from_public_bytes(key), key


def encapsulate(recipient: bytes | X25519PublicKey, count: int,
                info: bytes) -> tuple[list[bytes], list[bytes]]:
    """``count`` fresh (ephemeral public key, AEAD key) pairs for ``recipient`` and ``info``.

    One primitive at a time over a chunk, not all primitives per report: the same calls,
    ~10% less CPU (docs/results.md, "Sealing and opening by primitive"); chunks bound the
    ephemeral private keys alive at once (they are dropped after the exchange).
    """
    pub_obj, pub_bytes = recipient_key(recipient)
    pubs, keys = [], []
    generate = X25519PrivateKey.generate
    for lo in range(0, int(count), CHUNK):
        ephs = [generate() for _ in range(min(CHUNK, int(count) - lo))]
        chunk_pubs = [eph.public_key().public_bytes_raw() for eph in ephs]
        shared = [eph.exchange(pub_obj) for eph in ephs]
        del ephs
        keys += [derive_key(secret, eph_pub, pub_bytes, info)
                 for eph_pub, secret in zip(chunk_pubs, shared)]
        pubs += chunk_pubs
    return pubs, keys


class EncapsulationPool:
    """Encapsulations made ahead of a round, each handed out once (see module docstring).

    ``fill`` makes them (between rounds); ``take`` hands out the ones made and makes the
    rest fresh, so sealing never waits for a pool and never runs short. At most
    ``max_ready`` wait per process (64 bytes of key material each, plus Python's objects).
    Thread-safe: ``take`` and ``fill`` may run on different threads.
    """

    def __init__(self, max_ready: int = 1 << 20):
        if int(max_ready) < 0:
            raise ValueError(f"max_ready must be >= 0, got {max_ready}")
        self.max_ready = int(max_ready)
        self._ready: dict[tuple[bytes, bytes], deque] = {}    # (recipient, info) -> chunks
        self._lock = threading.Lock()
        self.made = 0             # encapsulations fill() made in this process
        self.used = 0             # of those, handed out by take()
        self.fresh = 0            # made inside take() because none were ready
        self.fill_cpu_s = 0.0     # CPU seconds fill() spent

    def __reduce__(self):
        raise TypeError("an EncapsulationPool holds one-time keys and never leaves its process "
                        "(a copy could seal two reports under one key)")

    def ready(self, recipient: bytes | None = None, info: bytes | None = None) -> int:
        """Encapsulations waiting (for one recipient and layer, or in all)."""
        with self._lock:
            return sum(len(c[0]) for key, chunks in self._ready.items()
                       if recipient is None or key == (bytes(recipient), info) for c in chunks)

    def fill(self, recipient: bytes | X25519PublicKey, info: bytes, count: int) -> int:
        """Make encapsulations until ``count`` wait for (recipient, info), within ``max_ready``
        in all; returns how many were made now."""
        _, pub_bytes = recipient_key(recipient)
        key = (pub_bytes, bytes(info))
        want = min(int(count) - self.ready(pub_bytes, key[1]), self.max_ready - self.ready())
        made = 0
        t0 = time.thread_time()
        while made < want:
            pubs, keys = encapsulate(recipient, min(CHUNK, want - made), key[1])
            with self._lock:
                self._ready.setdefault(key, deque()).append([pubs, keys])
                self.made += len(pubs)
            made += len(pubs)
        self.fill_cpu_s += time.thread_time() - t0
        return made

    def take(self, recipient: bytes | X25519PublicKey, info: bytes,
             count: int) -> tuple[list[bytes], list[bytes]]:
        """``count`` encapsulations for (recipient, info): the ready ones first, each removed
        from the pool as it is handed out, then fresh ones for the rest."""
        _, pub_bytes = recipient_key(recipient)
        pubs, keys = [], []
        with self._lock:
            chunks = self._ready.get((pub_bytes, bytes(info)))
            while chunks and len(pubs) < count:
                c_pubs, c_keys = chunks[0]
                n = min(count - len(pubs), len(c_pubs))
                pubs += c_pubs[:n]
                keys += c_keys[:n]
                if n == len(c_pubs):
                    chunks.popleft()
                else:              # the rest of the chunk stays; the taken ones are gone from it
                    chunks[0] = [c_pubs[n:], c_keys[n:]]
            self.used += len(pubs)
        if len(pubs) < count:
            more_pubs, more_keys = encapsulate(recipient, count - len(pubs), bytes(info))
            self.fresh += len(more_pubs)
            pubs += more_pubs
            keys += more_keys
        return pubs, keys

    def drop(self, keep: list[tuple[bytes, bytes]] = ()) -> int:
        """Forget every ready encapsulation but those for the (recipient, info) pairs in
        ``keep`` (a recipient's key changed, the job ended); returns how many were dropped."""
        keep = {(bytes(r), bytes(i)) for r, i in keep}
        with self._lock:
            gone = [key for key in self._ready if key not in keep]
            n = sum(len(c[0]) for key in gone for c in self._ready[key])
            for key in gone:
                del self._ready[key]
        return n

    def stats(self) -> dict:
        return {"ready": self.ready(), "made": self.made, "used": self.used,
                "fresh": self.fresh, "fill_cpu_s": self.fill_cpu_s}

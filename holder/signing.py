"""A holder's Ed25519 upload key signing through libsodium (PyNaCl), as a drop-in
``Ed25519PrivateKey``.

Why: a holder makes its key from its 32-byte seed and signs its report with it once per
round, and OpenSSL (``cryptography``) spends about 37 us deriving the public key at load and
38 us per signature here, libsodium 22 and 24 (its fixed-base multiplication is faster).
It is the same Ed25519 (RFC 8032): deterministic, so the same seed signs the same message
with the same 64 bytes as ``cryptography`` (tests/test_signing.py checks it, bit for bit),
and the service verifies it as before. The seed stays in this object as it stays in
OpenSSL's; PEM export goes through ``cryptography`` unchanged.
"""
from __future__ import annotations

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

SEED_LEN = 32
SIGNATURE_LEN = 64


class SodiumEd25519PrivateKey(Ed25519PrivateKey):
    """An ``Ed25519PrivateKey`` whose key derivation and signatures are libsodium's."""

    __slots__ = ("_seed", "_public", "_secret")

    def __init__(self, seed: bytes):
        seed = bytes(seed)
        if len(seed) != SEED_LEN:
            raise ValueError(f"an Ed25519 private key is {SEED_LEN} raw bytes, got {len(seed)}")
        self._seed = seed
        self._public, self._secret = crypto_sign_seed_keypair(seed)   # (pk 32, seed | pk 64)

    @classmethod
    def from_private_bytes(cls, data) -> "SodiumEd25519PrivateKey":
        return cls(bytes(data))

    @classmethod
    def of(cls, key: Ed25519PrivateKey) -> "SodiumEd25519PrivateKey":
        """The same key (``cryptography``'s, e.g. loaded from PEM) signing through libsodium."""
        return key if isinstance(key, cls) else cls(key.private_bytes_raw())

    def public_bytes_raw(self) -> bytes:
        """The raw 32-byte public key (the holder's key id), without an object around it."""
        return self._public

    def public_key(self) -> Ed25519PublicKey:
        return Ed25519PublicKey.from_public_bytes(self._public)

    def sign(self, data) -> bytes:
        return crypto_sign(bytes(data), self._secret)[:SIGNATURE_LEN]

    def private_bytes_raw(self) -> bytes:
        return self._seed

    def private_bytes(self, encoding: serialization.Encoding, format: serialization.PrivateFormat,
                      encryption_algorithm: serialization.KeySerializationEncryption) -> bytes:
        return Ed25519PrivateKey.from_private_bytes(self._seed).private_bytes(
            encoding, format, encryption_algorithm)

    def __copy__(self) -> "SodiumEd25519PrivateKey":
        return self

    def __deepcopy__(self, memo: dict) -> "SodiumEd25519PrivateKey":
        return self

    def __repr__(self) -> str:
        return f"SodiumEd25519PrivateKey(public={self._public.hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("a holder's private key is not pickled: it stays in the holder's process")

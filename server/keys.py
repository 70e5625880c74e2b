"""The server's X25519 key pair: generated inside the Server actor, or loaded from a 0600 file.

Only :meth:`ServerKeyPair.public_bytes` ever leaves the server's trust domain; the
object refuses to be pickled so it cannot slip into Ray's object store by accident.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from rknn_ray.errors import ConfigError, first_line
from rknn_ray.runio import write_private
from sealing.hpke_report import SUITE as HPKE_SUITE


class ServerKeyPair:
    """The server's X25519 key pair for one job (the private half never leaves the actor)."""

    def __init__(self, private_key: X25519PrivateKey):
        self._private = private_key
        self._public = private_key.public_key().public_bytes_raw()

    @classmethod
    def generate(cls) -> "ServerKeyPair":
        return cls(X25519PrivateKey.generate())

    def public_bytes(self) -> bytes:
        """The 32 raw public-key bytes clients seal to."""
        return self._public

    def raw_private_bytes(self) -> bytes:
        """The 32 raw private-key bytes, for the Server actor's own opener processes only
        (:mod:`server.opener_pool` hands them over a pipe to its children, never to Ray)."""
        return self._private.private_bytes(serialization.Encoding.Raw,
                                           serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())

    def exchange(self, peer_public):
        return self._private.exchange(peer_public)

    def hpke_open(self, sealed: bytes, info: bytes) -> bytes:
        """RFC 9180 OpenBase of ``enc | ciphertext`` (empty aad): the key half of opening an
        HPKE report (:mod:`sealing.hpke_open`), so the private key never leaves this object."""
        return HPKE_SUITE.decrypt(sealed, self._private, info=info)

    def __repr__(self) -> str:   # never print the private key (logs, tracebacks)
        return f"ServerKeyPair(public={self._public.hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("ServerKeyPair must not be pickled: the private key stays in the Server "
                        "actor; send public_bytes() instead, or save() it to a 0600 key file")

    def save(self, path: str | os.PathLike) -> Path:
        """Write the private key (PKCS#8 PEM) atomically with mode 0600."""
        path = Path(path)
        pem = self._private.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption())
        write_private(path, pem)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "ServerKeyPair":
        """Read a key file written by :meth:`save`; refuse one others can read."""
        path = check_key_file(path)
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        except (ValueError, TypeError) as exc:
            raise ConfigError("--key-file", f"{path} is not an unencrypted PEM private key "
                              f"({first_line(exc, 160) or type(exc).__name__})", "write it with ServerKeyPair.save") from None
        if not isinstance(key, X25519PrivateKey):
            raise ConfigError("--key-file", f"{path} holds a {type(key).__name__}, not an X25519 "
                              "key", "write an X25519 key with ServerKeyPair.save, or omit "
                              "--key-file to generate a fresh key for this job")
        return cls(key)


def check_key_file(path: str | os.PathLike, load: bool = False) -> Path:
    """The checks a key file must pass: the driver runs them before Ray starts (``load``:
    also parse the key and check it is X25519), so a wrong path, mode or key type is a
    clear error, not a dead Server actor."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("--key-file", f"no key file at {path}",
                          "give the path of a file written by ServerKeyPair.save, or omit it "
                          "to generate a fresh key for this job")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError("--key-file", f"{path} is accessible by others (mode {mode:o})",
                          f"run: chmod 600 {path}")
    with open(path, "rb") as fh:
        head = fh.read(64)
    if not head.startswith(b"-----BEGIN PRIVATE KEY-----"):
        raise ConfigError("--key-file", f"{path} is not a PEM private key file",
                          "write it with ServerKeyPair.save")
    if load:
        ServerKeyPair.load(path)          # parses it; the private key is dropped at once
    return path

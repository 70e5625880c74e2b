"""A holder's identity: its Ed25519 upload key and its own 32-byte secret (both 0600).

The secret never leaves the holder: report ids and the randomizer's keystream are derived
from it and the specification's hash (HMAC, rknn_ray.rng.derived_key), so answering the
same specification again re-creates the same report bytes (a retry is idempotent and
spends nothing twice), and no other party can predict a coin.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from holder.signing import SodiumEd25519PrivateKey
from rknn_ray.rng import derived_generator, derived_key
from sealing.hpke_report import REPORT_ID_LEN

KEY_FILE = "holder.key"          # Ed25519, PKCS#8 PEM
SECRET_FILE = "holder.secret"    # 32 raw bytes
SECRET_LEN = 32


class IdentityError(ValueError):
    """A key folder that cannot be used (one line: what, and the fix)."""


@dataclass(frozen=True)
class Identity:
    key: Ed25519PrivateKey
    secret: bytes

    @property
    def key_id(self) -> str:
        """The public key as 64 hex digits: the line the shuffler's holder registry lists."""
        return public_raw(self.key).hex()

    def report_ids(self, spec_hash: bytes, count: int) -> np.ndarray:
        """(count, 16) uint8: message i's report id for this specification, from the secret."""
        ids = [derived_key(self.secret, "report-id", spec_hash.hex(), i)[:REPORT_ID_LEN]
               for i in range(int(count))]
        return np.frombuffer(b"".join(ids), np.uint8).reshape(int(count), REPORT_ID_LEN)

    def generator(self, spec_hash: bytes) -> np.random.Generator:
        """The randomizer's ChaCha20 stream for this specification (the same on a retry)."""
        return derived_generator(self.secret, "randomize", spec_hash.hex())

    def generator_key(self, spec_hash: bytes) -> bytes:
        """The key of :meth:`generator`'s stream (for a re-keyed pool, rknn_ray.rng)."""
        return derived_key(self.secret, "randomize", spec_hash.hex())


def public_raw(key: Ed25519PrivateKey) -> bytes:
    """A private key's raw 32-byte public key (no object around it where the key has it)."""
    raw = getattr(key, "public_bytes_raw", None)
    return raw() if raw is not None else key.public_key().public_bytes_raw()


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def keygen(folder: str | os.PathLike) -> Identity:
    """A fresh key and secret in ``folder`` (made 0700 if new); refuses to overwrite."""
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    for name in (KEY_FILE, SECRET_FILE):
        if (folder / name).exists():
            raise IdentityError(f"{folder / name} exists: keep it (its key may be registered) "
                                "or give another --out folder")
    key, secret = Ed25519PrivateKey.generate(), os.urandom(SECRET_LEN)
    _write_private(folder / KEY_FILE, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    _write_private(folder / SECRET_FILE, secret)
    return Identity(SodiumEd25519PrivateKey.of(key), secret)


def _private_file(path: Path) -> bytes:
    if not path.is_file():
        raise IdentityError(f"--key: no {path.name} in {path.parent}; make one with "
                            f"'rknn-ray holder keygen --out {path.parent}'")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise IdentityError(f"--key: {path} is readable by others; chmod 600 {path}")
    return path.read_bytes()


def load(folder: str | os.PathLike) -> Identity:
    """The identity :func:`keygen` wrote to ``folder``."""
    folder = Path(folder)
    pem, secret = _private_file(folder / KEY_FILE), _private_file(folder / SECRET_FILE)
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError):
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"--key: {folder / KEY_FILE} is not an unencrypted Ed25519 PEM key; "
                            "make one with 'rknn-ray holder keygen --out DIR'")
    if len(secret) != SECRET_LEN:
        raise IdentityError(f"--key: {folder / SECRET_FILE} is {len(secret)} bytes, not "
                            f"{SECRET_LEN}; make a new identity with 'rknn-ray holder keygen'")
    return Identity(SodiumEd25519PrivateKey.of(key), secret)     # signs through libsodium

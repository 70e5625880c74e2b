"""The operator's Ed25519 signing key: PKCS#8 PEM in a 0600 file, its public half as 64 hex
digits (what holders and the shuffler service are given with ``--operator-key``).

It signs the round specification (sealing.round_spec.sign) and the batch fetch and early
close (sealing.upload_wire); it never leaves the operator's driver.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rknn_ray.errors import DataError
from rknn_ray.runio import write_private


def save_operator_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """A new key in ``path`` (0600; refuses to overwrite) and its public half beside it
    (``<path>.pub``, 64 hex digits)."""
    path = Path(path)
    if path.exists():
        raise DataError(f"--out: {path} exists; the operator's key is never overwritten. Fix: "
                        "give a new path, or keep using that key")
    key = Ed25519PrivateKey.generate()
    write_private(path, key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public_file(path).write_text(public_hex(key) + "\n")
    return key


def public_file(path: str | os.PathLike) -> Path:
    return Path(f"{path}.pub")


def public_hex(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes_raw().hex()


def _is_public_half(path: Path) -> bool:
    """Whether ``path`` holds 64 hex digits (a public key file), read only if it is small."""
    if path.stat().st_size > 200:
        return False
    text = path.read_bytes().strip()
    return len(text) == 64 and all(c in b"0123456789abcdefABCDEF" for c in text)


def load_operator_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The key in ``path`` (DataError with one line: missing, readable by others, not Ed25519)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"remote.operator_key: no file at {path}. Fix: make one with "
                        "'rknn-ray operator keygen --out FILE'")
    if _is_public_half(path):         # the .pub file given by mistake: chmod would not help
        private = path.with_suffix("") if path.suffix == ".pub" else "the key file"
        raise DataError(f"remote.operator_key: {path} is the operator's public key (64 hex "
                        f"digits). Fix: give its private key file ({private}, which 'rknn-ray "
                        "operator keygen --out FILE' wrote beside FILE.pub)")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise DataError(f"remote.operator_key: {path} is readable by other users. Fix: "
                        f"chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except ValueError:
        key = None
    if not isinstance(key, Ed25519PrivateKey):
        raise DataError(f"remote.operator_key: {path} is not an Ed25519 private key (PKCS#8 "
                        "PEM). Fix: make one with 'rknn-ray operator keygen --out FILE'")
    return key

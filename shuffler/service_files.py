"""The files a shuffler service starts from: its HPKE layer key, the holder registry, the
operator's public key. Each read fails with one line naming the file and the fix.

The registry is the shuffler's own (its organisation admits holders), not the
specification's: an operator could otherwise list keys it controls and fill the floor of
distinct holders with its own sybils.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from rknn_ray.runio import write_private
from shuffler.layers import LayerKeyPair


class ServiceFileError(ValueError):
    """A start-up file that cannot be used (one line: what is wrong, and the fix)."""


def save_layer_key(path: str | os.PathLike, layer: int = 1) -> LayerKeyPair:
    """A fresh X25519 layer key written as PKCS#8 PEM, mode 0600 (atomic); refuses to
    overwrite an existing file (the published public key would no longer match)."""
    path = Path(path)
    if path.exists():
        raise ServiceFileError(f"{path} exists: keep it (its public key may be published) or "
                               "give another --out path")
    private = X25519PrivateKey.generate()
    pem = private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    write_private(path, pem)
    return LayerKeyPair(private, layer)


def load_layer_key(path: str | os.PathLike, layer: int = 1) -> LayerKeyPair:
    """The layer key in a 0600 PEM file written by :func:`save_layer_key`."""
    path = Path(path)
    if not path.is_file():
        raise ServiceFileError(f"--key: no key file at {path}; make one with "
                               "'rknn-ray shuffler keygen --out FILE'")
    if stat.S_IMODE(path.stat().st_mode) & 0o077:
        raise ServiceFileError(f"--key: {path} is readable by others; chmod 600 {path}")
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (ValueError, TypeError):
        raise ServiceFileError(f"--key: {path} is not an unencrypted PEM private key; make one "
                               "with 'rknn-ray shuffler keygen --out FILE'") from None
    if not isinstance(key, X25519PrivateKey):
        raise ServiceFileError(f"--key: {path} holds a {type(key).__name__}, not an X25519 key; "
                               "make one with 'rknn-ray shuffler keygen --out FILE'")
    return LayerKeyPair(key, layer)


def _hex_key(text: str, where: str) -> Ed25519PublicKey:
    try:
        raw = bytes.fromhex(text)
        if len(raw) != 32:
            raise ValueError
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        # never echoed: a file given by mistake may hold a private key
        what = ("a PEM private key: give the public half (64 hex digits, the .pub file), never "
                "the private key" if "PRIVATE KEY" in text
                else f"{len(text)} characters, not 64 hex digits")
        raise ServiceFileError(f"{where}: not an Ed25519 public key (64 hex digits: its 32 raw "
                               f"bytes); it holds {what}") from None


def read_holders(path: str | os.PathLike) -> dict[bytes, Ed25519PublicKey]:
    """The registry: one holder's Ed25519 public key per line (64 hex digits), optionally
    followed by the holder's record count (public under the job's relation; the operator's
    job reads it, :mod:`rknn_ray.job.remote_holders`); blank lines and text after ``#`` are
    ignored. Key id = the 32 raw public-key bytes."""
    path = Path(path)
    if not path.is_file():
        raise ServiceFileError(f"--holders: no file at {path}; write one hex Ed25519 public "
                               "key per line")
    holders = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].split()
        if text:
            key = _hex_key(text[0], f"--holders {path} line {n}")
            holders[key.public_bytes_raw()] = key
    if not holders:
        raise ServiceFileError(f"--holders: {path} lists no key; write one hex Ed25519 public "
                               "key per line")
    return holders


def read_operator_key(path: str | os.PathLike) -> Ed25519PublicKey:
    """The operator's Ed25519 public key: one line of 64 hex digits."""
    path = Path(path)
    if not path.is_file():
        raise ServiceFileError(f"--operator-key: no file at {path}; write the operator's "
                               "Ed25519 public key there as 64 hex digits")
    return _hex_key(path.read_text().strip(), f"--operator-key {path}")

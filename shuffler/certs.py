"""A private CA and a server certificate for trials and tests (``rknn-ray shuffler cert``).

A real deployment uses a certificate from its own CA or a public one; this makes the
pair a one-machine trial needs, so holders verify the service against ``ca.pem`` rather
than switching verification off. Keys are written 0600; the CA key is kept only so more
server certificates can be issued from the same CA.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import NamedTuple

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

VALID_DAYS = 30


class CertFiles(NamedTuple):
    ca: Path          # give this to clients (--cafile)
    cert: Path        # the service's --cert
    key: Path         # the service's --cert-key


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_certs(folder: str | os.PathLike, hosts: tuple[str, ...] = ("127.0.0.1", "localhost"),
               days: int = VALID_DAYS) -> CertFiles:
    """Write ``ca.pem``, ``ca.key``, ``server.pem`` and ``server.key`` into ``folder``: a
    self-signed P-256 CA and a server certificate it signs for ``hosts`` (IP addresses
    or DNS names, as subjectAltName)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rknn-ray trial CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(start).not_valid_after(end)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(start).not_valid_after(end)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    files = CertFiles(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    _write(files.ca, ca.public_bytes(serialization.Encoding.PEM), private=False)
    _write(folder / "ca.key", _pem_key(ca_key), private=True)
    _write(files.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(files.key, _pem_key(key), private=True)
    return files

"""RFC 9180 SealBase for the report format's one suite, with libsodium's X25519.

The suite is :data:`sealing.hpke_report.SUITE`: base mode, DHKEM(X25519, HKDF-SHA256),
HKDF-SHA256, AES-128-GCM. ``cryptography``'s ``Suite.encrypt`` does the same in about 96 us
here, most of it two X25519 multiplications through OpenSSL's generic ladder (the ephemeral
public key ~38 us, the shared secret ~39 us); libsodium computes the ephemeral public key
with its fixed-base tables (~20 us), so a holder's two layers cost ~30 us less. The key
schedule below is RFC 9180 sections 4.1 (DHKEM Encap, ExtractAndExpand) and 5.1
(KeySchedule, base mode, empty psk), HMAC-SHA256 one-shots, then one AES-128-GCM
encryption under ``base_nonce`` (sequence 0). The output is ``enc | ciphertext``, exactly
what ``Suite.encrypt`` returns, so any HPKE implementation opens it
(tests/test_hpke_seal.py: the RFC's A.1.1 vector, and ``cryptography`` and ``pyhpke``
opening it).

The ephemeral secret is 32 bytes from the OS CSPRNG per call (RFC 9180 GenerateKeyPair
for X25519; libsodium clamps it, as RFC 7748 decodes a scalar) and lives only in this call.
An all-zero shared secret (a small-order recipient key) is refused, as RFC 9180 7.1.4 asks.
"""
from __future__ import annotations

import hmac
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nacl.bindings import crypto_scalarmult, crypto_scalarmult_base
from nacl.exceptions import RuntimeError as SodiumError

KEY_LEN = 32                                  # X25519 public keys, secrets and Nsecret
_V1 = b"HPKE-v1"
_KEM_SUITE = b"KEM" + (0x0020).to_bytes(2, "big")
_HPKE_SUITE = b"HPKE" + (0x0020).to_bytes(2, "big") + (0x0001).to_bytes(2, "big") \
    + (0x0001).to_bytes(2, "big")
_NO_SALT = bytes(32)                          # HKDF-Extract with an empty salt: HashLen zeros
_MODE_BASE = b"\x00"
_NK, _NN = 16, 12                             # AES-128-GCM key and nonce


def _extract(salt: bytes, suite: bytes, label: bytes, ikm: bytes) -> bytes:
    """LabeledExtract (RFC 9180 section 4)."""
    return hmac.digest(salt or _NO_SALT, _V1 + suite + label + ikm, "sha256")


def _expand(prk: bytes, suite: bytes, label: bytes, info: bytes, length: int) -> bytes:
    """LabeledExpand for length <= 32 (one HKDF-Expand block)."""
    return hmac.digest(prk, length.to_bytes(2, "big") + _V1 + suite + label + info + b"\x01",
                       "sha256")[:length]


_PSK_ID_HASH = _extract(b"", _HPKE_SUITE, b"psk_id_hash", b"")


def _schedule(dh: bytes, enc: bytes, recipient: bytes, info: bytes) -> tuple[bytes, bytes]:
    """(key, base_nonce) from the DH output (ExtractAndExpand, then KeySchedule)."""
    eae_prk = _extract(b"", _KEM_SUITE, b"eae_prk", dh)
    shared = _expand(eae_prk, _KEM_SUITE, b"shared_secret", enc + recipient, KEY_LEN)
    context = _MODE_BASE + _PSK_ID_HASH + _extract(b"", _HPKE_SUITE, b"info_hash", info)
    secret = _extract(shared, _HPKE_SUITE, b"secret", b"")
    return (_expand(secret, _HPKE_SUITE, b"key", context, _NK),
            _expand(secret, _HPKE_SUITE, b"base_nonce", context, _NN))


def seal_base(recipient: bytes, plaintext: bytes, info: bytes, *, aad: bytes = b"",
              ephemeral: bytes | None = None) -> bytes:
    """``enc | AEAD ciphertext`` of HPKE SealBase(pkR = ``recipient`` (32 raw bytes),
    info, aad, plaintext). ``ephemeral`` (32 bytes) is for the RFC's test vector only;
    None, as every caller passes, draws a fresh one from the OS CSPRNG."""
    recipient = bytes(recipient)
    if len(recipient) != KEY_LEN:
        raise ValueError(f"an HPKE recipient key is {KEY_LEN} raw X25519 bytes, got {len(recipient)}")
    secret = os.urandom(KEY_LEN) if ephemeral is None else bytes(ephemeral)
    try:
        enc = crypto_scalarmult_base(secret)
        dh = crypto_scalarmult(secret, recipient)     # libsodium refuses an all-zero result
    except SodiumError:
        raise ValueError("the recipient's X25519 key is of small order: the shared secret "
                         "would be zero (RFC 9180 7.1.4); not sealed") from None
    key, nonce = _schedule(dh, enc, recipient, bytes(info))
    return enc + AESGCM(key).encrypt(nonce, bytes(plaintext), bytes(aad) or None)

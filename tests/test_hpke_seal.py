"""sealing.hpke_seal.seal_base is RFC 9180 SealBase of the report suite: the RFC's A.1.1
vector reproduced byte for byte from its ephemeral key, and what it seals opened by
cryptography's Suite.decrypt (OpenSSL) and by pyhpke, the implementations it replaces on
the holder's path."""
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from pyhpke import AEADId, CipherSuite, KDFId, KEMId

from sealing.hpke_report import SUITE, seal_layer, unpack_header, layer_info, HEADER_LEN
from sealing.hpke_seal import _schedule, seal_base

VECTOR = json.loads((Path(__file__).parent / "fixtures"
                     / "rfc9180_a11_x25519_sha256_aes128gcm.json").read_text())
H = bytes.fromhex


def test_the_rfc_vector_byte_for_byte():
    one = VECTOR["encryptions"][0]
    assert one["sequence_number"] == 0
    sealed = seal_base(H(VECTOR["pkRm"]), H(one["pt"]), H(VECTOR["info"]), aad=H(one["aad"]),
                       ephemeral=H(VECTOR["skEm"]))
    assert sealed == H(VECTOR["enc"]) + H(one["ct"])
    dh = X25519PrivateKey.from_private_bytes(H(VECTOR["skEm"])).exchange(
        X25519PrivateKey.from_private_bytes(H(VECTOR["skRm"])).public_key())
    key, nonce = _schedule(dh, H(VECTOR["enc"]), H(VECTOR["pkRm"]), H(VECTOR["info"]))
    assert key == H(VECTOR["key"]) and nonce == H(VECTOR["base_nonce"])


def test_openssl_and_pyhpke_open_it():
    sk = X25519PrivateKey.generate()
    pk = sk.public_key().public_bytes_raw()
    py = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.AES128_GCM)
    py_sk = py.kem.deserialize_private_key(X25519PrivateKey.from_private_bytes(
        sk.private_bytes_raw()).private_bytes_raw())
    for n in (0, 1, 9, 107, 1000):
        pt, info = os.urandom(n), os.urandom(n % 70)
        sealed = seal_base(pk, pt, info)
        assert len(sealed) == 32 + n + 16
        assert SUITE.decrypt(sealed, sk, info=info) == pt
        ctx = py.create_recipient_context(sealed[:32], py_sk, info)
        assert ctx.open(sealed[32:], aad=b"") == pt
        assert seal_base(pk, pt, info)[:32] != sealed[:32]      # a fresh ephemeral key each time


def test_a_layer_still_opens_with_the_suite_and_binds_its_header():
    sk = X25519PrivateKey.generate()
    rec = seal_layer(sk.public_key().public_bytes_raw(), b"abc", bytes(32), bytes(16), 1)
    assert unpack_header(rec).layer == 1
    assert SUITE.decrypt(rec[HEADER_LEN:], sk, info=layer_info(rec[:HEADER_LEN])) == b"abc"
    with pytest.raises(Exception):
        SUITE.decrypt(rec[HEADER_LEN:], sk, info=layer_info(b"\x03\x02" + rec[2:HEADER_LEN]))


def test_a_wrong_or_small_order_recipient_is_refused():
    with pytest.raises(ValueError):
        seal_base(bytes(31), b"x", b"")
    with pytest.raises(ValueError):
        seal_base(bytes(32), b"x", b"")                  # the identity point: DH is zero
    with pytest.raises(ValueError):
        seal_layer(bytes(33), b"x", bytes(32), bytes(16), 0)

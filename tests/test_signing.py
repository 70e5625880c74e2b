"""holder.signing: the holder's Ed25519 key through libsodium is the same key and makes the
same signatures, bit for bit, as cryptography's (OpenSSL), so nothing on the wire changes."""
import os
import pickle

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from holder.identity import keygen, load
from holder.signing import SodiumEd25519PrivateKey
from sealing.upload_client import sign_reports
from sealing.upload_wire import signed_message


def test_same_public_key_and_signatures_as_openssl():
    for n in range(50):
        seed, msg = os.urandom(32), os.urandom(n * 7)
        ossl = Ed25519PrivateKey.from_private_bytes(seed)
        fast = SodiumEd25519PrivateKey(seed)
        assert isinstance(fast, Ed25519PrivateKey)
        assert fast.public_bytes_raw() == ossl.public_key().public_bytes_raw()
        assert fast.public_key() == ossl.public_key()
        assert fast.sign(msg) == ossl.sign(msg)                 # Ed25519 is deterministic
        ossl.public_key().verify(fast.sign(msg), msg)
        assert fast.private_bytes_raw() == seed


def test_rfc8032_test_vector_1():
    seed = bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
    key = SodiumEd25519PrivateKey(seed)
    assert key.public_bytes_raw().hex() == ("d75a980182b10ab7d54bfed3c964073a"
                                            "0ee172f3daa62325af021a68f707511a")
    assert key.sign(b"").hex() == ("e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
                                   "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")


def test_signed_entries_are_the_bytes_openssl_signs():
    seed, report = os.urandom(32), os.urandom(200)
    ossl = sign_reports(Ed25519PrivateKey.from_private_bytes(seed), [report])
    fast = sign_reports(SodiumEd25519PrivateKey(seed), [report])
    assert fast == ossl
    Ed25519PrivateKey.from_private_bytes(seed).public_key().verify(fast[0].signature,
                                                                  signed_message(report))


def test_pem_and_identity_files_round_trip(tmp_path):
    made = keygen(tmp_path / "h")
    assert isinstance(made.key, SodiumEd25519PrivateKey)
    again = load(tmp_path / "h")
    assert isinstance(again.key, SodiumEd25519PrivateKey)
    assert again.key_id == made.key_id
    pem = again.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption())
    assert pem == (tmp_path / "h" / "holder.key").read_bytes()
    assert again.key.sign(b"x") == serialization.load_pem_private_key(pem, None).sign(b"x")


def test_refuses_a_wrong_length_and_pickling():
    with pytest.raises(ValueError):
        SodiumEd25519PrivateKey(b"\x00" * 31)
    with pytest.raises(TypeError):
        pickle.dumps(SodiumEd25519PrivateKey(os.urandom(32)))

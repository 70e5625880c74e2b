"""The HPKE report format against the standard: RFC 9180's published vectors and an
independent implementation (pyhpke), through the project's own sealing and opening code.

What can be checked where (``cryptography``'s HPKE is single-shot, takes no fixed
ephemeral key, no aad and has no exporter):

* opening: the vector's ``enc`` with a ciphertext made under the vector's published
  ``key`` and ``base_nonce`` (sequence 0, empty aad) opens through
  :meth:`ServerKeyPair.hpke_open` with the vector's ``skRm`` and ``info``: the project's
  decapsulation and key schedule reach the RFC's key and nonce (a wrong one fails the tag);
* the independent implementation is itself held to the RFC: pyhpke, given the vector's
  ephemeral key, reproduces ``enc``, the published ciphertexts and the exported values;
* then byte-exact reports: pyhpke with the vector's ephemeral key builds a report as
  docs/wire-format.md says, and the server's opener opens it; the project's sealer's
  reports open with pyhpke following the same document.
"""
import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pyhpke import AEADId, CipherSuite, KDFId, KEMId, KEMKeyPair

from sealing.hpke_report import (HEADER_LEN, INFO_LABEL, SUITE_IDS, layer_info, pack_header,
                                 record_len, seal_report, seal_reports)
from server.hpke_opening import HpkeReportOpener
from server.keys import ServerKeyPair
from shuffler.hpke_peel import HpkeLayerPeeler
from shuffler.layers import LayerKeyPair

VECTOR = json.loads((Path(__file__).parent / "fixtures"
                     / "rfc9180_a11_x25519_sha256_aes128gcm.json").read_text())
H = bytes.fromhex
PYHPKE = CipherSuite.new(KEMId.DHKEM_X25519_HKDF_SHA256, KDFId.HKDF_SHA256, AEADId.AES128_GCM)
SPEC = bytes(range(32))
RID = bytes(range(100, 116))


def vector_server() -> ServerKeyPair:
    return ServerKeyPair(X25519PrivateKey.from_private_bytes(H(VECTOR["skRm"])))


def vector_ephemeral() -> KEMKeyPair:
    return KEMKeyPair(PYHPKE.kem.deserialize_private_key(H(VECTOR["skEm"])),
                      PYHPKE.kem.deserialize_public_key(H(VECTOR["pkEm"])))


def pyhpke_layer(recipient_pub: bytes, plaintext: bytes, layer: int, eks=None) -> bytes:
    """One layer built from docs/wire-format.md with pyhpke alone (no project sealing code)."""
    header = bytes([3, layer]) + SPEC + RID
    info = b"rknn-ray report\x00" + header
    enc, ctx = PYHPKE.create_sender_context(PYHPKE.kem.deserialize_public_key(recipient_pub),
                                            info, eks=eks)
    return header + enc + ctx.seal(plaintext, aad=b"")


def test_the_fixture_is_the_suite_the_format_uses():
    assert (VECTOR["mode"], VECTOR["kem_id"], VECTOR["kdf_id"], VECTOR["aead_id"]) == \
        (0,) + SUITE_IDS
    assert "RFC 9180" in VECTOR["source"] and "A.1.1" in VECTOR["source"]


def test_vector_keys_are_x25519_pairs():
    skR = X25519PrivateKey.from_private_bytes(H(VECTOR["skRm"]))
    skE = X25519PrivateKey.from_private_bytes(H(VECTOR["skEm"]))
    assert skR.public_key().public_bytes_raw() == H(VECTOR["pkRm"])
    assert skE.public_key().public_bytes_raw() == H(VECTOR["pkEm"]) == H(VECTOR["enc"])
    assert vector_server().public_bytes() == H(VECTOR["pkRm"])


def test_the_published_ciphertexts_open_under_the_published_key_and_nonces():
    """The fixture is intact: each encryption opens under (key, its nonce, its aad)."""
    for e in VECTOR["encryptions"]:
        assert AESGCM(H(VECTOR["key"])).decrypt(H(e["nonce"]), H(e["ct"]), H(e["aad"])) == H(e["pt"])


def test_project_opener_derives_the_rfc_key_schedule():
    """enc + AEAD(key, base_nonce, aad="") opens with skRm and info through the server key:
    its decapsulation and key schedule give the RFC's key and base_nonce."""
    pt = H(VECTOR["encryptions"][0]["pt"])
    sealed = H(VECTOR["enc"]) + AESGCM(H(VECTOR["key"])).encrypt(H(VECTOR["base_nonce"]), pt, b"")
    assert vector_server().hpke_open(sealed, H(VECTOR["info"])) == pt
    wrong_nonce = H(VECTOR["enc"]) + AESGCM(H(VECTOR["key"])).encrypt(
        H(VECTOR["encryptions"][1]["nonce"]), pt, b"")
    with pytest.raises(Exception):
        vector_server().hpke_open(wrong_nonce, H(VECTOR["info"]))
    with pytest.raises(Exception):                       # info is in the key schedule
        vector_server().hpke_open(sealed, H(VECTOR["info"]) + b"!")


def test_pyhpke_reproduces_the_rfc_vector():
    """The interop partner is held to the RFC first: enc, ciphertexts, exported values."""
    pkR = PYHPKE.kem.deserialize_public_key(H(VECTOR["pkRm"]))
    enc, sender = PYHPKE.create_sender_context(pkR, H(VECTOR["info"]), eks=vector_ephemeral())
    assert enc == H(VECTOR["enc"])
    for e in VECTOR["encryptions"]:                      # sequence numbers 0, 1 in order
        assert sender.seal(H(e["pt"]), aad=H(e["aad"])) == H(e["ct"])
    receiver = PYHPKE.create_recipient_context(
        enc, PYHPKE.kem.deserialize_private_key(H(VECTOR["skRm"])), H(VECTOR["info"]))
    for x in VECTOR["exports"]:
        assert receiver.export(H(x["exporter_context"]), x["L"]) == H(x["exported_value"])


def test_a_deterministic_pyhpke_report_opens_at_the_server():
    """Byte-exact: the vector's recipient and ephemeral keys, the documented header and info."""
    payload = b"\x01\x00\x00\x01\x00\x00\x00"
    record = pyhpke_layer(H(VECTOR["pkRm"]), payload, 0, eks=vector_ephemeral())
    assert record[:HEADER_LEN] == pack_header(0, SPEC, RID)
    assert record[HEADER_LEN:HEADER_LEN + 32] == H(VECTOR["enc"])
    assert len(record) == record_len(len(payload))
    again = pyhpke_layer(H(VECTOR["pkRm"]), payload, 0, eks=vector_ephemeral())
    assert again == record                               # a fixed ephemeral key: one answer
    out = HpkeReportOpener(vector_server(), SPEC, len(payload)).open_batch([record])
    assert out.plaintexts.tobytes() == payload and out.report_ids.tolist() == [RID]
    assert sum(out.rejects.values()) == 0


def test_the_documented_example_is_this_report():
    """docs/wire-format.md's worked example is what pyhpke builds, and it opens here."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "wire-format.md").read_text()
    block = text.split("<!-- example-report -->", 1)[1].split("```")[1]
    documented = bytes.fromhex("".join(block.split()))
    payload = b"\x01\x00\x00\x01\x00\x00\x00"
    assert documented == pyhpke_layer(H(VECTOR["pkRm"]), payload, 0, eks=vector_ephemeral())
    out = HpkeReportOpener(vector_server(), SPEC, len(payload)).open_batch([documented])
    assert out.plaintexts.tobytes() == payload and out.report_ids.tolist() == [RID]


def test_pyhpke_onion_report_peels_and_opens():
    """Two layers sealed by pyhpke (server, then shuffler): the hop peels, the server opens."""
    server, hop = ServerKeyPair.generate(), LayerKeyPair.generate(1)
    payload = bytes(range(9))
    inner = pyhpke_layer(server.public_bytes(), payload, 0)
    outer = pyhpke_layer(hop.public_bytes(), inner, 1)
    assert len(outer) == record_len(len(payload), 2)
    peeled, kept, rejects = HpkeLayerPeeler(hop, SPEC, len(inner)).peel([outer])
    assert peeled.tobytes() == inner and sum(rejects.values()) == 0
    out = HpkeReportOpener(server, SPEC, len(payload)).open_batch(peeled)
    assert out.plaintexts.tobytes() == payload


def test_project_reports_open_with_pyhpke():
    """The other direction: the project's sealer, opened by pyhpke following the document."""
    skR = X25519PrivateKey.generate()
    hop_sk = X25519PrivateKey.generate()
    payloads = np.arange(12, dtype=np.uint8).reshape(3, 4)
    ids = np.frombuffer(RID * 3, np.uint8).reshape(3, 16)
    rows = seal_reports(skR.public_key(), payloads, SPEC, ids,
                        shufflers=[hop_sk.public_key().public_bytes_raw()])

    def pyhpke_open(record: bytes, sk: X25519PrivateKey) -> bytes:
        header, enc, ct = record[:HEADER_LEN], record[HEADER_LEN:HEADER_LEN + 32], record[HEADER_LEN + 32:]
        raw = sk.private_bytes_raw()
        ctx = PYHPKE.create_recipient_context(enc, PYHPKE.kem.deserialize_private_key(raw),
                                              info=b"rknn-ray report\x00" + header)
        return ctx.open(ct, aad=b"")

    for row, want in zip(rows, payloads):
        inner = pyhpke_open(row.tobytes(), hop_sk)
        assert inner[:2] == b"\x03\x00" and pyhpke_open(inner, skR) == want.tobytes()
    one = seal_report(H(VECTOR["pkRm"]), b"abc", SPEC, RID)
    assert pyhpke_open(one, X25519PrivateKey.from_private_bytes(H(VECTOR["skRm"]))) == b"abc"


def test_info_is_the_documented_string():
    assert INFO_LABEL == b"rknn-ray report\x00" and len(INFO_LABEL) == 16
    assert layer_info(pack_header(1, SPEC, RID)) == b"rknn-ray report\x00\x03\x01" + SPEC + RID

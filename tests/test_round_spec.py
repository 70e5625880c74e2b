"""The round specification (sealing.round_spec): round trip, one hash per content, signature
checks with a tamper test per field, refusals with one line, no pickle anywhere."""
import ast
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from sealing.hpke_report import seal_report
from sealing.round_spec import (MAGIC, SIGNATURE_LEN, EncoderFile, RoundSpec, SpecError, sign,
                                signed_message, verify)
from server.hpke_opening import HpkeReportOpener
from server.keys import ServerKeyPair
from tests.ast_parse import parse as parse_source

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
OPERATOR_PUB = OPERATOR.public_key().public_bytes_raw()
#: SHA-256 of make_spec()'s bytes: a change here is a change of the format (bump VERSION)
PINNED_HASH = "2bdc53cba2d4932e14432d34ce5a535ae0a73838709739943fb5baaf01e054ec"


def make_spec(**changes) -> RoundSpec:
    fields = dict(
        job_id="job-7f3a", round=2, opens_at=1_800_000_000, deadline=1_800_000_600,
        model="shuffle", mechanism="collision", mechanism_params={"bins": 64, "pad": 1.5,
                                                                  "labels": [0, 1]},
        eps0=2.0, eps=1.0, delta=1e-6, min_senders=500, k=3, connection_rule="rknn",
        queries=np.arange(12, dtype=np.float32).reshape(4, 3) / 7,
        encoder=(EncoderFile("predictor.json", "ab" * 32, 812),
                 EncoderFile("encoder.npz", "cd" * 32, 40960)),
        server_key=bytes(range(32)), shuffler_keys=(bytes(range(1, 33)),),
        payload_len=7, allowance=1)
    fields.update(changes)
    return RoundSpec(**fields)


def test_round_trip_bytes_and_signed_document():
    spec = make_spec(connection_prices=np.array([0.0, 0.5, -1.25, 3.0]))
    again = RoundSpec.from_bytes(spec.to_bytes())
    assert again == spec and again.to_bytes() == spec.to_bytes()
    np.testing.assert_array_equal(again.queries, spec.queries)
    assert again.queries.dtype == np.float32 and not again.queries.flags.writeable
    assert again.connection_prices.tolist() == [0.0, 0.5, -1.25, 3.0]
    assert again.encoder == spec.encoder and again.shuffler_keys == spec.shuffler_keys
    assert again.mechanism_params == {"bins": 64, "pad": 1.5, "labels": [0, 1]}
    doc = sign(spec, OPERATOR.sign)
    assert doc[:-SIGNATURE_LEN] == spec.to_bytes() and doc[:8] == MAGIC
    assert verify(doc, OPERATOR_PUB) == spec
    assert verify(doc, OPERATOR.public_key()) == spec


def test_layout_is_magic_length_json_arrays():
    spec = make_spec()
    raw = spec.to_bytes()
    (jlen,) = struct.unpack_from("<I", raw, 8)
    text = raw[12:12 + jlen].decode("ascii")
    assert text.startswith('{"allowance":1,"arrays":[{"dtype":"<f4","name":"queries","shape":[4,3]}]')
    assert raw[12 + jlen:] == spec.queries.astype("<f4").tobytes()
    assert spec.content_hash() == hashlib.sha256(raw).digest()


def test_the_documented_example_json_is_make_spec():
    text = (ROOT / "docs" / "wire-format.md").read_text()
    example = text.split("Example (the JSON text of", 1)[1].split("```")[1].strip()
    raw = make_spec().to_bytes()
    (jlen,) = struct.unpack_from("<I", raw, 8)
    assert example == raw[12:12 + jlen].decode("ascii")


def test_hash_is_stable():
    """The same content always hashes the same: pinned, and independent of the caller's
    array layout, byte order, int-vs-float numbers and dict order."""
    spec = make_spec()
    assert spec.content_hash().hex() == PINNED_HASH
    q = np.asfortranarray(spec.queries.astype(">f4"))
    params = {"labels": [0, 1], "pad": 1.5, "bins": 64}
    same = make_spec(queries=q, mechanism_params=params, eps=1, eps0=2)
    assert same.content_hash() == spec.content_hash()
    assert make_spec(round=3).content_hash() != spec.content_hash()


CHANGES = {
    "job_id": "job-other", "round": 3, "opens_at": 1_800_000_001, "deadline": 1_800_000_601,
    "model": "local", "mechanism": "rr", "mechanism_params": {"bins": 65, "pad": 1.5, "labels": [0, 1]},
    "eps0": 2.5, "eps": 1.5, "delta": 1e-7, "min_senders": 499, "k": 4, "connection_rule": "balanced_min",
    "queries": np.arange(12, dtype=np.float32).reshape(4, 3) / 6,
    "encoder": (EncoderFile("predictor.json", "ab" * 32, 813),),
    "server_key": bytes(range(2, 34)), "shuffler_keys": (bytes(range(3, 35)),),
    "payload_len": 8, "allowance": 2, "connection_prices": np.zeros(4),
}


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_modified_field_is_refused(name):
    """Every field is covered by the signature: the original signature on a spec with that
    one field changed does not verify."""
    doc = sign(make_spec(), OPERATOR.sign)
    modified = make_spec(**{name: CHANGES[name]})
    assert modified.to_bytes() != doc[:-SIGNATURE_LEN]
    with pytest.raises(SpecError, match="signature does not verify"):
        verify(modified.to_bytes() + doc[-SIGNATURE_LEN:], OPERATOR_PUB)


def test_every_field_has_a_tamper_case():
    from dataclasses import fields
    assert {f.name for f in fields(RoundSpec)} - {"version"} == set(CHANGES)


@pytest.mark.parametrize("where", ["magic", "json", "array", "signature"])
def test_a_flipped_byte_is_refused(where):
    doc = bytearray(sign(make_spec(), OPERATOR.sign))
    offset = {"magic": 0, "json": 20, "array": len(doc) - SIGNATURE_LEN - 1,
              "signature": len(doc) - 1}[where]
    doc[offset] ^= 0x01
    with pytest.raises(SpecError, match="signature does not verify"):
        verify(bytes(doc), OPERATOR_PUB)


def test_a_signature_from_another_key_is_refused():
    doc = sign(make_spec(), Ed25519PrivateKey.generate().sign)
    with pytest.raises(SpecError, match="signature does not verify"):
        verify(doc, OPERATOR_PUB)


def _resign(body: bytes) -> bytes:
    return body + OPERATOR.sign(signed_message(hashlib.sha256(body).digest()))


def _with_json(spec: RoundSpec, edit) -> bytes:
    """Spec bytes whose JSON ``edit`` changed (text in, text out), arrays kept."""
    raw = spec.to_bytes()
    (jlen,) = struct.unpack_from("<I", raw, 8)
    text = edit(raw[12:12 + jlen].decode("ascii")).encode("ascii")
    return MAGIC + struct.pack("<I", len(text)) + text + raw[12 + jlen:]


def test_an_unknown_version_is_refused_even_when_signed():
    body = _with_json(make_spec(), lambda t: t.replace('"version":1', '"version":2'))
    with pytest.raises(SpecError, match="unknown round specification version 2"):
        verify(_resign(body), OPERATOR_PUB)
    with pytest.raises(SpecError, match="unknown round specification version 9"):
        make_spec(version=9)


@pytest.mark.parametrize("edit,message", [
    (lambda t: t.replace(",", ", ", 1), "canonical"),
    (lambda t: t.replace('"eps":1.0', '"eps":1'), "canonical"),
    (lambda t: t.replace('"k":3', '"k":3,"zz":1'), "unknown"),
    (lambda t: t.replace('"allowance":1,', ''), "missing"),
    (lambda t: t.replace('"dtype":"<f4"', '"dtype":"|O"'), "bad array"),
    (lambda t: t.replace('"shape":[4,3]', '"shape":[40,3]'), "runs past the end"),
    (lambda t: t.replace('"format":"rknn-ray round specification"', '"format":"x"'), "format"),
    (lambda t: t[:-1], "does not parse"),
])
def test_a_signed_but_bad_document_is_refused_with_one_line(edit, message):
    body = _with_json(make_spec(), edit)
    with pytest.raises(SpecError, match=message) as err:
        verify(_resign(body), OPERATOR_PUB)
    assert "\n" not in str(err.value)


def test_trailing_bytes_and_short_documents_are_refused():
    body = make_spec().to_bytes()
    with pytest.raises(SpecError, match="canonical"):
        verify(_resign(body + b"\x00"), OPERATOR_PUB)
    with pytest.raises(SpecError, match="too short"):
        verify(b"x" * SIGNATURE_LEN, OPERATOR_PUB)
    with pytest.raises(SpecError, match="magic"):
        RoundSpec.from_bytes(b"NOTASPEC" + bytes(8))
    with pytest.raises(SpecError, match="32 raw Ed25519"):
        verify(sign(make_spec(), OPERATOR.sign), b"short")


@pytest.mark.parametrize("changes,message", [
    ({"round": -1}, "round"), ({"deadline": 1_800_000_000}, "deadline"),
    ({"model": "federated"}, "model"), ({"eps": 0.0}, "eps"), ({"eps": float("nan")}, "eps"),
    ({"delta": 1.0}, "delta"), ({"eps0": None}, "eps0 is required"),
    ({"min_senders": 0}, "min_senders"), ({"k": True}, "k must be an integer"),
    ({"payload_len": 70000}, "payload_len"), ({"allowance": 0}, "allowance"),
    ({"queries": np.zeros(3, np.float32)}, "2-D"),
    ({"queries": np.array([[object()]])}, "dtype"),
    ({"queries": np.array([[np.inf]])}, "NaN or infinity"),
    ({"connection_prices": np.zeros(3)}, "one price per query"),
    ({"server_key": b"\x00" * 31}, "32 raw X25519"), ({"shuffler_keys": ()}, "shuffler key"),
    ({"encoder": ()}, "encoder"), ({"mechanism_params": {"x": float("inf")}}, "mechanism_params"),
    ({"job_id": ""}, "job_id"),
])
def test_bad_fields_are_refused_with_one_line(changes, message):
    with pytest.raises(SpecError, match=message) as err:
        make_spec(**changes)
    assert "\n" not in str(err.value)


def test_bad_encoder_entries_are_refused():
    with pytest.raises(SpecError, match="64 lowercase hex"):
        EncoderFile("encoder.npz", "AB" * 32, 1)
    with pytest.raises(SpecError, match="plain non-empty file name"):
        EncoderFile("../encoder.npz", "ab" * 32, 1)


def test_central_model_needs_no_eps0_or_shuffler():
    spec = make_spec(model="central", eps0=None, shuffler_keys=())
    assert RoundSpec.from_bytes(spec.to_bytes()) == spec


def test_the_spec_hash_binds_reports_to_the_round():
    """A report sealed for this spec's hash opens; one sealed for a modified spec does not."""
    server = ServerKeyPair.generate()
    spec = make_spec(server_key=server.public_bytes())
    other = spec.replace(deadline=spec.deadline + 1)
    opener = HpkeReportOpener(server, verify(sign(spec, OPERATOR.sign), OPERATOR_PUB).content_hash(),
                              spec.payload_len)
    good = seal_report(spec.server_key, bytes(7), spec.content_hash(), bytes(16))
    stale = seal_report(spec.server_key, bytes(7), other.content_hash(), bytes(16))
    out = opener.open_batch([good, stale])
    assert out.kept.tolist() == [0] and out.rejects["wrong_spec"] == 1


def test_no_pickle_on_the_way_in_or_out():
    """Neither the module nor anything it calls to read arrays uses pickle: arrays come
    from np.frombuffer over raw bytes, object arrays are refused."""
    tree = parse_source((ROOT / "sealing" / "round_spec.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and ("pickle" in m or m in ("marshal", "shelve", "dill"))}
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert not {c for c in calls if c.endswith(("np.load", "loads")) and c != "json.loads"}



def test_mutated_bytes_raise_only_spec_errors():
    """Whatever bytes arrive (a flipped byte anywhere, a truncation), reading fails with a
    one-line SpecError and nothing else."""
    raw = make_spec(connection_prices=np.ones(4)).to_bytes()
    rng = np.random.default_rng(5)
    for _ in range(400):
        data = bytearray(raw)
        i = int(rng.integers(len(data)))
        data[i] = int(rng.integers(256)) if data[i] else 1
        if rng.random() < 0.2:
            data = data[:int(rng.integers(len(data)))]
        try:
            RoundSpec.from_bytes(bytes(data))
        except SpecError as exc:
            assert "\n" not in str(exc)

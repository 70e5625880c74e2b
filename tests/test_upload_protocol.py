"""The upload protocol's bytes (docs/wire-format.md, "Upload protocol") and the shuffler
commands' one-line errors; in-process, no service started."""
import hashlib
import socket
import io
import stat
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from benchmarks.shuffler_world import make_world
from jobs import shuffler_service
from sealing.hpke_report import pack_header, record_len, seal_report, unpack_header
from sealing.round_spec import sign
from sealing.upload_client import sign_reports
from sealing.upload_wire import (BATCH_HEAD, Entry, WireError, batch_header, batch_request_message,
                                 decode_upload, encode_upload, read_batch, sign_entry,
                                 signed_message)
from shuffler.certs import make_certs
from shuffler.intake import Intake
from shuffler.layers import LayerKeyPair
from shuffler.service_files import load_layer_key
from shuffler.store import ReportStore

REPORT = pack_header(1, bytes(range(32)), bytes(range(100, 116))) + b"\xaa" * 30


def test_signed_message_and_request_layout_byte_for_byte():
    assert signed_message(REPORT) == (b"rknn-ray upload\x00" + bytes(range(32))
                                      + bytes(range(100, 116)) + hashlib.sha256(REPORT).digest())
    key = Ed25519PrivateKey.generate()
    kid = key.public_key().public_bytes_raw()
    entry = sign_entry(kid, key.sign, REPORT)
    key.public_key().verify(entry.signature, signed_message(REPORT))
    body = encode_upload([entry, entry])
    one = kid + entry.signature + struct.pack("<I", len(REPORT)) + REPORT
    assert body == b"RKNNUPLD\x01" + struct.pack("<I", 2) + one + one
    assert decode_upload(body) == [entry, entry]


@pytest.mark.parametrize("cut, message", [
    (lambda b: b"RKNNUPLX" + b[8:], "magic bytes RKNNUPLD missing"),
    (lambda b: b[:8] + b"\x02" + b[9:], "protocol version 2"),
    (lambda b: b[:9] + struct.pack("<I", 0) + b[13:], "1..10000 reports, got 0"),
    (lambda b: b[:-1], "truncated or oversized in entry 0"),
    (lambda b: b + b"\x00", "1 bytes after the last of 1 entries"),
    (lambda b: b[:50], "truncated in entry 0"),
])
def test_a_badly_framed_request_is_refused_with_one_line(cut, message):
    body = encode_upload([Entry(bytes(32), bytes(64), REPORT)])
    with pytest.raises(WireError, match=message):
        decode_upload(cut(body))


def test_batch_stream_framing_and_operator_request():
    head = batch_header(bytes(32), 0, 3, 2)
    assert len(head) == BATCH_HEAD == 54
    assert batch_request_message(bytes(32), 7) == b"rknn-ray batch request\x00" + bytes(32) + struct.pack("<Q", 7)
    body = head + b"\x03\x00\x00\x00abc" + b"\x03\x00\x00\x00def"
    header, records = read_batch(io.BytesIO(body).read)
    assert header.count == 2 and header.record_len == 3 and list(records) == [b"abc", b"def"]
    with pytest.raises(WireError, match="ended early"):
        list(read_batch(io.BytesIO(body[:-1]).read)[1])
    with pytest.raises(WireError, match="bytes after the 2 records"):
        list(read_batch(io.BytesIO(body + b"x").read)[1])


def _run(argv, capsys):
    code = shuffler_service.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_keygen_and_cert_write_private_files_0600(tmp_path, capsys):
    code, out, _ = _run(["keygen", "--out", str(tmp_path / "s.key")], capsys)
    assert code == 0 and len(out.strip()) == 64
    assert stat.S_IMODE((tmp_path / "s.key").stat().st_mode) == 0o600
    code, _, err = _run(["keygen", "--out", str(tmp_path / "s.key")], capsys)
    assert code == 2 and err.count("\n") == 1 and "exists: keep it" in err
    code, out, _ = _run(["cert", "--out", str(tmp_path / "tls")], capsys)
    assert code == 0 and "ca.pem" in out
    for name in ("server.key", "ca.key"):
        assert stat.S_IMODE((tmp_path / "tls" / name).stat().st_mode) == 0o600


def test_serve_refuses_bad_files_with_one_line(tmp_path, capsys):
    world = make_world(tmp_path / "w")
    good = dict(spec=world.spec_file, operator_key=world.operator_file, holders=world.holders_file,
                key=world.shuffler_key, cert=world.certs.cert, cert_key=world.certs.key)

    def serve(**changes):
        args = {**good, **changes}
        argv = ["serve", "--store", str(tmp_path / "store"), "--port", "0"]
        for k, v in args.items():
            argv += ["--" + k.replace("_", "-"), str(v)]
        code, _, err = _run(argv, capsys)
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: rknn-ray shuffler serve: ")
        return err
    other = tmp_path / "other.pub"
    other.write_text(Ed25519PrivateKey.generate().public_key().public_bytes_raw().hex())
    assert "signature does not verify" in serve(operator_key=other)
    assert "no file at" in serve(spec=tmp_path / "missing.spec")
    bad = tmp_path / "holders.txt"
    bad.write_text("00ff\n")
    assert "line 1" in serve(holders=bad) and "64 hex" in serve(holders=bad)
    # the operator's private key given for its public half: named, never echoed
    private = world.operator.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
    (tmp_path / "op.key").write_bytes(private)
    err = serve(operator_key=tmp_path / "op.key")
    assert "holds a PEM private key" in err and "the .pub file" in err
    body = b"".join(private.splitlines()[1:-1]).decode()
    assert all(body[i:i + 8] not in err for i in range(0, len(body) - 8))
    other_certs = make_certs(tmp_path / "other")
    for changes, words in (({"cert": tmp_path / "none.pem"}, "--cert: no file at"),
                           ({"cert": world.certs.key}, "not a certificate (PEM) and its own"),
                           ({"cert_key": other_certs.key}, "KEY_VALUES_MISMATCH")):
        err = serve(**changes)
        assert words in err and str(changes.popitem()[1]) in err, err
    (tmp_path / "k2").write_bytes(world.shuffler_key.read_bytes())
    (tmp_path / "k2").chmod(0o644)
    assert "chmod 600" in serve(key=tmp_path / "k2")
    shuffler_service.main(["keygen", "--out", str(tmp_path / "k3")])
    capsys.readouterr()
    assert "is not the specification's first shuffler key" in serve(key=tmp_path / "k3")
    ReportStore(tmp_path / "store", bytes(32)).close()
    assert "give each specification its own --store folder" in serve()
    local = world.spec.replace(model="local", shuffler_keys=())
    (tmp_path / "local.spec").write_bytes(sign(local, world.operator.sign))
    assert "names no shuffler key" in serve(spec=tmp_path / "local.spec")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        code, _, err = _run(["serve", *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in good.items()), []),
                             "--store", str(tmp_path / "s2"), "--port", str(port)], capsys)
        assert code == 2 and err.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in err
    assert "--port 70000" in _run(["serve", *sum(([f"--{k.replace('_', '-')}", str(v)] for k, v in good.items()), []),
                                   "--store", str(tmp_path / "s"), "--port", "70000"], capsys)[2]


def test_intake_as_the_first_of_two_shufflers_keeps_the_middle_layer(tmp_path):
    """With H = 2 the service (hop 1) keeps layer-2 records, still sealed to hop 2."""
    world = make_world(tmp_path / "w", holders=1)
    hop1, hop2 = load_layer_key(world.shuffler_key), LayerKeyPair.generate(2)
    spec = world.spec.replace(shuffler_keys=(hop1.public_bytes(), hop2.public_bytes()))
    holder = world.holders[0]
    intake = Intake(spec, {holder.public_key().public_bytes_raw(): holder.public_key()}, hop1,
                    ReportStore(tmp_path / "store", spec.content_hash()))
    report = seal_report(spec.server_key, b"p" * 24, spec.content_hash(), bytes(16),
                         list(spec.shuffler_keys))
    one_hop = world.seal(b"p" * 24)                          # sealed for one shuffler only
    assert intake.submit(sign_reports(holder, [report, one_hop])) == ["accepted", "malformed"]
    (kept,) = [r for chunk in intake.store.records() for r in chunk]
    assert len(kept) == record_len(24, 2) and unpack_header(kept).layer == 2
    assert intake.peeler.inner_layer == 2

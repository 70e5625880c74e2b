"""The shuffler service as its own OS process over real TLS on 127.0.0.1 (issue 56, step 2).

Every service here runs through ``rknn-ray shuffler serve`` with ``ray`` and ``server``
made unimportable (benchmarks/shuffler_world.py); each test checks it never tried to
import them, and ends its processes.
"""
import json
import os
import secrets
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import time
from collections import Counter

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from benchmarks.shuffler_world import (BLOCK_FINDER, ROOT, blocked_attempts, make_world,
                                       start_service, stop_all, write_holder_keys)
from sealing.hpke_report import seal_layer
from sealing.upload_client import (Connection, UploadError, fetch, fetch_batch, send_entries,
                                   sign_reports, upload)
from sealing.upload_wire import CODES, Entry, encode_upload, sign_entry
from server.hpke_opening import HpkeReportOpener
from shuffler.certs import make_certs
from shuffler.store import FILE_NAME


@pytest.fixture
def worlds(tmp_path):
    made = []

    def make(name="w", **kw):
        world = make_world(tmp_path / name, **kw)
        made.append(world)
        return world
    yield make
    for world in made:
        stop_all(world)


def status(url, world):
    code, body = fetch(url, world.certs.ca, "/status")
    assert code == 200
    return json.loads(body)


def test_each_refusal_has_its_own_code_and_count(worlds):
    world = worlds(holders=4, registered=3, allowance=2)
    proc, url = start_service(world)
    ca, h = world.certs.ca, world.holders
    conn = Connection(url, ca)
    first = world.seal(b"a" * 24)
    accepted = send_entries(conn, sign_reports(h[0], [first, world.seal(b"b" * 24)]))
    assert accepted == ["accepted", "accepted"]
    rid = first[34:50]
    other_shuffler = X25519PrivateKey.generate().public_key().public_bytes_raw()
    good = world.seal(b"c" * 24)
    tampered = bytearray(world.seal(b"d" * 24))
    tampered[-1] ^= 1
    wrong_key_inner = seal_layer(world.spec.server_key, b"e" * 24, world.spec_hash, bytes(16), 0)
    wrong_key = seal_layer(other_shuffler, wrong_key_inner, world.spec_hash, bytes(16), 1)
    forged = sign_entry(h[1].public_key().public_bytes_raw(), h[1].sign, good)
    entries = [
        sign_reports(h[0], [world.seal(b"f" * 24)])[0],                       # over_allowance
        sign_reports(h[0], [first])[0],                                       # replay: duplicate
        sign_reports(h[0], [world.seal(b"a" * 24, report_id=rid)])[0],        # resealed retry: duplicate
        sign_reports(h[3], [world.seal(b"g" * 24)])[0],                       # unknown_key
        Entry(forged.key_id, forged.signature, world.seal(b"h" * 24)),        # bad_signature
        sign_reports(h[1], [world.seal(b"i" * 24, spec_hash=bytes(32))])[0],  # wrong_spec
        sign_reports(h[1], [good[:-1]])[0],                                   # malformed (length)
        sign_reports(h[1], [bytes(tampered)])[0],                             # tampered
        sign_reports(h[1], [wrong_key])[0],                                   # tampered (other key)
        sign_reports(h[1], [good[:1] + b"\x00" + good[2:]])[0],              # malformed (layer 0)
        sign_reports(h[1], [good])[0],                                        # accepted
    ]
    codes = send_entries(conn, entries)
    assert codes == ["over_allowance", "duplicate", "duplicate", "unknown_key", "bad_signature",
                     "wrong_spec", "malformed", "tampered", "tampered", "malformed", "accepted"]
    st = status(url, world)
    assert st["accepted"] == 3 and st["distinct_holders"] == 2 and not st["released"]
    assert st["answers"] == {**dict.fromkeys(CODES, 0), "accepted": 3, "duplicate": 2,
                             "over_allowance": 1, "unknown_key": 1, "bad_signature": 1,
                             "wrong_spec": 1, "malformed": 2, "tampered": 2}
    assert set(st) == {"published", "spec_hash", "opens_at", "deadline", "closes_at", "now",
                       "accepted", "distinct_holders", "registered", "min_senders", "released",
                       "why_not", "answers"}       # nothing per holder
    # the framing itself: one line, HTTP 400, nothing counted
    code, body = conn.request("POST", "/reports", b"RKNNUPLD\x01\x05\x00\x00\x00junk")
    assert code == 400 and body.decode().count("\n") == 1 and "truncated" in body.decode()
    # the signed specification, as the operator gave it
    assert fetch(url, ca, "/spec") == (200, world.spec_file.read_bytes())
    # the batch: not before the deadline, never for anyone but the operator
    with pytest.raises(UploadError, match=r"^HTTP 425: batch not released: the upload window closes"):
        fetch_batch(url, ca, world.operator, world.spec_hash)
    with pytest.raises(UploadError, match=r"^HTTP 401: batch refused: the signature is not the operator's"):
        fetch_batch(url, ca, h[0], world.spec_hash)
    conn.close()
    # the client verifies the service against its CA: another CA's client refuses to talk
    with pytest.raises(ssl.SSLCertVerificationError):
        fetch(url, make_certs(world.folder / "other-ca").ca, "/status")
    assert blocked_attempts(world) == [] and proc.poll() is None


def test_too_early_and_too_late_and_no_batch_without_reports(worlds):
    early = worlds("early", opens_in=3600, closes_in=7200)
    late = worlds("late", opens_in=-600, closes_in=-60, floor=1)
    (_, early_url), (_, late_url) = start_service(early), start_service(late)
    assert upload(early_url, early.certs.ca, early.holders[0], early.spec_hash,
                  [early.seal(b"x" * 24)]) == ["too_early"]
    report = late.seal(b"y" * 24)
    assert upload(late_url, late.certs.ca, late.holders[0], late.spec_hash, [report]) == ["too_late"]
    assert status(early_url, early)["answers"]["too_early"] == 1
    st = status(late_url, late)
    assert st["answers"]["too_late"] == 1 and st["accepted"] == 0
    with pytest.raises(UploadError, match=r"^HTTP 409: batch not released: 0 distinct holders "
                                          r"reported, below the specification's floor of 1"):
        fetch_batch(late_url, late.certs.ca, late.operator, late.spec_hash)
    assert blocked_attempts(early) == blocked_attempts(late) == []


def test_release_after_the_deadline_only_above_the_floor_permuted_and_anonymous(worlds):
    few = worlds("few", holders=2, closes_in=15, floor=3, allowance=10)
    many = worlds("many", holders=4, closes_in=15, floor=3, allowance=10)
    (_, few_url), (_, url) = start_service(few), start_service(many)
    assert upload(few_url, few.certs.ca, few.holders[0], few.spec_hash, [few.seal(b"q" * 24)]) == ["accepted"]
    assert upload(few_url, few.certs.ca, few.holders[1], few.spec_hash, [few.seal(b"r" * 24)]) == ["accepted"]
    canary = b"PLAINTEXT-CANARY-"
    inner_sent, payloads = [], []
    shuffler_key = many.spec.shuffler_keys[0]
    conn = Connection(url, many.certs.ca)
    for n in range(40):
        holder = many.holders[n % 4]
        payload = canary + n.to_bytes(7, "big")
        rid = secrets.token_bytes(16)
        inner = seal_layer(many.spec.server_key, payload, many.spec_hash, rid, 0)
        outer = seal_layer(shuffler_key, inner, many.spec_hash, rid, 1)
        assert send_entries(conn, sign_reports(holder, [outer])) == ["accepted"]   # in this order
        inner_sent.append(inner)
        payloads.append(payload)
    conn.close()
    time.sleep(max(0.0, many.spec.deadline - time.time()) + 0.3)
    assert upload(url, many.certs.ca, many.holders[0], many.spec_hash,
                  [many.seal(b"z" * 24)]) == ["too_late"]
    with pytest.raises(UploadError, match=r"^HTTP 409: batch not released: 2 distinct holders "
                                          r"reported, below the specification's floor of 3"):
        fetch_batch(few_url, few.certs.ca, few.operator, few.spec_hash)
    header, records = fetch_batch(url, many.certs.ca, many.operator, many.spec_hash)
    batch = list(records)
    assert header.count == 40 and header.layer == 0 and header.record_len == len(inner_sent[0])
    assert Counter(batch) == Counter(inner_sent) and batch != inner_sent      # permuted, nothing lost
    again = list(fetch_batch(url, many.certs.ca, many.operator, many.spec_hash)[1])
    assert again == batch                                                     # a re-fetch is the same batch
    opened = HpkeReportOpener(many.server, many.spec_hash, 24).open_batch(batch)
    assert sorted(opened.plaintexts.tobytes()[i * 24:(i + 1) * 24] for i in range(40)) == sorted(payloads)
    blob = b"".join(batch)
    for key in many.holders:                                                  # no sender identity
        assert key.public_key().public_bytes_raw() not in blob
    assert status(url, many)["released"] is True
    # the store: no plaintext, no server key, no holder key beside its count
    server_raw = many.server.raw_private_bytes()
    for path in (many.folder / "store").iterdir():
        data = path.read_bytes()
        assert canary not in data and server_raw not in data and b"PRIVATE KEY" not in data, path
    assert blocked_attempts(few) == blocked_attempts(many) == []


def test_kill_9_mid_upload_then_restart_loses_nothing_and_counts_nothing_twice(worlds):
    world = worlds(holders=1, allowance=1000)
    proc, url = start_service(world)
    port = int(url.rsplit(":", 1)[1])
    key_file = write_holder_keys(world)[0]
    log = world.folder / "answers.log"
    n = 1000
    client = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "upload_loop_driver.py"), url, str(world.certs.ca),
         str(key_file), str(world.folder), str(n), str(log)],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE)
    world.procs.append(client)
    try:
        stop = time.monotonic() + 60
        while time.monotonic() < stop and (not log.exists() or log.read_text().count("accepted") < 60):
            assert client.poll() is None, client.stderr.read().decode()[-400:]
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)                    # mid-upload: the client keeps going
        proc.wait(10)
        before = log.read_text().count("accepted")
        assert before < n
        time.sleep(0.5)
        proc, url2 = start_service(world, port=port)
        assert url2 == url
        assert client.wait(90) == 0, client.stderr.read().decode()[-400:]
    finally:
        client.stderr.close()
    answers = [line.split() for line in log.read_text().splitlines()]
    final = dict(answers)                                    # the last answer per report id
    assert len(final) == n and set(final.values()) <= {"accepted", "duplicate"}
    accepted_ids = [rid for rid, code in answers if code == "accepted"]
    assert len(accepted_ids) == len(set(accepted_ids))       # no id accepted twice
    st = status(url, world)
    assert st["accepted"] == n and st["distinct_holders"] == 1
    assert st["answers"]["accepted"] == n                    # counted once, across the kill
    db = sqlite3.connect(f"file:{world.folder / 'store' / FILE_NAME}?mode=ro", uri=True)
    stored = {bytes(r[0]).hex() for r in db.execute("SELECT report_id FROM reports")}
    db.close()
    assert stored == set(final) and set(accepted_ids) <= stored
    assert blocked_attempts(world) == []


def _raw_post(url, cafile, body: bytes, send: int):
    """POST over a raw TLS socket, sending only ``send`` bytes of the body, then cut."""
    host, port = url.split("//")[1].split(":")
    ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname=host) as tls:
            tls.sendall(f"POST /reports HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
                        "Content-Type: application/octet-stream\r\n\r\n".encode() + body[:send])


def test_connection_cut_and_retried_is_counted_once(worlds):
    world = worlds(holders=2)
    _, url = start_service(world)
    ca = world.certs.ca
    whole = sign_reports(world.holders[0], [world.seal(b"w" * 24)])
    half = sign_reports(world.holders[1], [world.seal(b"h" * 24)])
    _raw_post(url, ca, encode_upload(half), send=len(encode_upload(half)) // 2)   # cut mid-body
    _raw_post(url, ca, encode_upload(whole), send=len(encode_upload(whole)))      # cut before the answer
    stop = time.monotonic() + 10
    while status(url, world)["accepted"] < 1 and time.monotonic() < stop:
        time.sleep(0.05)
    assert status(url, world)["accepted"] == 1
    conn = Connection(url, ca)
    assert send_entries(conn, whole) == ["duplicate"]        # the retry: kept once already
    assert send_entries(conn, half) == ["accepted"]          # the cut body was never kept
    assert send_entries(conn, half) == ["duplicate"]         # a replay
    conn.close()
    st = status(url, world)
    assert st["accepted"] == 2 and st["answers"]["accepted"] == 2 and st["answers"]["duplicate"] == 2
    assert blocked_attempts(world) == []


def test_the_block_shim_really_blocks_ray_and_server(tmp_path):
    for name in ("ray", "server.keys"):
        out = subprocess.run([sys.executable, "-c", BLOCK_FINDER + f"import {name}"], cwd=ROOT,
                             capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT),
                                  "RKNN_BLOCK_LOG": str(tmp_path / "log")})
        assert out.returncode != 0 and "unimportable in the shuffler service" in out.stderr
    assert (tmp_path / "log").read_text().split() == ["ray", "server"]


def _signed_post(url, ca, path, key, message_fn, spec_hash):
    from sealing.upload_client import Connection
    stamp = int(time.time())
    conn = Connection(url, ca)
    try:
        return conn.request("POST", path, b"", {"X-Rknn-Time": str(stamp), "X-Rknn-Signature":
                                                key.sign(message_fn(spec_hash, stamp)).hex()})
    finally:
        conn.close()


def test_the_operator_publishes_closes_early_and_a_restart_keeps_both(worlds):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from sealing.round_spec import sign
    from sealing.upload_wire import batch_request_message, close_request_message
    world = worlds(holders=3, floor=2, allowance=1)
    ca, doc = world.certs.ca, world.spec_file.read_bytes()
    proc, url = start_service(world, with_spec=False)
    port = int(url.rsplit(":", 1)[1])
    code, body = fetch(url, ca, "/spec")
    assert code == 404 and b"no round specification is published" in body
    assert status(url, world) == {"published": False, "registered": 3}
    conn = Connection(url, ca)
    report = sign_reports(world.holders[0], [world.seal(b"a" * 24)])
    assert conn.request("POST", "/reports", encode_upload(report))[0] == 409
    # the document authenticates itself: signed by another key, or changed, it is refused
    other = sign(world.spec, Ed25519PrivateKey.generate().sign)
    assert conn.request("POST", "/spec", other)[0] == 400
    assert conn.request("POST", "/spec", doc[:-1] + bytes([doc[-1] ^ 1]))[0] == 400
    code, body = conn.request("POST", "/spec", doc)
    assert code == 200 and json.loads(body)["spec_hash"] == world.spec_hash.hex()
    assert conn.request("POST", "/spec", doc)[0] == 200                 # idempotent
    later = sign(world.spec.replace(round=1), world.operator.sign)       # its window is open
    code, body = conn.request("POST", "/spec", later)
    assert code == 409 and b"takes uploads until" in body
    assert conn.request("POST", "/files", b"not named")[0] == 400
    assert conn.request("GET", "/key") == (200, (world.spec.shuffler_keys[0].hex() + "\n").encode())
    conn.close()
    assert fetch(url, ca, "/spec") == (200, doc)
    for h in world.holders[:2]:
        assert upload(url, ca, h, world.spec_hash, [world.seal(os.urandom(24))]) == ["accepted"]
    # only the operator closes the window, by a signature bound to this purpose
    assert _signed_post(url, ca, "/close", world.holders[0], close_request_message,
                        world.spec_hash)[0] == 401
    assert _signed_post(url, ca, "/close", world.operator, batch_request_message,
                        world.spec_hash)[0] == 401        # a batch request's signature is not a close
    code, body = _signed_post(url, ca, "/close", world.operator, close_request_message,
                              world.spec_hash)
    assert code == 200 and json.loads(body)["closes_at"] <= time.time()
    assert upload(url, ca, world.holders[2], world.spec_hash,
                  [world.seal(b"c" * 24)]) == ["too_late"]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    proc, url2 = start_service(world, port=port, with_spec=False)       # no --spec: resumed
    assert url2 == url and fetch(url, ca, "/spec") == (200, doc)
    st = status(url, world)
    assert st["published"] and st["accepted"] == 2 and st["closes_at"] < st["deadline"]
    assert upload(url, ca, world.holders[2], world.spec_hash,
                  [world.seal(b"c" * 24)]) == ["too_late"]             # the close survived
    header, records = fetch_batch(url, ca, world.operator, world.spec_hash)
    assert header.count == 2 and len(list(records)) == 2
    # the window is closed: the next round may be published
    conn = Connection(url, ca)
    assert conn.request("POST", "/spec", later)[0] == 200
    conn.close()
    assert fetch(url, ca, "/spec") == (200, later)
    assert blocked_attempts(world) == []


def test_the_service_runs_on_uvloop_and_on_asyncio_where_uvloop_does_not_load(monkeypatch):
    """uvloop is a dependency (less CPU per upload); without it the service still serves."""
    import asyncio
    import uvloop
    from shuffler.service import event_loop
    loop = event_loop()
    assert isinstance(loop, uvloop.Loop)
    loop.close()
    monkeypatch.setitem(sys.modules, "uvloop", None)        # import uvloop raises ImportError
    loop = event_loop()
    assert isinstance(loop, asyncio.AbstractEventLoop) and not isinstance(loop, uvloop.Loop)
    loop.close()


def test_the_store_draws_again_on_a_sort_key_collision_and_reopens_with_its_counts(tmp_path,
                                                                                    monkeypatch):
    """A group's reports go in with one executemany; a sort key drawn twice (chance ~2^-129)
    is drawn again for the report that lost, never dropped; the counts mirrored in memory
    are the file's again after a reopen."""
    from shuffler import store as store_mod
    keys = iter([b"\x01" * 16, b"\x01" * 16, b"\x02" * 16])
    monkeypatch.setattr(store_mod.secrets, "token_bytes", lambda n: next(keys))
    st = store_mod.ReportStore(tmp_path, b"\x00" * 32)
    with st.transaction():
        st.add(b"a" * 16, b"ra", b"k" * 32)
        st.add(b"b" * 16, b"rb", b"k" * 32)
        st.count_answers(Counter(accepted=2))
        with pytest.raises(sqlite3.IntegrityError):
            st.add(b"a" * 16, b"again", b"k" * 32)
    assert (st.accepted(), st.sent(b"k" * 32), st.answers()["accepted"]) == (2, 2, 2)
    assert sorted(r for chunk in st.records() for r in chunk) == [b"ra", b"rb"]
    with pytest.raises(RuntimeError):                      # writes only inside a transaction
        st.add(b"c" * 16, b"rc", b"k" * 32)
    st.close()
    again = store_mod.ReportStore(tmp_path, b"\x00" * 32)
    assert (again.accepted(), again.sent(b"k" * 32), again.distinct_holders(),
            again.answers()["accepted"], again.has(b"b" * 16)) == (2, 2, 1, 2, True)

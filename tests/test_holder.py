"""The holder program as its own OS process (issue 56, step 3): ``rknn-ray holder join``
against a shuffler service over real TLS on 127.0.0.1.

Every holder runs with ``ray``, ``server``, ``shuffler``, ``actors`` and ``torch``
unimportable (benchmarks/holder_world.py) and each test checks it never tried to import
them; the service runs as in tests/test_shuffler_service.py.
"""
import json
import os
import sqlite3
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from benchmarks.holder_world import (holder_blocked_attempts, join_args, make_holder_world,
                                     run_holder)
from benchmarks.shuffler_world import (ROOT, blocked_attempts, serve_args, start_service,
                                       stop_all)
from holder.accountant import mechanism_of
from holder.identity import load
from sealing.upload_client import fetch, fetch_batch
from server.hpke_opening import HpkeReportOpener
from shuffler.service_files import read_holders


@pytest.fixture
def worlds(tmp_path):
    made = []

    def make(name="w", **kw):
        world, dirs = make_holder_world(tmp_path / name, **kw)
        made.append(world)
        return world, dirs
    yield make
    for world in made:
        stop_all(world)


def status(url, world):
    code, body = fetch(url, world.certs.ca, "/status")
    assert code == 200
    return json.loads(body)


def ledger_rows(holder_dir):
    """The holder's ledger: its releases and its refusals (a closed reservation left out)."""
    db = sqlite3.connect(f"file:{holder_dir / 'ledger.db'}?mode=ro", uri=True)
    rows = db.execute("SELECT status, round, eps, note FROM releases WHERE status = 'released' "
                      "OR note LIKE 'refused %' ORDER BY id").fetchall()
    db.close()
    return rows


def one_line(text: str) -> str:
    assert text.count("\n") == 1 and text.startswith("error: rknn-ray holder join: "), text
    return text


def test_keygen_writes_private_files_and_prints_the_registry_line(tmp_path):
    out = run_holder_cli(["holder", "keygen", "--out", str(tmp_path / "h")], tmp_path)
    assert out.returncode == 0, out.stderr
    key_id = out.stdout.strip()
    for name in ("holder.key", "holder.secret"):
        assert stat.S_IMODE((tmp_path / "h" / name).stat().st_mode) == 0o600
    (tmp_path / "holders.txt").write_text(key_id + "\n")
    assert [k.hex() for k in read_holders(tmp_path / "holders.txt")] == [key_id]
    assert load(tmp_path / "h").key_id == key_id
    again = run_holder_cli(["holder", "keygen", "--out", str(tmp_path / "h")], tmp_path)
    assert again.returncode == 2 and again.stderr.count("\n") == 1 and "exists" in again.stderr


def run_holder_cli(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "jobs.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_holders_join_and_the_server_opens_their_reports(worlds):
    # 40 s: two holder processes started at once took over 20 s to answer at load 15
    world, dirs = worlds(holders=2, floor=2, closes_in=40)
    _, url = start_service(world)
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "RKNN_BLOCK_LOG": str(world.folder / "holder-blocked.log")}
    from benchmarks.holder_world import HOLDER_SHIM
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER_SHIM, *join_args(world, url, d)],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for d in dirs]          # two holders at once
    world.procs.extend(procs)
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert "{'accepted': 1}; charged eps=0.999998" in out
    assert status(url, world)["distinct_holders"] == 2
    time.sleep(max(0.0, world.spec.deadline - time.time()) + 0.3)
    header, records = fetch_batch(url, world.certs.ca, world.operator, world.spec_hash)
    batch = list(records)
    assert header.count == 2 and header.layer == 0
    opened = HpkeReportOpener(world.server, world.spec_hash, world.spec.payload_len).open_batch(batch)
    assert len(opened.kept) == 2 and sum(opened.rejects.values()) == 0
    mech = mechanism_of(world.spec)
    assert mech.well_formed(opened.plaintexts).all()
    spec_hash = world.spec_hash
    ids = {bytes(load(d / "key").report_ids(spec_hash, 1)[0]) for d in dirs}
    assert {bytes(r) for r in np.asarray(opened.report_ids).reshape(2, -1)} == ids
    for d in dirs:                                   # each holder's own ledger, its own charge
        ((state, round_, eps, note),) = [r for r in ledger_rows(d) if r[0] == "released"]
        assert round_ == 0 and eps == pytest.approx(0.999998, abs=1e-6)
        assert "does not collude" in note and "eps0=1 if it colludes" in note
    assert holder_blocked_attempts(world) == [] and blocked_attempts(world) == []


def test_a_retry_sends_the_same_bytes_counted_once_and_charged_once(worlds):
    world, (d,) = worlds(holders=1)
    _, url = start_service(world)
    first = run_holder(world, join_args(world, url, d))
    assert first.returncode == 0, first.stderr
    sent = (d / "key" / "sent" / world.spec_hash.hex()).read_bytes()
    second = run_holder(world, join_args(world, url, d))
    assert second.returncode == 0, second.stderr
    assert "{'duplicate': 1}; a retry: charged when first answered" in second.stdout
    assert (d / "key" / "sent" / world.spec_hash.hex()).read_bytes() == sent   # the same bytes
    st = status(url, world)
    assert st["accepted"] == 1 and st["answers"]["duplicate"] == 1
    assert [r[0] for r in ledger_rows(d)] == ["released"]                       # charged once
    # the sealed bytes kept are gone (a crash before they were written): the same report id
    # again from the holder's secret, still a duplicate, still no second charge
    (d / "key" / "sent" / world.spec_hash.hex()).unlink()
    third = run_holder(world, join_args(world, url, d))
    assert third.returncode == 0 and "{'duplicate': 1}" in third.stdout, third.stderr
    assert status(url, world)["accepted"] == 1 and [r[0] for r in ledger_rows(d)] == ["released"]
    assert holder_blocked_attempts(world) == []


def test_an_upload_that_failed_is_retried_later_with_the_same_bytes_charged_once(worlds):
    """The service refuses the first upload (the holder is not registered yet) after the
    holder charged and kept its reports; the shuffler restarts with it registered and the
    holder runs join again: the kept bytes go out, accepted, with no second charge."""
    world, (d,) = worlds(holders=1)
    registry = world.holders_file.read_text()
    world.holders_file.write_text("\n".join(registry.splitlines()[:-1]) + "\n")   # not yet
    proc, url = start_service(world)
    failed = run_holder(world, join_args(world, url, d))
    assert failed.returncode == 2 and "{'unknown_key': 1}" in one_line(failed.stderr)
    sent = (d / "key" / "sent" / world.spec_hash.hex()).read_bytes()
    assert [r[0] for r in ledger_rows(d)] == ["released"]          # charged before the upload
    proc.terminate()
    proc.wait(10)
    world.holders_file.write_text(registry)                        # the shuffler admits it
    _, url2 = start_service(world, port=int(url.rsplit(":", 1)[1]))
    again = run_holder(world, join_args(world, url2, d))
    assert again.returncode == 0 and "{'accepted': 1}; a retry" in again.stdout, again.stderr
    assert (d / "key" / "sent" / world.spec_hash.hex()).read_bytes() == sent
    assert [r[0] for r in ledger_rows(d)] == ["released"]          # charged once
    st = status(url2, world)
    assert st["accepted"] == 1 and st["answers"]["unknown_key"] == 1
    assert holder_blocked_attempts(world) == [] and blocked_attempts(world) == []


def test_a_policy_of_eps_1_answers_one_round_and_refuses_the_next(worlds):
    first, (d,) = worlds("r0", holders=1, round_=0)
    second, _ = worlds("r1", holders=1, round_=1, reuse=[d])
    (_, url0), (_, url1) = start_service(first), start_service(second)
    policy = ["--policy-eps-round", "1", "--policy-eps-total", "1"]
    ok = run_holder(first, join_args(first, url0, d, *policy))
    assert ok.returncode == 0 and "charged eps=0.999998" in ok.stdout, ok.stderr
    refused = run_holder(second, join_args(second, url1, d, *policy))
    assert refused.returncode == 2 and refused.stdout == ""
    assert "above its policy total 1" in one_line(refused.stderr)
    assert status(url1, second)["answers"]["accepted"] == 0                # nothing uploaded
    rows = ledger_rows(d)
    assert [(r[0], r[1]) for r in rows] == [("released", 0), ("unused", None)]
    assert rows[1][3].startswith("refused trial-job round 1: ")
    assert rows[1][2] == 0 and "would bring this holder's total to 2" in rows[1][3]
    assert holder_blocked_attempts(first) == holder_blocked_attempts(second) == []


def test_a_specification_claiming_less_than_the_holders_accountant_is_refused(worlds):
    world, (d,) = worlds(holders=1, claimed_eps=0.5)
    _, url = start_service(world)
    out = run_holder(world, join_args(world, url, d))
    assert out.returncode == 2
    assert ("the specification claims eps=0.5 but this holder's accountant computes "
            "eps=0.999998") in one_line(out.stderr)
    st = status(url, world)
    assert st["accepted"] == 0 and sum(st["answers"].values()) == 0         # nothing uploaded
    ((state, _, eps, note),) = ledger_rows(d)
    assert state == "unused" and eps == 0 and "claims eps=0.5" in note
    assert not (d / "key" / "sent").exists()
    assert holder_blocked_attempts(world) == []


def test_nothing_is_charged_outside_the_upload_window(worlds):
    early, (d,) = worlds("early", holders=1, opens_in=3600, closes_in=7200)
    late, _ = worlds("late", holders=1, opens_in=-600, closes_in=-60, reuse=[d])
    for world, words in ((early, "window opens at"), (late, "window closed at")):
        _, url = start_service(world)
        out = run_holder(world, join_args(world, url, d))
        assert out.returncode == 2 and words in one_line(out.stderr)
        assert status(url, world)["accepted"] == 0
    assert not (d / "ledger.db").exists() and not (d / "key" / "sent").exists()
    assert holder_blocked_attempts(early) == holder_blocked_attempts(late) == []


def test_a_specification_not_signed_by_the_operator_is_refused_in_one_line(worlds):
    world, (d,) = worlds("a", holders=1)
    other, _ = worlds("b", holders=1)
    _, url = start_service(world)
    args = join_args(world, url, d)
    args[args.index("--operator-key") + 1] = str(other.operator_file)     # not this spec's signer
    out = run_holder(world, args)
    assert out.returncode == 2
    assert "signature does not verify with the operator's key" in one_line(out.stderr)
    assert not (d / "ledger.db").exists() and status(url, world)["accepted"] == 0
    assert holder_blocked_attempts(world) == []


def test_the_service_serves_only_files_the_specification_names(worlds, tmp_path):
    world, _ = worlds(holders=1)
    stray = tmp_path / "stray.bin"
    stray.write_bytes(b"not published")
    out = subprocess.run([sys.executable, "-m", "jobs.cli", *serve_args(world, tmp_path / "s"),
                          "--file", str(stray)], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.returncode == 2 and "is not a file the specification names" in out.stderr
    _, url = start_service(world)
    for f in world.spec.encoder:
        code, body = fetch(url, world.certs.ca, f"/files/{f.sha256}")
        assert code == 200 and len(body) == f.size
    assert fetch(url, world.certs.ca, "/files/" + "0" * 64)[0] == 404


def test_many_holders_in_one_process_each_with_its_own_key_and_ledger(worlds):
    world, dirs = worlds(holders=3, floor=3)
    _, url = start_service(world)
    args = ["holder", "join-many", url, "--cafile", str(world.certs.ca), "--holders-dir",
            str(dirs[0].parent), "--operator-key", str(world.operator_file)]
    out = run_holder(world, args)
    assert out.returncode == 0, out.stderr
    assert "3 holders: 3 charged, 0 retries, 0 refused; reports {'accepted': 3}" in out.stdout
    st = status(url, world)
    assert st["accepted"] == 3 and st["distinct_holders"] == 3            # three keys
    for d in dirs:                                                        # three ledgers
        assert [r[0] for r in ledger_rows(d)] == ["released"]
    again = run_holder(world, args)
    assert again.returncode == 0 and "0 charged, 3 retries" in again.stdout, again.stderr
    assert status(url, world)["answers"]["duplicate"] == 3
    assert holder_blocked_attempts(world) == []


def test_a_balanced_connection_votes_as_the_in_cluster_plan_does():
    """The holder rebuilds the round's connection from the specification (rule and public
    prices) and votes exactly as build_answers with the operator's plan."""
    import numpy as np
    from rknn_ray.labeling.connection import Connection
    from rknn_ray.labeling.rknn import build_answers
    from holder.answer import connection_of
    from holder.accountant import SpecRefused
    from benchmarks.shuffler_world import make_world
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        world = make_world(tmp, holders=1)
    rng = np.random.default_rng(0)
    queries = rng.normal(size=(6, 3)).astype(np.float32)
    prices = rng.uniform(0, 2, 6)
    spec = world.spec.replace(queries=queries, k=2, connection_rule="balanced_min",
                              connection_prices=prices)
    plan = connection_of(spec)
    assert plan.rule == "balanced_min" and np.array_equal(plan.prices, prices)
    rows, labels = rng.normal(size=(40, 3)).astype(np.float32), rng.integers(0, 2, 40)
    mine = build_answers(rows, labels, np.zeros(40, np.int64), queries, 2, 2, plan)
    theirs = build_answers(rows, labels, np.zeros(40, np.int64), queries, 2, 2,
                           Connection("balanced_min", prices))
    assert np.array_equal(mine.neighbors, theirs.neighbors)
    plain = build_answers(rows, labels, np.zeros(40, np.int64), queries, 2, 2, None)
    assert not np.array_equal(mine.neighbors, plain.neighbors)     # the prices moved votes
    assert connection_of(world.spec) is None                       # rknn: reverse k-NN
    for bad in (dict(connection_rule="balanced_min"),              # no prices
                dict(connection_rule="nearest_magic", connection_prices=prices[:2].repeat(1)),
                dict(connection_rule="rknn", connection_prices=np.zeros(2))):
        with pytest.raises(SpecRefused):
            connection_of(world.spec.replace(**bad))


def test_many_holders_answered_together_send_the_bytes_each_would_send_alone(tmp_path):
    """holder.answer.payloads_many (join-many and the remote-round load) shares the encoder
    and the queries' search across holders, and each holder's messages are still the very
    bytes it makes answering alone (its own secret: its coins), sealed under the same report
    ids (HPKE draws a fresh ephemeral key per seal, alone or not, so a retry re-sends the
    kept ciphertexts; join keeps them before the first upload), for
    the single-message and multi-message mechanisms, reverse k-NN and a balanced rule, and
    holders of one row, a few, and more than faiss searches row by row."""
    import pyarrow as pa
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from benchmarks.holder_world import publish_encoder
    from holder import answer
    from holder.identity import Identity
    from rknn_ray.published_encoder import PublishedEncoder
    from rknn_ray.labeling.rknn import build_answers
    from sealing.hpke_report import HEADER_LEN
    world, _ = make_holder_world(tmp_path / "w", holders=1)
    files = publish_encoder(tmp_path / "enc")
    encoder = PublishedEncoder.from_files(str(files[0]), str(files[1]))
    sizes = [1, 3, 1, 25, 2, 1, 1, 19, 1]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    rng = np.random.default_rng(7)
    x = rng.normal(size=(bounds[-1], 3))
    rows = pa.table({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2]})
    labels = rng.integers(0, 2, bounds[-1])
    people = [Identity(Ed25519PrivateKey.generate(), os.urandom(32)) for _ in sizes]
    balanced = dict(connection_rule="balanced_min", connection_prices=rng.uniform(0, 2, 4))
    assert answer.row_by_row(4) >= 2
    for changes in (dict(), dict(mechanism="multi", allowance=10**6), balanced):
        spec = world.spec.replace(**changes)
        mech = mechanism_of(spec, check_length=False)
        together = answer.payloads_many(spec, mech, people, answer.inputs_many(
            encoder, rows, bounds), labels, bounds)
        for j, person in enumerate(people):
            lo, hi = bounds[j], bounds[j + 1]
            alone = answer.payloads(spec, mech, person, encoder, rows.slice(lo, hi - lo),
                                    labels[lo:hi])
            own = build_answers(encoder.inputs(rows.slice(lo, hi - lo)), labels[lo:hi],
                                np.zeros(hi - lo, np.int64), np.asarray(spec.queries, np.float32),
                                spec.k, mech.params.num_classes, answer.connection_of(spec))
            first = mech.randomize(own, person.generator(spec.content_hash())).payloads
            assert together[j].tobytes() == alone.tobytes() == first.tobytes()
            sealed = [answer.seal(spec, person, m[:3]) for m in (together[j], alone)]
            assert [r[:HEADER_LEN] for r in sealed[0]] == [r[:HEADER_LEN] for r in sealed[1]]
        assert len({m.tobytes() for m in together}) > 1          # each from its own secret


def test_a_raw_encoders_inputs_for_many_holders_are_each_holders_own_bits(tmp_path):
    """inputs_many encodes many holders' rows in one call where the encoder is row-wise
    (raw: the featurizer, a reshape, a cast): each holder's rows come out the very bits it
    computes alone, for holders of 1 to 40 rows, values far outside the public range included."""
    import pyarrow as pa
    from benchmarks.holder_world import publish_encoder
    from holder import answer
    from rknn_ray.published_encoder import PublishedEncoder
    files = publish_encoder(tmp_path / "enc")
    encoder = PublishedEncoder.from_files(str(files[0]), str(files[1]))
    assert encoder.encoder.row_wise
    sizes = [1, 40, 2, 1, 7, 1, 19, 3]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    x = np.random.default_rng(3).normal(scale=5.0, size=(bounds[-1], 3))
    x[::5] *= 1e6                                   # far outside the public part's range
    rows = pa.table({"x0": x[:, 0], "x1": x[:, 1], "x2": x[:, 2]})
    together = answer.inputs_many(encoder, rows, bounds)
    alone = np.concatenate([encoder.inputs(rows.slice(lo, hi - lo))
                            for lo, hi in zip(bounds[:-1], bounds[1:])])
    assert together.dtype == alone.dtype == np.float32
    assert together.tobytes() == alone.tobytes()

"""Sender credentials and admission (sealing.credentials), without Ray."""
import numpy as np
import pyarrow as pa
import pytest

from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import MechanismParams
from sealing.credentials import (CredentialIssuer, SenderAdmission, sequence_numbers,
                                 with_credentials)
from sealing.envelope import RoundContext, to_arrow
from rknn_ray.accounting.guarantee import guarantee_of

CTX = RoundContext("job-cred", 3)
RANGES = [(0, 10), (10, 20)]


def _signed(cred, senders, width=40, seed=0, ctx=CTX):
    reports = np.random.default_rng(seed).integers(0, 256, (len(senders), width), dtype=np.uint8)
    seqs, tags = cred.sign(ctx, np.asarray(senders), reports)
    return with_credentials(to_arrow(reports, np.asarray(senders)), seqs, tags)


@pytest.fixture
def issuer():
    return CredentialIssuer(CTX.job_id)


def test_sequence_numbers_count_per_sender_in_order():
    assert sequence_numbers(np.array([5, 3, 5, 5, 3, 9])).tolist() == [0, 0, 1, 2, 1, 0]
    assert sequence_numbers(np.array([], np.int64)).size == 0


def test_a_shard_can_sign_only_for_its_own_clients(issuer):
    cred = issuer.shard_credential(0, *RANGES[0])
    with pytest.raises(ValueError, match=r"clients \[0, 10\) only"):
        _signed(cred, [3, 12])


def test_honest_messages_are_admitted_and_senders_counted_once(issuer):
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=2, report_width=40)
    a = _signed(issuer.shard_credential(0, *RANGES[0]), [1, 2, 2])
    b = _signed(issuer.shard_credential(1, *RANGES[1]), [15, 1 + 10], seed=1)
    for batch in (a, b):
        reports, senders, rejects = adm.admit(batch)
        assert len(reports) == batch.num_rows and sum(rejects.values()) == 0
    assert adm.authenticated_senders == 4 and adm.admitted == 5


@pytest.mark.parametrize("column", ["report", "tag", "seq", "sender"])
def test_any_changed_bit_fails_the_credential(issuer, column):
    batch = _signed(issuer.shard_credential(0, *RANGES[0]), [1, 2, 3])
    cols = {name: batch.column(name) for name in batch.schema.names}
    if column in ("report", "tag"):
        raw = np.frombuffer(cols[column].buffers()[1], np.uint8).copy()
        raw[5] ^= 1
        width = cols[column].type.byte_width
        cols[column] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), 3,
                                                            [None, pa.py_buffer(raw)])
    else:
        vals = cols[column].to_numpy().copy()
        vals[0] ^= 1 if column == "sender" else 2       # stay in range for sender, seq < allowance
        cols[column] = pa.array(vals, cols[column].type)
    bad = pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=4)
    _, senders, rejects = adm.admit(bad)
    assert rejects["bad_credential"] == 1 and len(senders) == 2


def test_other_job_round_or_issuer_fails(issuer):
    other_round = RoundContext(CTX.job_id, CTX.round_id + 1)
    for batch in (_signed(CredentialIssuer(CTX.job_id).shard_credential(0, 0, 10), [1, 2]),
                  _signed(issuer.shard_credential(0, 0, 10), [1, 2], ctx=other_round),
                  _signed(issuer.shard_credential(0, 0, 20), [1, 2])):   # not the issued range
        adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=1)
        _, senders, rejects = adm.admit(batch)
        assert rejects["bad_credential"] == 2 and senders.size == 0 and adm.authenticated_senders == 0


def test_flood_from_one_sender_keeps_only_its_allowance(issuer):
    cred = issuer.shard_credential(0, *RANGES[0])
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=3)
    _, senders, rejects = adm.admit(_signed(cred, [4] * 1000))
    assert senders.tolist() == [4, 4, 4] and rejects["over_limit"] == 997
    assert adm.authenticated_senders == 1


def test_retried_copies_and_second_messages_on_a_slot_are_duplicates(issuer):
    cred = issuer.shard_credential(0, *RANGES[0])
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=1)
    adm.admit(_signed(cred, [1, 2, 3]))
    _, senders, rejects = adm.admit(_signed(cred, [1, 2, 3], seed=7))    # re-sealed, same slots
    assert senders.size == 0 and rejects["duplicate_message"] == 3
    assert adm.authenticated_senders == 3


def test_forgery_cannot_use_up_an_honest_slot(issuer):
    """Tags are checked before duplicates: a forged (sender, seq) first does not block the real one."""
    cred = issuer.shard_credential(0, *RANGES[0])
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=1)
    forged = _signed(CredentialIssuer("evil").shard_credential(0, 0, 10), [5])
    assert adm.admit(forged)[2]["bad_credential"] == 1
    _, senders, _ = adm.admit(_signed(cred, [5]))
    assert senders.tolist() == [5]


def test_unknown_senders_wrong_lengths_and_garbage_are_counted_not_raised(issuer):
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=1, report_width=40)
    cred = issuer.shard_credential(0, *RANGES[0])
    ok = _signed(cred, [1, 2])
    unknown = pa.RecordBatch.from_arrays(
        [pa.array([10**9, -1], pa.int64()), *ok.columns[1:]], names=ok.schema.names)
    assert adm.admit(unknown)[2]["unknown_sender"] == 2
    assert adm.admit(_signed(cred, [3], width=39))[2]["wrong_length"] == 1
    assert adm.admit(to_arrow(np.zeros((2, 40), np.uint8), np.array([1, 2])))[2]["bad_credential"] == 2
    assert adm.admit(pa.RecordBatch.from_arrays([pa.array([1, 2, 3])], names=["x"]))[2][
        "bad_credential"] == 3
    assert adm.admit("not a batch")[2]["bad_credential"] == 1
    assert adm.admit(ok.slice(0, 0))[1].size == 0
    assert adm.authenticated_senders == 0


def test_sender_and_seq_columns_of_another_type_are_bad_credentials(issuer):
    """The columns are read from their buffers (no pandas on the hot path): an integer
    column of another width still reads right; a float, string or nullable one is refused."""
    adm = SenderAdmission(issuer.verifier(RANGES), CTX, allowance=1, report_width=40)
    ok = _signed(issuer.shard_credential(0, *RANGES[0]), [1, 2, 3])

    def with_column(name, array):
        cols = [array if n == name else c for n, c in zip(ok.schema.names, ok.columns)]
        return pa.RecordBatch.from_arrays(cols, names=ok.schema.names)
    for name, bad in (("sender", pa.array([1.0, 2.0, 3.0])), ("sender", pa.array(["1", "2", "3"])),
                      ("seq", pa.array([0.0, 0.0, 0.0])), ("seq", pa.array([0, None, 0], pa.uint32()))):
        assert adm.admit(with_column(name, bad))[2]["bad_credential"] == 3, (name, bad.type)
    narrow = with_column("sender", pa.array([1, 2, 3], pa.int32())).slice(1)   # offset 1 too
    reports, senders, rejects = adm.admit(narrow)
    assert senders.tolist() == [2, 3] and sum(rejects.values()) == 0
    assert adm.authenticated_senders == 2


def test_sealing_and_admission_do_not_import_pandas():
    """pyarrow's pa.array / to_numpy import pandas (~0.6 CPU s in every actor of a round)."""
    import subprocess
    import sys
    code = ("import sys, numpy as np\n"
            "from sealing.credentials import CredentialIssuer, SenderAdmission, with_credentials\n"
            "from sealing.envelope import RoundContext, from_arrow, seal_batch, to_arrow\n"
            "ctx = RoundContext('j', 0); iss = CredentialIssuer('j')\n"
            "ct = seal_batch(bytes(range(1, 33)), np.zeros((4, 8), np.uint8), ctx)\n"
            "seqs, tags = iss.shard_credential(0, 0, 10).sign(ctx, np.arange(4), ct)\n"
            "batch = with_credentials(to_arrow(ct, np.arange(4)), seqs, tags)\n"
            "adm = SenderAdmission(iss.verifier([(0, 10)]), ctx, 1, ct.shape[1])\n"
            "assert adm.admit(batch)[1].tolist() == [0, 1, 2, 3]\n"
            "from_arrow(batch)\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_multi_message_allowance_covers_honest_clients_and_caps_a_flood():
    """The noise cap: honest clients of a simulated round stay under it; the guarantee says so."""
    from rknn_ray.labeling.answers import RecordAnswers
    p = MechanismParams(num_queries=20, num_classes=5, k=2, eps=1.0, delta=1e-6, num_clients=400)
    mech = build("shuffle", "multi", p)
    allow = mech.messages_per_sender()
    assert allow > mech.describe()["messages_per_client_expected"]
    assert f"at most {allow} messages per sender" in guarantee_of(mech).note
    assert mech.event().cap_failure == pytest.approx(1e-3 * p.delta)
    from rknn_ray.accounting.accountants import event_cost
    assert event_cost(mech.event())[1] == pytest.approx(p.delta)
    rng = np.random.default_rng(0)
    ids = np.arange(400)
    first = rng.integers(0, 20, 400)
    neighbors = np.stack([first, (first + 1 + rng.integers(0, 19, 400)) % 20], axis=1)
    answers = RecordAnswers(neighbors, rng.integers(0, 5, (400, 1)), ids, 20, 5)
    worst = 0
    for seed in range(5):
        msgs = mech.randomize(answers, np.random.Generator(np.random.PCG64(seed)))
        worst = max(worst, int(np.bincount(msgs.senders).max()))
    assert worst <= allow


def test_kept_client_keys_give_the_same_tags_and_still_refuse_forgeries(monkeypatch):
    """A client's key, derived once and kept (ClientKeyTable), signs and verifies exactly as a
    freshly derived one; a verifier unpickled anew (as every round's admission arrives) finds
    the table its equal left; a tampered report still fails; ranges over the cap keep none."""
    import pickle

    from sealing import credentials as cr
    monkeypatch.setattr(cr, "_TABLES", {})
    issuer = CredentialIssuer("job-table", b"t" * 32)
    cred = issuer.shard_credential(0, 0, 50)
    senders = np.array([3, 7, 7, 49, 0])
    reports = np.random.default_rng(1).integers(0, 256, (5, 24), dtype=np.uint8)
    cred.sign(CTX, senders, reports)                        # one round only: nothing kept
    assert cr._TABLES == {}
    first = cred.sign(CTX, senders, reports, keep=True)     # more rounds follow: kept
    again = cred.sign(CTX, senders, reports)                # read from it
    monkeypatch.setattr(cr, "TABLE_MAX_CLIENTS", 10)        # no table: derived as before
    fresh = cred.sign(CTX, senders, reports)
    monkeypatch.setattr(cr, "TABLE_MAX_CLIENTS", 1 << 21)
    for got in (again, fresh):
        assert np.array_equal(got[0], first[0]) and np.array_equal(got[1], first[1])
    ranges = [(0, 50), (50, 90)]
    verifier = issuer.verifier(ranges)
    shards = verifier.shard_of(senders)
    assert verifier.valid(CTX, senders, first[0], reports, first[1], shards).all()
    assert verifier not in cr._TABLES
    assert verifier.valid(CTX, senders, first[0], reports, first[1], shards, keep=True).all()
    table = cr._TABLES[verifier]
    assert table._known[[0, 3, 7, 49]].all() and not table._known[[1, 60]].any()
    copy = pickle.loads(pickle.dumps(verifier))             # next round's admission
    assert copy is not verifier and cr._key_table(copy, 0, 90, create=False) is table
    tampered = reports.copy()
    tampered[2, 5] ^= 1
    assert copy.valid(CTX, senders, first[0], tampered, first[1], shards).tolist() == \
        [True, True, False, True, True]
    other = CredentialIssuer("job-table", b"u" * 32).verifier(ranges)   # another master
    assert not other.valid(CTX, senders, first[0], reports, first[1], shards).any()
    for i in range(cr.TABLES_KEPT + 2):                   # at most TABLES_KEPT per process
        cr._key_table(("owner", i), 0, 10)
    assert len(cr._TABLES) == cr.TABLES_KEPT and verifier not in cr._TABLES


def test_the_tag_is_keyed_blake2b_as_the_module_documents(issuer):
    """Recomputed from the docstring alone: shard key = MAC(master, domain|shard|job|i|lo|hi),
    client key = MAC(shard key, "client" | i64), tag = 128-bit MAC(client key, domain | job
    digest | round u32 | sender i64 | seq u32 | report); MAC = keyed BLAKE2b."""
    import hashlib

    def mac(key, msg, size=32):
        return hashlib.blake2b(msg, key=key, digest_size=size).digest()

    cred = issuer.shard_credential(1, *RANGES[1])
    reports = np.arange(2 * 40, dtype=np.uint8).reshape(2, 40)
    seqs, tags = cred.sign(CTX, np.array([12, 12]), reports)
    assert seqs.tolist() == [0, 1]
    shard_key = mac(issuer._master, b"rknn-ray/credential/v2|shard|%s|1|10|20" % CTX.job_id.encode())
    client_key = mac(shard_key, b"client" + (12).to_bytes(8, "big", signed=True))
    for j in range(2):
        msg = (b"rknn-ray/credential/v2" + CTX.job_digest + CTX.round_id.to_bytes(4, "big")
               + (12).to_bytes(8, "big") + j.to_bytes(4, "big") + reports[j].tobytes())
        assert tags[j].tobytes() == mac(client_key, msg, 16)

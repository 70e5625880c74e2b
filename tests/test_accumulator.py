"""The server step: accumulate opened batches in any order and batching == one-shot estimate;
duplicates (same report id: a retried client) count once; opener processes give the same answer."""
import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.rng import seeded_generator
from sealing.envelope import RoundContext, report_ids_from_key, seal_batch
from sealing.replay import ReplayGuard
from server.accumulator import RoundAccumulator, open_and_check
from server.keys import ServerKeyPair
from server.opener_pool import OpenerPool
from server.opening import ReportOpener

CTX = RoundContext("job-acc", 0)
MECHANISMS = [("central", "laplace"), ("local", "rr"), ("local", "collision"),
              ("local", "separation"), ("shuffle", "collision"), ("shuffle", "multi")]


def answers(n, s=6, c=3, k=2, seed=0):
    rng = np.random.default_rng(seed)
    nb = np.argsort(rng.random((n, s)), axis=1)[:, :k]
    return RecordAnswers(nb, rng.integers(0, c, (n, 1)), np.arange(n), s, c)


@pytest.fixture(scope="module")
def keys():
    return ServerKeyPair.generate()


def sealed_round(keys, model, name, n=1500):
    # the accumulator is under test, not eps: multi-message at eps=1 floods ~73,000 messages
    # here (seal + three openings ~17 CPU s); at eps=4 ~10,000 exercise the same path
    eps = 4.0 if name == "multi" else 1.0
    mech = build(model, name, MechanismParams(6, 3, 2, eps, delta=1e-6, num_clients=n))
    msgs = mech.randomize(answers(n), seeded_generator(5))
    ids = report_ids_from_key(bytes(range(32)), len(msgs))
    ct = seal_batch(keys.public_bytes(), msgs.payloads, CTX, report_ids=ids)
    return mech, msgs, ct


@pytest.mark.parametrize("model,name", MECHANISMS)
def test_any_order_and_batching_equals_one_shot_estimate(keys, model, name):
    mech, msgs, ct = sealed_round(keys, model, name)
    want = mech.estimate(msgs.payloads, len(np.unique(msgs.senders)), seeded_generator(9))
    rng = np.random.default_rng(1)
    for trial in range(3):
        order = rng.permutation(ct.shape[0])
        cuts = np.sort(rng.choice(np.arange(1, ct.shape[0]), size=4 + trial, replace=False))
        acc = RoundAccumulator(mech)
        opener = ReportOpener(keys, CTX, mech.message_size)
        for part in np.split(order, cuts):
            acc.accumulate(open_and_check(opener, mech, ct[part]))
        release = acc.finalize(seeded_generator(9))
        assert release.accepted == len(msgs) and release.received == len(msgs)
        assert sum(release.rejected.values()) == 0
        np.testing.assert_allclose(release.counts, want, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize("model,name", [("central", "laplace"), ("shuffle", "collision")])
def test_resealed_duplicates_count_once_across_rounds_of_the_job(keys, model, name):
    """A restarted client re-sends the same reports under fresh ciphertexts: counted once."""
    mech, msgs, ct = sealed_round(keys, model, name)
    ids = report_ids_from_key(bytes(range(32)), len(msgs))
    resent = seal_batch(keys.public_bytes(), msgs.payloads[:400], CTX, report_ids=ids[:400])
    assert not np.array_equal(resent, ct[:400])
    opener = ReportOpener(keys, CTX, mech.message_size)
    guard = ReplayGuard(16)
    acc = RoundAccumulator(mech, guard)
    for part in (ct[:1000], resent, ct[1000:], ct[:3]):      # byte-identical replays too
        acc.accumulate(open_and_check(opener, mech, part))
    release = acc.finalize(seeded_generator(9))
    assert release.accepted == len(msgs) and release.rejected["replayed"] == 403
    assert release.received == len(msgs) + 403
    np.testing.assert_allclose(release.counts, mech.estimate(msgs.payloads, len(msgs),
                                                              seeded_generator(9)))
    # the job-wide guard remembers: the same ids in a later round's accumulator are replays
    later = RoundAccumulator(mech, guard)
    later.accumulate(open_and_check(opener, mech, ct[:10]))
    assert later.accepted == 0 and later.rejected["replayed"] == 10


def test_opener_processes_match_in_process_opening(keys):
    mech, msgs, ct = sealed_round(keys, "local", "collision", n=3000)
    pool = OpenerPool(keys, processes=2)
    try:
        pool.begin_round(CTX, mech)
        acc = RoundAccumulator(mech)
        for fut in [pool.submit(part) for part in np.array_split(ct, 7)]:
            acc.accumulate(fut.result(timeout=120))
    finally:
        pool.close()
    release = acc.finalize()
    assert release.accepted == len(msgs)
    np.testing.assert_allclose(release.counts, mech.estimate(msgs.payloads, len(msgs)))


def test_bad_rows_are_counted_and_a_round_releases_once(keys):
    mech, msgs, ct = sealed_round(keys, "central", "laplace", n=200)
    bad = ct[:5].copy()
    bad[:, -1] ^= 1
    acc = RoundAccumulator(mech)
    opener = ReportOpener(keys, CTX, mech.message_size)
    for part in (np.zeros((0, ct.shape[1]), np.uint8), bad, ct, np.zeros((2, 7), np.uint8)):
        acc.accumulate(open_and_check(opener, mech, part))
    release = acc.finalize(seeded_generator(0))
    assert release.accepted == 200 and release.rejected["tampered"] == 5
    assert release.rejected["malformed"] == 2 and release.received == 207
    with pytest.raises(RuntimeError, match="once"):
        acc.finalize(seeded_generator(0))
    empty = RoundAccumulator(mech)
    assert empty.finalize(seeded_generator(0)).counts.shape == (6, 3)   # an empty round releases noise only


@pytest.mark.parametrize("openers", [0, 1])
def test_a_server_made_without_an_opener_count_takes_the_first_rounds(keys, tmp_path, openers):
    """cluster.openers: null. Nothing starts with the Server; its first round says how many
    opener processes (none below OPEN_IN_SERVER_BELOW expected messages: the Server opens
    them itself) and later rounds keep them. Either way the release is the same."""
    from actors.server import ServerImpl
    from rknn_ray.job.session import OPEN_IN_SERVER_BELOW, opener_processes
    from sealing.envelope import to_arrow
    assert opener_processes(3, 10) == 3 and opener_processes(0, 10 ** 9) == 0   # as asked
    assert opener_processes(None, OPEN_IN_SERVER_BELOW - 1) == 0
    key = tmp_path / "server.pem"
    keys.save(key)
    mech, msgs, ct = sealed_round(keys, "local", "collision", n=1200)
    server = ServerImpl(CTX.job_id, str(key), None, 4)
    try:
        assert server._pool is None                  # no process started with the Server
        server.begin_round(CTX, mech, None, openers)
        pool = server._pool
        assert pool.processes == openers and (pool._executor is None) == (openers == 0)
        for part in np.array_split(ct, 3):
            server.submit(to_arrow(part))
        release = server.finish("seeded", 0)
        server.begin_round(RoundContext(CTX.job_id, 1), mech, None, openers + 1)
        assert server._pool is pool                  # the first round's pool, reused
    finally:
        server.shutdown()
    assert release["messages"] == len(msgs)
    np.testing.assert_allclose(release["counts"], mech.estimate(msgs.payloads, len(msgs)))

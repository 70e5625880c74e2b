"""The shuffler's threat model: it cannot open reports, forgets senders, and leaks no order."""
import os
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
from scipy import stats  # noqa: E402

from rknn_ray.errors import PrivacyBudgetError  # noqa: E402
from sealing.envelope import RoundContext, from_arrow, seal_batch, to_arrow  # noqa: E402
from sealing.onion import seal_onion  # noqa: E402
from server.keys import ServerKeyPair  # noqa: E402
from server.opening import ReportOpener  # noqa: E402
from actors.shuffler import ShufflerImpl  # noqa: E402
from shuffler.pool import ShufflePool, secure_permutation  # noqa: E402

PKG = Path(__file__).resolve().parents[1] / "shuffler"
CTX = RoundContext("job-s", 1)


def test_permutation_uses_no_seeded_rng():
    source = (PKG / "pool.py").read_text()
    assert "np.random" not in source and "import random" not in source
    assert "os.urandom" in source


def test_a_plain_shuffler_holds_no_key_and_its_output_has_no_sender():
    keypair = ServerKeyPair.generate()
    impl = ShufflerImpl(min_senders=2, max_batch_messages=4)
    impl.submit(to_arrow(seal_batch(keypair.public_bytes(), np.zeros((6, 3), np.uint8), CTX),
                         np.array([5, 5, 6, 7, 7, 7])))

    def reachable(obj, depth=0):
        yield obj
        if depth < 3 and hasattr(obj, "__dict__"):
            for v in vars(obj).values():
                yield from reachable(v, depth + 1)
    kinds = {type(o).__name__ for o in reachable(impl)}
    assert not kinds & {"X25519PrivateKey", "ServerKeyPair", "LayerKeyPair", "LayerPeeler"}
    out = impl.release()
    assert [b.schema.names for b in out] == [["report"]] * 2 and [len(b) for b in out] == [4, 2]


# ----------------------------------------------------------------------------- pool logic

def make_batch(rows: np.ndarray, senders) -> pa.RecordBatch:
    return to_arrow(rows, np.asarray(senders, np.int64))


def rows_of(batches) -> np.ndarray:
    return np.concatenate([from_arrow(b)[0] for b in batches])


def test_release_is_a_permutation_of_the_input_in_bounded_batches():
    rng = np.random.default_rng(0)
    pool = ShufflePool(min_senders=10, max_batch_messages=7)
    sizes = [5, 1, 13, 8]   # chunk boundaries that do not align with output batches
    rows = [rng.integers(0, 256, (n, 9), dtype=np.uint8) for n in sizes]
    senders = [np.arange(n) % 4 + 10 * i for i, n in enumerate(sizes)]   # 4+1+4+4 distinct
    for r, s in zip(rows, senders):
        pool.add(make_batch(r, s))
    assert pool.num_senders == 13
    assert pool.stats() == {"messages": 27, "senders": 13, "bytes": 27 * 9, "batches": 4,
                            "released_batches": 0, "min_senders": 10}
    out = list(pool.release())
    assert [len(b) for b in out] == [7, 7, 7, 6]
    assert all(b.schema.names == ["report"] for b in out)
    released = rows_of(out)
    expected = np.concatenate(rows)
    key = lambda a: a[np.lexsort(a.T[::-1])]   # noqa: E731
    assert np.array_equal(key(released), key(expected))   # same multiset, nothing dropped
    assert pool.stats()["released_batches"] == 4
    assert list(pool.release()) == []                     # a second release resends nothing
    pool.add(make_batch(rows[0], [1] * 5))                # next round starts clean
    assert pool.stats()["messages"] == 5 and pool.num_senders == 1


def test_too_few_senders_releases_nothing():
    pool = ShufflePool(min_senders=3, max_batch_messages=10)
    rows = np.arange(40, dtype=np.uint8).reshape(10, 4)
    pool.add(make_batch(rows, [1, 1, 1, 2, 2, 2, 2, 1, 1, 2]))   # 10 messages, 2 senders
    with pytest.raises(PrivacyBudgetError, match="2 distinct senders, fewer than the 3"):
        pool.release()
    assert pool.stats()["released_batches"] == 0
    pool.add(make_batch(rows[:1], [3]))
    assert len(rows_of(pool.release())) == 11


def test_bad_input_is_refused_with_a_fix():
    pool = ShufflePool(min_senders=1)
    with pytest.raises(ValueError, match="no 'sender' column"):
        pool.add(to_arrow(np.zeros((2, 8), np.uint8)))
    pool.add(make_batch(np.zeros((2, 8), np.uint8), [1, 2]))
    with pytest.raises(ValueError, match="same pad_to"):
        pool.add(make_batch(np.zeros((2, 9), np.uint8), [1, 2]))
    hop = ShufflePool(min_senders=3, forwarded_input=True)   # downstream onion hop
    hop.add(to_arrow(np.zeros((2, 8), np.uint8)))
    with pytest.raises(PrivacyBudgetError, match="messages from the upstream shuffler"):
        hop.release()


def test_secure_permutation_is_a_permutation():
    for n in (0, 1, 2, 1000):
        assert np.array_equal(np.sort(secure_permutation(n)), np.arange(n))


def released_positions(n: int, trials: int) -> np.ndarray:
    """(trials, n): where the message that arrived i-th ends up in the server's view."""
    rows = np.arange(n, dtype=np.uint8).reshape(n, 1)   # the row's value is its arrival index
    pos = np.empty((trials, n), np.int64)
    for t in range(trials):
        pool = ShufflePool(min_senders=n, max_batch_messages=3)   # several output batches
        pool.add(make_batch(rows[:n // 2], np.arange(n // 2)))
        pool.add(make_batch(rows[n // 2:], np.arange(n // 2, n)))
        pos[t, rows_of(pool.release())[:, 0]] = np.arange(n)
    return pos


def test_arrival_order_does_not_predict_position():
    """The server's order is independent of arrival order: chi-square on the first and last
    arrivals' slots (uniform over n), and their slots are never the same (a permutation)."""
    n, trials = 10, 2000
    pos = released_positions(n, trials)
    for arrival in (0, n - 1):
        counts = np.bincount(pos[:, arrival], minlength=n)
        assert stats.chisquare(counts).pvalue > 1e-4, (arrival, counts)
    assert np.all(np.sort(pos, axis=1) == np.arange(n))
    # no drift with arrival rank: mean slot of every arrival rank is (n-1)/2 within 5 s.e.
    se = np.sqrt((n * n - 1) / 12 / trials)
    assert np.all(np.abs(pos.mean(axis=0) - (n - 1) / 2) < 5 * se), pos.mean(axis=0)


def test_all_orders_of_three_are_equally_likely():
    trials = 3000
    rows = np.arange(3, dtype=np.uint8).reshape(3, 1)
    seen = np.zeros(6, np.int64)
    index = {p: i for i, p in enumerate([(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])}
    for _ in range(trials):
        pool = ShufflePool(min_senders=3)
        pool.add(make_batch(rows, [1, 2, 3]))
        seen[index[tuple(rows_of(pool.release())[:, 0])]] += 1
    assert stats.chisquare(seen).pvalue > 1e-4, seen


# ----------------------------------------------------------------------------- Ray actors

@pytest.fixture(scope="module")
def ray_local(ray_session):
    """The session's shared local Ray instance (tests/conftest.py)."""
    return ray_session


def test_shuffler_actor_end_to_end(ray_local):
    from actors.shuffler import Shuffler
    ray = ray_local
    keypair = ServerKeyPair.generate()
    rng = np.random.default_rng(1)
    payloads = rng.integers(0, 256, (30, 6), dtype=np.uint8)
    actor = Shuffler.options(num_cpus=0.5).remote(min_senders=12, max_batch_messages=8)
    for shard in range(3):   # three client shards, 10 messages from 5 senders each
        part = payloads[10 * shard:10 * (shard + 1)]
        ct = seal_batch(keypair.public_bytes(), part, CTX, pad_to=8)
        assert ray.get(actor.submit.remote(make_batch(ct, np.arange(10) // 2 + 100 * shard))) == 10
    st = ray.get(actor.stats.remote())
    assert (st["messages"], st["senders"], st["batches"]) == (30, 15, 3)
    batches = ray.get(actor.release.remote())
    assert [b.schema.names for b in batches] == [["report"]] * 4
    o = ReportOpener(keypair, CTX, payload_len=6).open_batch(rows_of(batches))
    opened, rejects = o.payloads, o.rejects
    assert sum(rejects.values()) == 0
    assert sorted(map(bytes, opened)) == sorted(map(bytes, payloads))
    # below the floor the actor refuses, and the error crosses Ray as PrivacyBudgetError
    small = Shuffler.options(num_cpus=0.5).remote(min_senders=50)
    ray.get(small.submit.remote(make_batch(rows_of(batches), np.arange(30))))
    with pytest.raises(PrivacyBudgetError, match="nothing was released"):
        ray.get(small.release.remote())
    ray.kill(actor)
    ray.kill(small)


def test_onion_chain_of_two_actors(ray_local):
    from actors.shuffler import Shuffler
    ray = ray_local
    keypair = ServerKeyPair.generate()
    hop1 = Shuffler.options(num_cpus=0.5).remote(min_senders=10, max_batch_messages=6,
                                                 ctx=CTX, onion_layer=1)
    hop2 = Shuffler.options(num_cpus=0.5).remote(min_senders=10, max_batch_messages=6,
                                                 ctx=CTX, onion_layer=2, forwarded_input=True)
    hop_keys = ray.get([hop1.public_key.remote(), hop2.public_key.remote()])
    payloads = np.random.default_rng(2).integers(0, 256, (12, 5), dtype=np.uint8)
    ct = seal_onion(keypair.public_bytes(), hop_keys, payloads, CTX, pad_to=8)
    tampered = ct[:1].copy()
    tampered[0, -3] ^= 0x10
    batch = np.concatenate([ct, tampered, ct[:2]])          # + one tampered, two replays
    assert ray.get(hop1.submit.remote(make_batch(batch, np.arange(15)))) == 12
    refs = ray.get(hop1.release_refs.remote())
    assert sum(ray.get([hop2.submit.remote(r) for r in refs])) == 12
    o = ReportOpener(keypair, CTX, 5).open_batch(rows_of(ray.get(hop2.release.remote())))
    opened, rejects = o.payloads, o.rejects
    assert sum(rejects.values()) == 0
    assert sorted(map(bytes, opened)) == sorted(map(bytes, payloads))
    st1 = ray.get(hop1.stats.remote())
    assert st1["senders"] == 12 and st1["rejected"]["tampered"] == 1
    assert st1["rejected"]["replayed"] == 2 and st1["onion_layer"] == 1
    assert ray.get(hop2.stats.remote())["senders"] is None
    for a in (hop1, hop2):
        ray.kill(a)

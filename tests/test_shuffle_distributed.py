"""The shuffle that outgrows one process: sort by OS-CSPRNG keys on Ray tasks.

Multiset kept, senders dropped, floor enforced, order independent of arrival, keys
from os.urandom, sorted buckets handed over a window at a time (the in-process pool's
batches too), and the same release as the in-process shuffle through the real protocol."""
import os

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import RoundContext, from_arrow, to_arrow
from shuffler.distributed import DistributedShuffle


def _rows(n=5000, width=12):
    """Row i carries i in its first 4 bytes, so output positions map back to input positions."""
    rows = np.zeros((n, width), np.uint8)
    rows[:, :4] = np.arange(n, dtype="<u4").view(np.uint8).reshape(n, 4)
    return rows


def _batches(ray, rows, per=500, senders=None):
    n = len(rows)
    senders = np.arange(n) // 2 if senders is None else senders
    return [ray.put(to_arrow(rows[a:a + per], senders[a:a + per])) for a in range(0, n, per)]


def _positions(batches):
    got = np.concatenate([from_arrow(b)[0] for b in batches])
    return got, got[:, :4].copy().view("<u4").ravel().astype(np.int64)


def test_keeps_the_multiset_drops_senders_and_forgets_arrival_order(ray_session):
    ray = ray_session
    rows = _rows()
    senders = np.arange(5000) % 2000                 # every client sends in 2-3 batches
    refs = _batches(ray, rows, senders=senders)
    shuffle = DistributedShuffle(2000, target_bucket_bytes=15_000, max_batch_messages=700)
    taken = sum(shuffle.add(r) for r in refs[:6])
    taken += sum(shuffle.add(ray.get(r)) for r in refs[6:])   # batches by value work too
    assert taken == 5000 and shuffle.num_senders == 2000      # a repeated sender counts once
    out = ray.get(shuffle.release())
    assert shuffle.buckets == 4
    assert all(b.schema.names == ["report"] for b in out)     # no sender column leaves
    assert all(isinstance(b, pa.RecordBatch) for b in out)
    got, position = _positions(out)
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows))   # the multiset, exactly
    # arrival position vs output position: deciles independent, rank correlation near 0
    table = np.histogram2d(position * 10 // 5000, np.arange(5000) * 10 // 5000,
                           bins=10, range=[[0, 10], [0, 10]])[0]
    assert stats.chi2_contingency(table).pvalue > 1e-6
    assert abs(stats.spearmanr(position, np.arange(5000)).statistic) < 0.06
    st = shuffle.stats()
    assert (st["senders"], st["messages"], st["bytes"], st["batches"]) == (2000, 5000, 60000, 10)
    assert st["mode"] == "distributed"
    assert st["released_batches"] == len(out) and st["spilled_bytes"] >= 0
    assert shuffle.release() == []                            # releases once


def test_refuses_below_the_floor_and_releases_nothing(ray_session):
    rows = _rows(1200)
    refs = _batches(ray_session, rows, per=300)               # 600 distinct senders
    shuffle = DistributedShuffle(601)
    for r in refs:
        shuffle.add(r)
    with pytest.raises(PrivacyBudgetError, match="600 distinct senders, fewer than the 601"):
        shuffle.release()
    assert not shuffle.released and shuffle.stats()["released_batches"] == 0
    shuffle.add(to_arrow(rows[:1], [10_000]))                 # one more client: now it may go
    got, _ = _positions(ray_session.get(shuffle.release()))
    assert len(got) == 1201


def test_a_batch_without_sender_ids_is_refused(ray_session):
    with pytest.raises(ValueError, match="no 'sender' column"):
        DistributedShuffle(1).add(to_arrow(_rows(3)))


def test_keys_come_from_os_urandom(monkeypatch):
    """The keys are exactly the bytes os.urandom returned; no seeded RNG in sight."""
    import inspect

    import shuffler.distributed as mod
    calls = []

    def counting_urandom(k):
        calls.append(k)
        return bytes(range(256)) * (k // 256) + bytes(range(k % 256))

    monkeypatch.setattr(os, "urandom", counting_urandom)
    keys = mod._keys(20)
    assert calls == [320]
    assert keys.astype(">u8").tobytes() == counting_urandom(320)
    src = inspect.getsource(mod)
    assert "np.random" not in src and "import random" not in src and "default_rng" not in src


def test_tied_keys_are_ordered_by_fresh_random_keys(monkeypatch):
    import shuffler.distributed as mod
    hi = np.array([5, 1, 5, 1], np.int64)
    lo = np.array([7, 2, 7, 3], np.int64)      # rows 0 and 2 tie on the whole 128-bit key
    assert list(mod._key_order(hi[[1, 3]], lo[[1, 3]])) == [0, 1]
    fresh = np.array([[9, 0], [0, 0], [3, 0], [0, 0]], ">u8")   # row 2's fresh key is smaller
    monkeypatch.setattr(os, "urandom", lambda k: fresh.tobytes()[:k])
    assert list(mod._key_order(hi, lo)) == [1, 3, 2, 0]


def test_sorted_buckets_are_handed_over_a_window_at_a_time(ray_session):
    """release(first) sorts only the first buckets; more() the next ones: the store never
    holds the whole sorted round at once, and the pieces together are the whole multiset."""
    ray = ray_session
    rows = _rows()
    shuffle = DistributedShuffle(1000, target_bucket_bytes=7_000)     # 60 kB -> 16 buckets
    for r in _batches(ray, rows):
        shuffle.add(r)
    first = shuffle.release(2)
    assert len(first) == 2 and shuffle.buckets == 16 and shuffle.remaining == 14
    assert shuffle.stats()["released_batches"] == 2
    parts = [first]
    while shuffle.remaining:
        parts.append(shuffle.more(3))
        assert 1 <= len(parts[-1]) <= 3
    assert shuffle.more(3) == [] and shuffle.release(2) == []
    got, _ = _positions(ray.get([r for p in parts for r in p]))
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows))
    with pytest.raises(ValueError, match="release\\(\\) first"):
        DistributedShuffle(1).more(1)


@pytest.mark.parametrize("distributed", [False, True])
def test_shuffler_actor_hands_over_in_windows(ray_session, distributed):
    """The actor's release_refs(first) + more_refs(count): the pool's batches (or the sorted
    buckets) a few at a time, the floor checked before the first, nothing sent twice."""
    ray = ray_session
    from actors.shuffler import Shuffler
    rows = _rows()
    hop = Shuffler.options(num_cpus=0.25).remote(2500, 700)
    ray.get(hop.start_round.remote(0, 2501, distributed))
    assert ray.get(hop.submit_refs.remote(_batches(ray, rows))) == 5000
    with pytest.raises(Exception, match="2500 distinct senders, fewer than the 2501"):
        ray.get(hop.release_refs.remote(2))
    ray.get(hop.start_round.remote(1, 2500, distributed))
    assert ray.get(hop.submit_refs.remote(_batches(ray, rows))) == 5000
    first = ray.get(hop.release_refs.remote(2))
    assert len(first) == (1 if distributed else 2)          # one 60 kB bucket; 8 pool batches
    got_refs = list(first)
    while True:
        more = ray.get(hop.more_refs.remote(3))
        if not more:
            break
        assert len(more) <= 3
        got_refs += more
    out = ray.get(got_refs)
    assert len(out) == (1 if distributed else 8)
    assert all(b.schema.names == ["report"] for b in out)
    got, _ = _positions(out)
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows))
    assert ray.get(hop.more_refs.remote(3)) == [] and ray.get(hop.release_refs.remote(2)) == []
    onion = Shuffler.options(num_cpus=0.25).remote(1, ctx=RoundContext("job-window", 0),
                                                   onion_layer=1)
    with pytest.raises(Exception, match="onion layers"):
        ray.get(onion.start_round.remote(0, 1, True))
    for a in (hop, onion):
        ray.kill(a)


def test_protocol_round_distributed_equals_in_process(clean_shuffle_round):
    """Same job, seeded secrets and server noise: the distributed path releases the same counts
    as the in-process one (conftest's clean round)."""
    from tests.digits_rounds import session_round
    cfg, local = clean_shuffle_round
    cfg_d = cfg.with_overrides(["shuffle.distributed_above=100"])
    _, _, _, _, (dist,) = session_round(cfg_d, job_id="job-clean")
    assert dist.shuffler["hops"][0]["mode"] == "distributed"
    assert "mode" not in local.shuffler["hops"][0]
    assert dist.shuffler["senders"] == local.shuffler["senders"] == 1079
    assert dist.messages == local.messages == 1079
    np.testing.assert_array_equal(dist.counts, local.counts)

"""The shuffle that outgrows one process: sort by OS-CSPRNG keys (Ray tasks or Ray Data).

Multiset kept, senders dropped, floor enforced, order independent of arrival, keys
from os.urandom, the Shuffler actor's choice by size, and the same release as the
in-process shuffle through the real protocol."""
import os

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import from_arrow, to_arrow
from shuffler.distributed import make_distributed

ENGINES = ["tasks", "ray_data"]


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


@pytest.mark.parametrize("engine", ENGINES)
def test_keeps_the_multiset_drops_senders_and_forgets_arrival_order(ray_session, engine):
    ray = ray_session
    rows = _rows()
    senders = np.arange(5000) % 2000                 # every client sends in 2-3 batches
    refs = _batches(ray, rows, senders=senders)
    shuffle = make_distributed(2000, engine, target_bucket_bytes=15_000, max_batch_messages=700)
    taken = sum(shuffle.add(r) for r in refs[:6])
    taken += sum(shuffle.add(ray.get(r)) for r in refs[6:])   # batches by value work too
    assert taken == 5000 and shuffle.num_senders == 2000      # a repeated sender counts once
    out = ray.get(shuffle.release())
    assert shuffle.buckets == 4
    assert all(b.schema.names == ["report"] for b in out)     # no sender column leaves
    assert all(isinstance(b, pa.RecordBatch) for b in out)
    if engine == "ray_data":
        assert max(b.num_rows for b in out) <= 700            # bounded output batches
    got, position = _positions(out)
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows))   # the multiset, exactly
    # arrival position vs output position: deciles independent, rank correlation near 0
    table = np.histogram2d(position * 10 // 5000, np.arange(5000) * 10 // 5000,
                           bins=10, range=[[0, 10], [0, 10]])[0]
    assert stats.chi2_contingency(table).pvalue > 1e-6
    assert abs(stats.spearmanr(position, np.arange(5000)).statistic) < 0.06
    st = shuffle.stats()
    assert (st["senders"], st["messages"], st["bytes"], st["batches"]) == (2000, 5000, 60000, 10)
    assert st["mode"] == "distributed" and st["engine"] == engine
    assert st["released_batches"] == len(out) and st["spilled_bytes"] >= 0
    assert shuffle.release() == []                            # releases once


@pytest.mark.parametrize("engine", ENGINES)
def test_refuses_below_the_floor_and_releases_nothing(ray_session, engine):
    rows = _rows(1200)
    refs = _batches(ray_session, rows, per=300)               # 600 distinct senders
    shuffle = make_distributed(601, engine)
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
        make_distributed(1).add(to_arrow(_rows(3)))
    with pytest.raises(ValueError, match="unknown distributed shuffle engine"):
        make_distributed(1, "spark")


def test_keys_come_from_os_urandom(monkeypatch):
    """Both engines' keys are exactly the bytes os.urandom returned; no seeded RNG in sight."""
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
    table = mod._attach_keys(pa.table({"sender": [1, 2, 3], "report": to_arrow(_rows(3))["report"]}))
    assert calls[-1] == 48 and table.schema.names == ["key_hi", "key_lo", "report"]
    assert np.stack([table["key_hi"].to_numpy(), table["key_lo"].to_numpy()], 1).tobytes() \
        == counting_urandom(48)
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


def test_shuffler_actor_chooses_the_path_by_size(ray_session):
    ray = ray_session
    from actors.shuffler import Shuffler
    rows = _rows()
    refs = _batches(ray, rows)
    big = Shuffler.options(num_cpus=0.25).remote(1000, 700, distributed_above=4999,
                                                 engine="ray_data")
    small = Shuffler.options(num_cpus=0.25).remote(1000, 700, distributed_above=5000)
    assert ray.get(big.submit_refs.remote(refs[:5])) == 2500
    assert ray.get(big.submit.remote(ray.get(refs[5]))) == 500     # by value, still staged
    assert ray.get(big.submit_refs.remote(refs[6:])) == 2000
    assert ray.get(big.stats.remote())["mode"] == "staged"
    assert ray.get(small.submit_refs.remote(refs)) == 5000
    out_big = ray.get(ray.get(big.release_refs.remote()))
    out_small = ray.get(small.release.remote())
    st_big, st_small = ray.get([big.stats.remote(), small.stats.remote()])
    assert st_big["mode"] == "distributed" and st_big["engine"] == "ray_data"
    assert "mode" not in st_small and st_small["released_batches"] == 8   # the in-process pool
    for out in (out_big, out_small):
        got, _ = _positions(out)
        assert all(b.schema.names == ["report"] for b in out)
        assert sorted(map(bytes, got)) == sorted(map(bytes, rows))
    assert ray.get(big.release_refs.remote()) == [] and ray.get(small.release.remote()) == []
    with pytest.raises(Exception, match="onion layers"):
        ray.get(Shuffler.options(num_cpus=0.25).remote(1, distributed_above=10, onion_layer=1).public_key.remote())
    for a in (big, small):
        ray.kill(a)


def test_protocol_round_distributed_equals_in_process(ray_session):
    """Same job, seeded secrets and server noise: the distributed path releases the same counts."""
    from tests.test_protocol import _digits_cfg, _session_round
    cfg = _digits_cfg("privacy.eps=2.0")
    _, _, _, _, (local,) = _session_round(cfg, job_id="job-dist")
    cfg_d = cfg.with_overrides(["shuffle.distributed_above=100"])
    _, _, _, _, (dist,) = _session_round(cfg_d, job_id="job-dist")
    assert dist.shuffler["hops"][0]["mode"] == "distributed"
    assert "mode" not in local.shuffler["hops"][0]
    assert dist.shuffler["senders"] == local.shuffler["senders"] == 1079
    assert dist.messages == local.messages == 1079
    np.testing.assert_array_equal(dist.counts, local.counts)

"""The shuffle that outgrows one process: sort by OS-CSPRNG keys on Ray tasks.

Multiset kept, senders dropped, floor enforced, order independent of arrival, and the
same release as the in-process shuffle through the real protocol."""
import numpy as np
import pytest
from scipy import stats

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import from_arrow, to_arrow
from shuffler.distributed import DistributedShuffle


def _batches(ray, n=6000, per=600, width=12):
    rows = np.zeros((n, width), np.uint8)
    rows[:, :4] = np.arange(n, dtype="<u4").view(np.uint8).reshape(n, 4)   # row i carries i
    return [ray.put(to_arrow(rows[a:a + per], np.arange(a, a + per) // 2))
            for a in range(0, n, per)], rows


def test_distributed_shuffle_keeps_the_multiset_drops_senders_and_permutes(ray_session):
    ray = ray_session
    refs, rows = _batches(ray)
    shuffle = DistributedShuffle(min_senders=3000, target_bucket_bytes=20_000)
    assert sum(shuffle.add_ref(r) for r in refs) == 6000
    out = ray.get(shuffle.release())
    assert shuffle.buckets >= 4 and len(out) == shuffle.buckets
    assert all(b.schema.names == ["report"] for b in out)        # no sender column leaves
    got = np.concatenate([from_arrow(b)[0] for b in out])
    assert sorted(map(bytes, got)) == sorted(map(bytes, rows))   # the multiset, exactly
    position = got[:, :4].copy().view("<u4").ravel().astype(np.int64)
    rho = stats.spearmanr(position, np.arange(position.size)).statistic
    assert abs(rho) < 0.06                                       # arrival order does not show
    st = shuffle.stats()
    assert st["senders"] == 3000 and st["messages"] == 6000 and st["mode"] == "distributed"
    assert shuffle.release() == []                               # releases once


def test_distributed_shuffle_refuses_below_the_floor(ray_session):
    refs, _ = _batches(ray_session, n=1200)
    shuffle = DistributedShuffle(min_senders=601)
    for r in refs:
        shuffle.add_ref(r)
    with pytest.raises(PrivacyBudgetError, match="600 distinct senders"):
        shuffle.release()


def test_keys_come_from_the_os_csprng():
    import inspect

    import shuffler.distributed as mod
    src = inspect.getsource(mod)
    assert "os.urandom" in src and "np.random" not in src and "import random" not in src


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

"""A client shard gets only its own records, cut from the partition the job prepared once:
no shard loads, splits or partitions the whole dataset again (issue 19)."""
import os
import pickle

import numpy as np
import pytest

import rknn_ray.data.prepared as prepared
from actors.client_shard import ClientShardImpl
from rknn_ray.config import load_config
from rknn_ray.data.prepared import prepare_data
from rknn_ray.data.sources import dataset_sources


def _cfg(*overrides):
    return load_config("jobs/configs/digits_central.yaml",
                       ["data.partition=dirichlet", "data.clients=40", "data.alpha=0.3",
                        "data.max_records_per_client=30", *overrides])


def test_a_shards_records_are_exactly_its_part_of_the_partition(monkeypatch):
    cfg = _cfg()
    data = prepare_data(cfg)
    assert data.records_dropped() > 0              # the per-client bound keeps some records out
    sources = [pickle.loads(pickle.dumps(s)) for s in dataset_sources(cfg, data, shards=3)]
    monkeypatch.setattr(prepared, "prepare_data", lambda *a: pytest.fail("a shard prepared"))
    held = data.held_rows()
    sp = data.splits
    seen = []
    bound = data.max_records_per_client
    for src in sources:
        recs = src.open(order_key=bytes(32))
        ids = data.client_ids[held]
        assert np.all(recs.client_ids[1:] >= recs.client_ids[:-1])     # grouped by client
        for c in range(src.client_lo, src.client_hi):   # its own client's records, bound kept
            mine = np.flatnonzero(data.client_ids == c)
            got = np.flatnonzero(recs.client_ids == c)
            assert got.size == min(mine.size, bound) == np.count_nonzero(ids == c)
            rows = [int(np.flatnonzero((sp.private_x[mine] == recs.features[g]).all(
                axis=tuple(range(1, sp.private_x.ndim))) & (sp.private_y[mine] == recs.labels[g]))
                [0]) for g in got]
            seen.extend(mine[rows])
        assert not hasattr(src, "config")           # nothing to prepare the dataset from
    # the shards' parts are disjoint and hold the public count of records, each client's own
    assert len(seen) == held.size
    assert [(s.client_lo, s.client_hi) for s in sources] == [(0, 13), (13, 26), (26, 40)]


class PrepareCountingShard(ClientShardImpl):
    """A shard that counts prepare_data calls in its own process while it starts and
    writes the count beside its key store (the test's folder)."""

    def __init__(self, shard_id, source, secrets, credential=None):
        import rknn_ray.data.prepared as prep
        calls = []
        real = prep.prepare_data
        prep.prepare_data = lambda *a, **k: calls.append(1) or real(*a, **k)
        try:
            super().__init__(shard_id, source, secrets, credential)
        finally:
            prep.prepare_data = real
        with open(os.path.join(secrets.root, f"prepare-calls-{shard_id}"), "w") as fh:
            fh.write(str(len(calls)))


def test_prepare_data_runs_once_per_job(ray_session, tmp_path, monkeypatch,
                                        isolated_privacy_ledger):
    """A whole job (3 shards) prepares its data once, in the driver: counted there and in
    every shard's process."""
    import functools

    import jobs.distill as distill
    from rknn_ray.job.session import Parties
    calls = []
    real = prepared.prepare_data
    monkeypatch.setattr(prepared, "prepare_data", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(distill, "run", functools.partial(
        distill.run, parties=Parties(shard=PrepareCountingShard)))
    keys = tmp_path / "keys"
    args = ["--config", "jobs/configs/digits_central.yaml", "--out", str(tmp_path / "run"),
            "--quiet"]
    for o in ["student.epochs=1", "queries.restarts=1", "student.trainer=local",
              "queries.s=20", "cluster.shards=3", f"cluster.key_store={keys}"]:
        args += ["--set", o]
    assert distill.main(args) == 0
    assert len(calls) == 1
    counts = sorted(p.name for p in keys.iterdir() if p.name.startswith("prepare-calls-"))
    assert counts == [f"prepare-calls-{i}" for i in range(3)]
    assert {(keys / name).read_text() for name in counts} == {"0"}


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="reads Linux /proc/PID/mem")
def test_a_shards_records_reach_it_by_reference_never_through_the_gcs(ray_session):
    """The session puts each shard's records in the object store and passes the reference:
    no record is in gcs_server, where an actor argument passed by value is inlined when small
    (the control below, as tests/test_secret_memory.py's canary)."""
    from rknn_ray.data.sources import PreparedShardSource
    from rknn_ray.job.session import ProtocolSession

    def records(canary):
        x = np.tile(canary.astype(np.float32) / 255.0, (8, 1)).reshape(8, 1, 8, 8)
        return PreparedShardSource(0, 8, x, np.zeros(8, np.int64), np.arange(8)), x[0].tobytes()

    src, needle = records(np.frombuffer(os.urandom(64), np.uint8))     # 2 KiB: inlinable
    by_value, control = records(np.frombuffer(os.urandom(64), np.uint8))
    holder = ray_session.remote(num_cpus=0)(_Holder).remote(by_value)
    cfg = load_config("jobs/configs/digits_central.yaml",
                      ["run.rng=seeded", "cluster.openers=0", "queries.s=4"])
    with ProtocolSession(cfg, [src], "job-by-ref") as session:
        assert session.num_clients == 8 and ray_session.get(holder.clients.remote()) == 8
        hits = _in_gcs(needle, control)
        assert hits[1], "the control: an argument passed by value is in the GCS"
        assert not hits[0], "a shard's records went through the GCS"
    ray_session.kill(holder)


class _Holder:
    """An actor given a source by value (the control of the test above)."""

    def __init__(self, source):
        self.records = source.open()

    def clients(self) -> int:
        return self.records.num_clients


def _in_gcs(*needles: bytes) -> list[list[int]]:
    """Where each needle is in the memory of the gcs_server this test process started."""
    import psutil

    from tests.procmem import find_bytes
    mine = {c.pid for c in psutil.Process().children(recursive=True)}
    (gcs,) = [p.pid for p in psutil.process_iter(["name"])
              if p.info["name"] == "gcs_server" and p.pid in mine]
    return find_bytes(gcs, *needles)[0]


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="reads Linux /proc/PID/mem")
def test_nfdp_parties_records_reach_their_actors_by_reference(ray_session):
    """The FedMD-NFDP baseline's party groups (their private records) go to the NfdpShard
    actors through the object store, never inlined in the GCS."""
    from actors.nfdp_shard import RayParties
    rows = np.frombuffer(os.urandom(8 * 16), np.uint8).astype(np.float32).reshape(8, 16)
    group = dict(xs=[rows], ys=[np.arange(8) % 2], k=4, replacement=True, num_classes=2,
                 seed=0, rng_kind="seeded")
    host = RayParties([group])
    try:
        assert host.call("predict", rows[:2])[0].shape == (1, 2, 2)   # the actor has them
        assert not any(_in_gcs(rows.tobytes()[:64], rows.tobytes()[64:128]))
    finally:
        host.close()

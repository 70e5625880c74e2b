"""ClientShard logic (in-process): retries and restarts never re-randomize, ids are stable,
records are loaded by the shard from its source spec, dropout removes whole clients."""
import numpy as np

from actors.client_shard import ClientShardImpl
from rknn_ray.client_step import RoundSpec
from rknn_ray.data.sources import ShardRecords, SyntheticClientsSource
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.representation.represent import RawEncoder
from rknn_ray.shard_secrets import SeededShardSecrets, ShardKeyStore
from sealing.envelope import RoundContext, from_arrow
from server.keys import ServerKeyPair
from server.opening import ReportOpener

SOURCE = SyntheticClientsSource(0, 300, num_classes=3, dim=4, seed=1)


def _spec(keys, round_id=0, dropout=0.0, k=2):
    x, _ = SOURCE.records(0, 300)
    mech = build("local", "rr", MechanismParams(8, 3, k, 1.0))
    return RoundSpec(RoundContext("job-r", round_id), mech, RawEncoder().fit(x), x[:8], k, 3,
                     keys.public_bytes(), dropout=dropout)


def _open(batches, keys, spec):
    opener = ReportOpener(keys, spec.ctx, spec.mechanism.message_size)
    out = [opener.open_batch(from_arrow(b)[0]) for b in batches]
    return np.concatenate([o.payloads for o in out]), np.concatenate([o.report_ids for o in out])


def test_retry_and_restart_resend_the_same_reports_and_ids(tmp_path):
    keys = ServerKeyPair.generate()
    spec = _spec(keys)
    store = ShardKeyStore("job-r", str(tmp_path / "keys"))
    shard = ClientShardImpl(0, SOURCE, store)
    first = list(shard.stream_reports(spec, 128))
    assert len(first) == 3                                     # 128 + 128 + 44 clients
    again = list(shard.stream_reports(spec, 128))             # a retried call
    restarted = list(ClientShardImpl(0, SOURCE, store).stream_reports(spec, 128))  # reads its key
    p1, i1 = _open(first, keys, spec)
    for other in (again, restarted):
        p, i = _open(other, keys, spec)
        np.testing.assert_array_equal(p, p1)                   # same randomized reports
        np.testing.assert_array_equal(i, i1)                   # ... and the same report ids
        assert not np.array_equal(from_arrow(other[0])[0], from_arrow(first[0])[0])  # fresh sealing
    # ...but another shard secret, or the next round, draws fresh randomness and ids
    other = ShardKeyStore("job-r", str(tmp_path / "other-node"))
    p3, i3 = _open(list(ClientShardImpl(0, SOURCE, other).stream_reports(spec, 128)), keys, spec)
    assert not np.array_equal(p1, p3) and not set(i1.tolist()) & set(i3.tolist())
    spec1 = _spec(keys, round_id=1)
    p4, i4 = _open(list(shard.stream_reports(spec1, 128)), keys, spec1)
    assert not np.array_equal(p1, p4) and not set(i1.tolist()) & set(i4.tolist())


def test_dropout_removes_whole_clients_deterministically():
    keys = ServerKeyPair.generate()
    spec = _spec(keys, dropout=0.3)
    shard = ClientShardImpl(0, SOURCE, SeededShardSecrets(3))
    senders = np.concatenate([from_arrow(b)[1] for b in shard.stream_reports(spec, 100)])
    assert 150 < senders.size < 270 and np.unique(senders).size == senders.size
    again = np.concatenate([from_arrow(b)[1] for b in shard.stream_reports(spec, 100)])
    np.testing.assert_array_equal(senders, again)


def test_sources_load_the_same_records_in_any_batching():
    x1, y1 = SOURCE.records(0, 300)
    x2 = np.concatenate([SOURCE.records(a, min(300, a + 70))[0] for a in range(0, 300, 70)])
    np.testing.assert_array_equal(x1, x2)
    assert np.bincount(y1, minlength=3).min() > 60
    recs = ShardRecords(x1[::-1].copy(), y1[::-1].copy(), np.arange(300)[::-1] // 2)
    batches = list(recs.batches(40))
    assert recs.num_clients == 150 and recs.max_records_per_client == 2
    assert [len(np.unique(b[2])) for b in batches] == [40, 40, 40, 30]   # whole clients per batch

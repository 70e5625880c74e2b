"""ClientShard logic (run in-process): retries and restarts never re-randomize."""
import numpy as np

from actors.client_shard import ClientShardImpl
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.represent import RawEncoder
from sealing.envelope import RoundContext, from_arrow
from server.keys import ServerKeyPair
from server.opening import ReportOpener


def _shard(secret, seed=0, n=300):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 4)).astype(np.float32)
    y = rng.integers(0, 3, n)
    return ClientShardImpl(0, x, y, np.arange(n), secret), x


def _open(batches, keys, ctx, size):
    opener = ReportOpener(keys, ctx, payload_len=size)
    return np.concatenate([opener.open_batch(from_arrow(b)[0])[0] for b in batches])


def test_retry_and_restart_resend_the_same_reports():
    secret = b"s" * 32
    shard, x = _shard(secret)
    enc = RawEncoder().fit(x)
    queries = x[:8]
    mech = build("local", "rr", MechanismParams(8, 3, 2, 1.0))
    keys, ctx = ServerKeyPair.generate(), RoundContext("job-r", 0)
    args = (enc, queries, 2, 3, mech, ctx, keys.public_bytes(), 128)
    first = shard.make_reports(*args)
    assert shard.make_reports(*args) is first                 # a retried call: cached
    restarted, _ = _shard(secret)                            # same constructor args
    again = restarted.make_reports(*args)
    p1 = _open(first, keys, ctx, mech.message_size)
    p2 = _open(again, keys, ctx, mech.message_size)
    np.testing.assert_array_equal(p1, p2)                    # same randomized reports
    # ...but the next round, or another shard secret, draws fresh randomness
    other, _ = _shard(b"t" * 32)
    p3 = _open(other.make_reports(*args), keys, ctx, mech.message_size)
    assert not np.array_equal(p1, p3)
    ctx1 = RoundContext("job-r", 1)
    p4 = _open(shard.make_reports(enc, queries, 2, 3, mech, ctx1, keys.public_bytes(), 128),
               keys, ctx1, mech.message_size)
    assert not np.array_equal(p1, p4)


def test_dropout_removes_whole_clients_deterministically():
    shard, x = _shard(b"d" * 32)
    enc = RawEncoder().fit(x)
    mech = build("local", "rr", MechanismParams(8, 3, 1, 1.0))
    keys, ctx = ServerKeyPair.generate(), RoundContext("job-d", 0)
    batches = shard.make_reports(enc, x[:8], 1, 3, mech, ctx, keys.public_bytes(), 100,
                                 None, None, 0.3)
    senders = np.concatenate([from_arrow(b)[1] for b in batches])
    assert 150 < senders.size < 270 and np.unique(senders).size == senders.size

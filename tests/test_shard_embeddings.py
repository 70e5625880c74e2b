"""A shard keeps its records' embeddings across rounds (the job's encoder is fixed, only the
queries change): a later round computes none and sends exactly the reports it would have."""
from __future__ import annotations

import numpy as np


class CountingEncoder:
    """Wraps an encoder and counts its transforms in this process (picklable)."""
    calls = 0

    def __init__(self, inner, tag: str = ""):
        self.inner, self.tag = inner, tag

    def transform(self, x):
        CountingEncoder.calls += 1
        return self.inner.transform(x)


def _setup(n=300):
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.data.sources import SyntheticClientsSource
    from server.keys import ServerKeyPair
    encoder, qs, mech = _public_setup(n, 10, "shuffle", "collision", 1e-6)
    return (encoder, qs, mech, ServerKeyPair.generate(),
            lambda: SyntheticClientsSource(0, n, NUM_CLASSES, DIM, SEED))


def _round(shard, spec, server, mech, batch=120):
    from sealing.envelope import from_arrow
    from server.opening import ReportOpener
    sealed = np.concatenate([from_arrow(b)[0] for b in shard.stream_reports(spec, batch)])
    out = ReportOpener(server, spec.ctx, mech.message_size).open_batch(sealed)
    order = np.argsort(out.report_ids)
    return out.report_ids[order], out.payloads[order]


def test_a_later_round_reuses_the_embeddings_and_sends_the_same_reports(monkeypatch):
    from actors import client_shard
    from actors.client_shard import ClientShardImpl
    from benchmarks.scale import NUM_CLASSES
    from rknn_ray.client_step import RoundSpec
    from rknn_ray.shard_secrets import SeededShardSecrets
    from sealing.envelope import RoundContext

    encoder, qs, mech, server, source = _setup()
    enc = CountingEncoder(encoder)
    kept = ClientShardImpl(0, source(), SeededShardSecrets(0))

    def spec(r, e=enc, queries=qs.features, keep=True):
        return RoundSpec(RoundContext("job-emb", r), mech, e, queries, 1, NUM_CLASSES,
                         server.public_bytes(), more_rounds=keep)

    CountingEncoder.calls = 0
    _round(kept, spec(0), server, mech)
    assert CountingEncoder.calls == 3                     # 120 + 120 + 60 clients
    assert kept.get_timings()["embed"] > 0
    shifted = qs.features[::-1].copy()                    # round 1: other queries, same encoder
    got = _round(kept, spec(1, queries=shifted), server, mech)
    assert CountingEncoder.calls == 3 and "embed" not in kept.get_timings()
    fresh = ClientShardImpl(0, source(), SeededShardSecrets(0))
    want = _round(fresh, spec(1, queries=shifted), server, mech)
    assert CountingEncoder.calls == 6
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    # another encoder (or batching) embeds again; nothing is kept past EMBED_KEEP_MB
    _round(kept, spec(2, e=CountingEncoder(encoder, "other")), server, mech)
    assert CountingEncoder.calls == 9
    monkeypatch.setattr(client_shard, "EMBED_KEEP_MB", 0)
    small = ClientShardImpl(0, source(), SeededShardSecrets(0))
    for r in range(2):
        _round(small, spec(r), server, mech)
    assert CountingEncoder.calls == 15 and small._embedded == {}
    monkeypatch.setattr(client_shard, "EMBED_KEEP_MB", 256)
    once = ClientShardImpl(0, source(), SeededShardSecrets(0))    # a one-round job keeps none
    _round(once, spec(0, keep=False), server, mech)
    assert CountingEncoder.calls == 18 and once._embedded == {}

"""Encapsulations made ahead of a round (sealing.encapsulation): each is used once, bound to
its recipient and layer, never copied out of its process, and reports sealed with them open
and count exactly as reports sealed with fresh ones."""
from __future__ import annotations

import pickle
import threading

import numpy as np
import pytest

from sealing.encapsulation import EncapsulationPool, encapsulate, layer_info
from sealing.envelope import CONTEXT_LEN, HEADER_LEN, RoundContext, seal_batch
from server.keys import ServerKeyPair
from server.opening import ReportOpener

INFO = layer_info(bytes([1, 0]))


def _eph_pubs(sealed: np.ndarray) -> set[bytes]:
    return {bytes(row[CONTEXT_LEN:HEADER_LEN]) for row in sealed}


def test_each_encapsulation_is_handed_out_once_and_the_rest_are_made_fresh():
    pk = ServerKeyPair.generate().public_bytes()
    pool = EncapsulationPool()
    assert pool.fill(pk, INFO, 100) == 100 and pool.ready() == 100
    assert pool.fill(pk, INFO, 100) == 0                  # already ready: nothing more made
    a_pubs, a_keys = pool.take(pk, INFO, 60)
    b_pubs, b_keys = pool.take(pk, INFO, 60)              # 40 ready, 20 made fresh
    assert pool.stats() | {"fill_cpu_s": 0} == {"ready": 0, "made": 100, "used": 100,
                                                  "fresh": 20, "fill_cpu_s": 0}
    assert len(set(a_pubs + b_pubs)) == 120 and len(set(a_keys + b_keys)) == 120
    c_pubs, _ = pool.take(pk, INFO, 5)                    # an empty pool: all fresh, never a repeat
    assert not set(c_pubs) & set(a_pubs + b_pubs) and pool.stats()["fresh"] == 25


def test_a_pooled_key_is_the_one_the_recipient_derives():
    """The pool's (eph_pub, key) is what the holder of the private key derives: the same
    HKDF with both public keys as salt and the layer as info."""
    from sealing.envelope import derive_key
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey
    server = ServerKeyPair.generate()
    pubs, keys = encapsulate(server.public_bytes(), 3, INFO)
    for eph_pub, key in zip(pubs, keys):
        shared = server.exchange(X25519PublicKey.from_public_bytes(eph_pub))
        assert derive_key(shared, eph_pub, server.public_bytes(), INFO) == key


def test_encapsulations_are_bound_to_their_recipient_and_layer():
    a, b = (ServerKeyPair.generate().public_bytes() for _ in range(2))
    pool = EncapsulationPool()
    pool.fill(a, INFO, 10)
    pool.take(b, INFO, 4)                               # another recipient: none of a's
    pool.take(a, layer_info(bytes([1, 1])), 4)           # another layer: none either
    assert pool.stats()["used"] == 0 and pool.ready(a, INFO) == 10
    assert pool.drop(keep=[(b, INFO)]) == 10 and pool.ready() == 0


def test_the_pool_never_holds_more_than_its_cap():
    pk = ServerKeyPair.generate().public_bytes()
    pool = EncapsulationPool(max_ready=30)
    assert pool.fill(pk, INFO, 100) == 30
    assert pool.fill(pk, layer_info(bytes([1, 1])), 100) == 0
    with pytest.raises(ValueError, match="max_ready"):
        EncapsulationPool(max_ready=-1)


def test_the_pool_refuses_to_leave_its_process():
    """A pickled copy (a Ray argument, a checkpoint) could seal two reports under one key."""
    import cloudpickle
    pool = EncapsulationPool()
    for dumps in (pickle.dumps, cloudpickle.dumps):
        with pytest.raises(TypeError, match="never leaves its process"):
            dumps(pool)


def test_concurrent_takes_never_share_an_encapsulation():
    pk = ServerKeyPair.generate().public_bytes()
    pool = EncapsulationPool()
    pool.fill(pk, INFO, 600)
    got: list[list[bytes]] = [[] for _ in range(4)]

    def taker(i):
        for _ in range(10):
            got[i] += pool.take(pk, INFO, 20)[1]

    threads = [threading.Thread(target=taker, args=(i,)) for i in range(4)]
    filler = threading.Thread(target=pool.fill, args=(pk, INFO, 900))
    for t in threads + [filler]:
        t.start()
    for t in threads + [filler]:
        t.join()
    keys = [k for g in got for k in g]
    assert len(keys) == 800 and len(set(keys)) == 800


@pytest.mark.parametrize("layer", [0, 1])
def test_reports_sealed_from_the_pool_open_like_fresh_ones(layer):
    server = ServerKeyPair.generate()
    ctx = RoundContext("job-e", 3)
    payloads = np.random.default_rng(0).integers(0, 256, (50, 7), dtype=np.uint8)
    ids = np.arange(50 * 16, dtype=np.uint8).reshape(50, 16)
    pool = EncapsulationPool()
    info = layer_info(ctx.header_prefix(layer))
    pool.fill(server.public_bytes(), info, 50)
    ready = {bytes(p) for c in pool._ready[(server.public_bytes(), info)] for p in c[0]}
    pooled = seal_batch(server.public_bytes(), payloads, ctx, 9, layer=layer, report_ids=ids,
                        pool=pool)
    assert _eph_pubs(pooled) == ready and pool.ready() == 0
    fresh = seal_batch(server.public_bytes(), payloads, ctx, 9, layer=layer, report_ids=ids)
    assert pooled.shape == fresh.shape and not _eph_pubs(fresh) & ready
    if layer == 0:
        opener = ReportOpener(server, ctx, 7)
        for sealed in (pooled, fresh):
            out = opener.open_batch(sealed)
            assert np.array_equal(out.payloads, payloads) and sum(out.rejects.values()) == 0
        # the round is bound at sealing, not when the key was made: another round's opener refuses
        other = ReportOpener(server, RoundContext("job-e", 4), 7).open_batch(pooled)
        assert len(other.payloads) == 0 and other.rejects["wrong_round"] == 50


def test_a_shard_prepares_the_next_round_and_seals_it_from_the_pool():
    """After a round, prepare_keys makes as many encapsulations as the round sealed, for
    the round's recipients; the next round seals every report with them (none fresh, none
    twice) and the server opens all of them."""
    from actors.client_shard import ClientShardImpl
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.client_step import RoundSpec
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.shard_secrets import SeededShardSecrets
    from sealing.envelope import from_arrow

    n = 300
    encoder, qs, mech = _public_setup(n, 10, "shuffle", "collision", 1e-6)
    server = ServerKeyPair.generate()
    shard = ClientShardImpl(0, SyntheticClientsSource(0, n, NUM_CLASSES, DIM, SEED),
                            SeededShardSecrets(0))
    assert shard.prepare_keys()["made_now"] == 0            # before any round: nothing known
    seen: set[bytes] = set()
    for r in range(3):
        ctx = RoundContext("job-k", r)
        spec = RoundSpec(ctx, mech, encoder, qs.features, 1, NUM_CLASSES, server.public_bytes())
        if r:
            prep = shard.prepare_keys()
            assert prep["made_now"] == n and prep["ready"] == n and prep["cpu_s"] > 0
            ready = {bytes(p) for c in next(iter(shard._pool._ready.values())) for p in c[0]}
        fresh = shard._pool.stats()["fresh"]
        sealed = np.concatenate([from_arrow(b)[0] for b in shard.stream_reports(spec, 120)])
        pubs = _eph_pubs(sealed)
        assert len(pubs) == n and not pubs & seen
        seen |= pubs
        if r:
            assert pubs == ready and shard._pool.stats()["fresh"] == fresh
        out = ReportOpener(server, ctx, mech.message_size).open_batch(sealed)
        assert len(out.payloads) == n and sum(out.rejects.values()) == 0
    assert shard._pool.stats()["used"] == 2 * n
    # a new recipient key (another session's server) drops what was made for the old one
    shard._recipients = [(ServerKeyPair.generate().public_bytes(), INFO)]
    assert shard.prepare_keys(messages=5)["ready"] == 5
    with pytest.raises(ValueError, match="max_ready"):
        shard.prepare_keys(max_ready=-1)


@pytest.mark.slow
def test_a_prepared_session_releases_what_an_unprepared_one_does(ray_session):
    """Two seeded sessions, two shuffle rounds each: with the keys made between the rounds
    the second round seals only from the pool, and both releases are the same."""
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.config import load_config
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.job.session import ProtocolSession

    n = 400
    encoder, qs, mech = _public_setup(n, 10, "shuffle", "collision", 1e-6)
    counts = {}
    for precompute in (True, False):
        cfg = load_config(None, ["privacy.model=shuffle", "privacy.mechanism=collision",
                                 "privacy.delta=1e-6", "run.rng=seeded", "cluster.openers=0",
                                 "run.progress=false", f"cluster.precompute_keys={precompute}"])
        sources = [SyntheticClientsSource(0, n // 2, NUM_CLASSES, DIM, SEED),
                   SyntheticClientsSource(n // 2, n, NUM_CLASSES, DIM, SEED)]
        with ProtocolSession(cfg, sources, "job-prepared") as session:
            got = []
            for r in range(2):
                if r:
                    prep = session.prepare_next_round(wait=True)
                    if precompute:
                        assert prep["made_now"] == n and prep["ready"] == n
                    else:
                        assert prep is None
                got.append(session.run_round(r, mech, encoder, qs.features,
                                             PrivacyLedger()).counts)
            after = session.prepare_next_round(wait=True)
            if precompute:             # round 1 used every prepared key and made none itself
                assert after["used"] == n and after["fresh"] == n     # n: round 0's, unprepared
        counts[precompute] = got
    for r in range(2):
        assert np.array_equal(counts[True][r], counts[False][r])


def test_onion_layers_are_prepared_each_for_its_own_hop():
    """With a shuffler hop, a prepared round seals both layers from the pool (the server's
    and the hop's keys, each layer's own HKDF info); the hop peels and the server opens all."""
    from actors.client_shard import ClientShardImpl, round_recipients
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.client_step import RoundSpec
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.shard_secrets import SeededShardSecrets
    from sealing.envelope import from_arrow
    from shuffler.layers import LayerKeyPair, LayerPeeler

    n = 200
    encoder, qs, mech = _public_setup(n, 10, "shuffle", "collision", 1e-6)
    server, hop = ServerKeyPair.generate(), LayerKeyPair.generate(1)
    shard = ClientShardImpl(0, SyntheticClientsSource(0, n, NUM_CLASSES, DIM, SEED),
                            SeededShardSecrets(0))
    peeler = LayerPeeler(hop, RoundContext("job-o", 0))
    for r in range(2):
        ctx = RoundContext("job-o", r)
        spec = RoundSpec(ctx, mech, encoder, qs.features, 1, NUM_CLASSES, server.public_bytes(),
                         (hop.public_bytes(),))
        assert [k for k, _ in round_recipients(spec)] == [server.public_bytes(), hop.public_bytes()]
        if r:
            assert shard.prepare_keys()["made_now"] == 2 * n      # n per layer
        fresh = shard._pool.stats()["fresh"]
        sealed = np.concatenate([from_arrow(b)[0] for b in shard.stream_reports(spec, 64)])
        assert shard._pool.stats()["fresh"] == (2 * n if r == 0 else fresh)
        peeler.start_round(r)
        inner, kept, rejects = peeler.peel(sealed)
        assert len(kept) == n and sum(rejects.values()) == 0
        out = ReportOpener(server, ctx, mech.message_size).open_batch(inner)
        assert len(out.payloads) == n and sum(out.rejects.values()) == 0
    assert shard._pool.stats()["used"] == 2 * n and shard._pool.ready() == 0


@pytest.mark.slow
def test_a_shard_that_dies_between_rounds_only_loses_its_keys(ray_session):
    """Killed after round 0, a shard comes back with an empty pool: preparing the next round
    does not fail, the restarted shard makes its keys as it seals, the other shard uses its
    own, and the round counts every report."""
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.config import load_config
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.job.session import ProtocolSession

    n = 400
    encoder, qs, mech = _public_setup(n, 10, "central", "laplace", 0.0)
    cfg = load_config(None, ["privacy.model=central", "privacy.mechanism=laplace",
                             "privacy.delta=0", "cluster.openers=0", "run.progress=false"])
    sources = [SyntheticClientsSource(0, n // 2, NUM_CLASSES, DIM, SEED),
               SyntheticClientsSource(n // 2, n, NUM_CLASSES, DIM, SEED)]
    with ProtocolSession(cfg, sources, "job-prepared-kill") as session:
        session.run_round(0, mech, encoder, qs.features, PrivacyLedger())
        ray_session.kill(session.shards[0], no_restart=False)
        prep = session.prepare_next_round(wait=True)
        assert prep.get("made_now", 0) in (n // 2, n)   # the survivor's; the restarted one: none
        res = session.run_round(1, mech, encoder, qs.features, PrivacyLedger())
    assert res.messages == n and res.keys_made_ahead == n // 2

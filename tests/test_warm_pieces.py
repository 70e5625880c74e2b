"""The cuts that make small rounds fast change no report, no draw and no count."""
from __future__ import annotations

import math

import numpy as np
import pytest


def _spec(n: int, model: str = "central"):
    from benchmarks.scale import NUM_CLASSES, _public_setup
    from rknn_ray.client_step import RoundSpec
    from sealing.envelope import RoundContext
    from server.keys import ServerKeyPair

    mech_name = "laplace" if model == "central" else "collision"
    encoder, qs, mech = _public_setup(n, 10, model, mech_name, 0.0 if model == "central" else 1e-6)
    pk = ServerKeyPair.generate().public_bytes()
    return RoundSpec(RoundContext("job-p", 0), mech, encoder, qs.features, 1, NUM_CLASSES, pk)


@pytest.mark.parametrize("model", ["central", "shuffle"])
def test_tail_pieces_carry_the_batch_reports_unchanged(model):
    """A shard's last batch in pieces: the same senders, sequence numbers and report ids as
    the one batch it replaces (the randomness is drawn for the whole batch)."""
    from actors.client_shard import ClientShardImpl
    from benchmarks.scale import DIM, NUM_CLASSES, SEED
    from rknn_ray.client_step import client_step, piece_clients
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.shard_secrets import SeededShardSecrets
    from sealing.credentials import CredentialIssuer

    n, batch = 1100, 400
    spec = _spec(n, model)
    source = SyntheticClientsSource(0, n, NUM_CLASSES, DIM, SEED)
    cred = CredentialIssuer("job-p", b"k" * 32).shard_credential(0, 0, n)
    shard = ClientShardImpl(0, source, SeededShardSecrets(0), cred)
    streamed = list(shard.stream_reports(spec, batch))
    assert [len(np.unique(b.column("sender").to_numpy())) for b in streamed] == \
        piece_clients(n, batch)
    assert len(streamed) > 3                      # 400, 400, and the last 300 in 2 pieces
    whole = [client_step(spec, shard._secret, b, x, y, ids, None, cred)
             for b, (x, y, ids) in enumerate(source.batches(batch))]
    for col in ("sender", "seq"):
        got = np.concatenate([b.column(col).to_numpy() for b in streamed])
        want = np.concatenate([b.column(col).to_numpy() for b in whole])
        assert np.array_equal(np.sort(got), np.sort(want))


def test_open_chunks_share_a_batch_evenly():
    from actors.server import MIN_CHUNK, OPEN_CHUNK, open_chunk

    assert open_chunk(10_000, 2) == 5000                  # not 8192 + 1808
    for rows, p in [(20_000, 2), (100_000, 16), (777, 3), (1, 2)]:
        step = open_chunk(rows, p)
        tasks = math.ceil(rows / step)
        assert MIN_CHUNK <= step <= max(MIN_CHUNK, OPEN_CHUNK)
        assert rows <= MIN_CHUNK or tasks % p == 0 or step == MIN_CHUNK


def test_opener_side_of_every_mechanism_loads_neither_scipy_nor_dp_accounting():
    """Openers and shards unpickle mechanisms and decode reports; the accounting modules
    their objects refer to import scipy and dp_accounting lazily (eagerly, ~1-1.5 CPU s
    per process before its first report: 5.2 s -> 1.8 s for a cold 1e3 shuffle round)."""
    import pickle
    import subprocess
    import sys

    from rknn_ray.labeling.answers import RecordAnswers
    from rknn_ray.mechanisms import available, build
    from rknn_ray.mechanisms.base import MechanismParams
    from rknn_ray.rng import seeded_generator

    rng = np.random.default_rng(0)
    cases = []
    for model, names in available().items():
        for name in names:
            p = MechanismParams(20, 5, 1, eps=1.0, delta=1e-6 if model == "shuffle" else 0.0,
                                num_clients=2000)
            mech = build(model, name, p)
            ans = RecordAnswers(rng.integers(0, 20, (50, 1)), rng.integers(0, 5, (50, 1)),
                                np.arange(50), 20, 5)
            cases.append((mech, mech.randomize(ans, seeded_generator(1)).payloads))
    code = ("import pickle, sys\n"
            "for mech, payloads in pickle.loads(sys.stdin.buffer.read()):\n"
            "    mech.statistic(payloads[mech.well_formed(payloads)])\n"
            "print(sorted(m for m in ('scipy', 'dp_accounting') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(cases),
                         capture_output=True, check=True)
    assert len(cases) >= 9 and out.stdout.decode().strip() == "[]", out.stdout + out.stderr


def test_accounting_names_load_on_first_use():
    import rknn_ray.accounting as accounting
    from rknn_ray.accounting.ledger import PrivacyLedger

    assert accounting.PrivacyLedger is PrivacyLedger and "get_bound" in dir(accounting)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        accounting.nope

"""A warm round's fixed cost (issue 20 item 3): what every round repeats must not be
recomputed, the per-round stage CPU must be that round's, and benchmarks.scale measures
warm rounds (N one-record clients, 100 queries, a 1000-cell vote)."""
import pickle

import pytest

from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.accounting.guarantee import guarantee_of


def _counting(mech):
    """Wrap the mechanism's amplification bound so that each numerical evaluation is counted."""
    calls = []
    bound = mech.bound

    class Counting:
        def central_eps(self, eps0, n, delta):
            calls.append(n)
            return bound.central_eps(eps0, n, delta)

    mech.bound = Counting()
    return calls


def test_shuffle_calibration_is_computed_once_per_mechanism():
    mech = build("shuffle", "collision", MechanismParams(10, 10, 1, 1.0, delta=1e-6,
                                                          num_clients=20000))
    calls = _counting(mech)
    floor = mech.min_senders()
    first = len(calls)
    assert first > 0
    # what ProtocolSession asks every round: the floor, describe(), the cost and guarantee
    for _ in range(3):
        assert mech.min_senders() == floor
        assert mech.describe()["min_senders"] == floor
        g = guarantee_of(mech, 20000, mech.round_event(20000, 20000), opened=20000)
        assert guarantee_of(mech, 20000).eps == g.eps
    assert len(calls) == first                # n = 20000 too was evaluated by the floor
    assert mech.central_eps(floor) <= 1.0 * (1 + 1e-9) < mech.central_eps(floor - 1)
    fresh = build("shuffle", "collision", MechanismParams(10, 10, 1, 1.0, delta=1e-6,
                                                           num_clients=20000))
    fresh.min_senders()
    copy = pickle.loads(pickle.dumps(fresh))  # shipped to the actors with its memo: same answers
    assert copy.min_senders() == floor and copy.central_eps(floor) == mech.central_eps(floor)


@pytest.mark.slow
def test_warm_round_benchmark_reports_per_round_costs(ray_session):
    from benchmarks.scale import run_warm
    res = run_warm(300, rounds=2, models=("central",), prepare=(False, True))
    r, p = res["models"]["central"], res["models"]["central+prepared"]
    # the prepared session: keys made before each warm round, outside its window; the floor
    # left in the round is every part but the ones made ahead
    assert p["prepared"] and not r["prepared"] and len(p["prepare_s"]) == 2
    assert [st["made_now"] for st in p["prepare_stats"]] == [300, 300]
    assert p["prepare_stats"][1]["used"] == 300 and p["prepare_stats"][1]["fresh"] == 300
    assert p["floor_cpu_s"] > 0 and p["floor_ahead_cpu_s"] > 0 and r["floor_kept_cpu_s"] > 0
    assert res["cells"] == 1000 and len(r["warm_s"]) == 2 and r["messages"] == 300
    assert r["floor_cpu_s"] > 0 and len(r["round_cpu_s"]) == 2
    lo, hi = r["floor_spread_cpu_s"]             # sampled after each warm round, median used
    assert r["floor_samples"] == 2 and lo <= r["floor_cpu_s"] * (1 + 1e-9) <= hi * (1 + 1e-9)
    assert abs(r["fixed_s"] - (r["warm_median_s"] - r["floor_wall_s"])) < 1e-9
    assert all(st["shards_seal_cpu"] > 0 for st in r["stages_s"])


def test_shard_stage_timings_are_the_rounds_own():
    """ProtocolSession reports a shard's get_timings() as the round's stage CPU: a second
    round must not carry the first round's seconds."""
    from actors.client_shard import ClientShardImpl
    from benchmarks.scale import DIM, NUM_CLASSES, SEED, _public_setup
    from rknn_ray.client_step import RoundSpec
    from rknn_ray.data.sources import SyntheticClientsSource
    from rknn_ray.shard_secrets import SeededShardSecrets
    from sealing.envelope import RoundContext
    from server.keys import ServerKeyPair

    encoder, qs, mech = _public_setup(300, 10, "central", "laplace", 0.0)
    shard = ClientShardImpl(0, SyntheticClientsSource(0, 300, NUM_CLASSES, DIM, SEED),
                            SeededShardSecrets(0))
    pk = ServerKeyPair.generate().public_bytes()
    for r in range(2):
        spec = RoundSpec(RoundContext("job-t", r), mech, encoder, qs.features, 1, NUM_CLASSES, pk)
        if r == 1:
            shard.timings["seal"] = 1e6           # what a cumulative clock would still show
        assert sum(b.num_rows for b in shard.stream_reports(spec, 100)) == 300
        assert 0 < shard.get_timings()["seal"] < 1e6

"""The server-side split of every mechanism: an additive statistic, then one finalize.

The server opens batches in several processes and adds their statistics in whatever
order they finish, so for every registered mechanism (and the option variants that
change the report format) the sum over any split of the reports must be the one-shot
statistic -- bit for bit where the reports are integers -- and finalize of that sum
must be exactly what estimate() releases. Pure library, no Ray."""
import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, available, build

S, C, K = 6, 3, 2
N = 1500
VARIANTS = [(model, name, {}) for model, names in available().items() for name in names] + [
    ("central", "laplace", {"noise": "continuous"}),
    ("local", "laplace", {"multi_record": "normalize"}),
    ("local", "separation", {"separation_split": 0.3}),
]
FLOAT_STATISTIC = {("local", "laplace", "normalize")}     # float32 reports: float64 sums


def variant_id(v):
    model, name, opts = v
    return "-".join([model, name, *map(str, opts.values())])


def answers(n_clients: int, seed: int = 0, records_per_client: int = 1) -> RecordAnswers:
    rng = np.random.default_rng(seed)
    m = n_clients * records_per_client
    neighbors = np.argsort(rng.random((m, S)), axis=1)[:, :K]
    return RecordAnswers(neighbors, rng.integers(0, C, (m, 1)),
                         np.repeat(np.arange(n_clients), records_per_client), S, C)


def mechanism(model, name, opts, records_per_client=1):
    return build(model, name, MechanismParams(S, C, K, 1.0, delta=1e-6, num_clients=N,
                                              max_records_per_client=records_per_client,
                                              options=dict(opts)))


def is_exact(model, name, opts) -> bool:
    return (model, name, opts.get("multi_record")) not in FLOAT_STATISTIC


@pytest.fixture(scope="module", params=VARIANTS, ids=variant_id)
def round_of(request):
    model, name, opts = request.param
    records = 2 if opts.get("multi_record") == "normalize" else 1
    mech = mechanism(model, name, opts, records)
    msgs = mech.randomize(answers(N, records_per_client=records), np.random.default_rng(5))
    assert mech.well_formed(msgs.payloads).all()
    return model, name, opts, mech, msgs


def test_statistic_is_a_flat_vector_of_the_declared_size_and_type(round_of):
    model, name, opts, mech, msgs = round_of
    stat = mech.statistic(msgs.payloads)
    assert stat.shape == (mech.statistic_size,)
    assert stat.dtype == (np.int64 if is_exact(model, name, opts) else np.float64)
    empty = mech.statistic(msgs.payloads[:0])                 # an accumulator starts from zeros
    np.testing.assert_array_equal(empty, np.zeros(mech.statistic_size))


def test_any_split_and_order_adds_up_to_the_one_shot_statistic(round_of):
    model, name, opts, mech, msgs = round_of
    whole = mech.statistic(msgs.payloads)
    rng = np.random.default_rng(11)
    for trial in range(4):
        order = rng.permutation(len(msgs))
        cuts = np.sort(rng.choice(np.arange(1, len(msgs)), size=1 + 3 * trial, replace=False))
        parts = [mech.statistic(msgs.payloads[idx]) for idx in np.split(order, cuts)]
        total = np.zeros(mech.statistic_size, whole.dtype)
        for i in rng.permutation(len(parts)):                # arrival order is arbitrary too
            total = total + parts[i]
        if is_exact(model, name, opts):
            np.testing.assert_array_equal(total, whole)
        else:
            np.testing.assert_allclose(total, whole, rtol=1e-9, atol=1e-6)


def test_finalize_of_the_sum_is_the_estimate(round_of):
    model, name, opts, mech, msgs = round_of
    m = len(msgs)
    stat = mech.statistic(msgs.payloads[: m // 3]) + mech.statistic(msgs.payloads[m // 3:])
    released = mech.finalize(stat, m, np.random.default_rng(9))
    assert released.shape == (S, C) and released.dtype == np.float64
    want = mech.estimate(msgs.payloads, N, np.random.default_rng(9))
    if is_exact(model, name, opts):
        np.testing.assert_array_equal(released, want)
    else:
        np.testing.assert_allclose(released, want, rtol=1e-9, atol=1e-6)


def test_estimators_debias_with_the_reports_given_not_an_assumed_n(round_of):
    model, name, opts, mech, msgs = round_of
    half = msgs.payloads[: len(msgs) // 2]
    a = mech.estimate(half, N, np.random.default_rng(3))      # the caller's n is not used
    b = mech.estimate(half, len(half), np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("v", [v for v in VARIANTS if v[0] in ("local", "shuffle")
                               and v[1] != "multi"], ids=variant_id)
def test_finalize_equals_the_sum_of_per_report_estimates(v):
    """The statistic route and the per-report estimator (client_estimates) agree."""
    model, name, opts = v
    records = 2 if opts.get("multi_record") == "normalize" else 1
    mech = mechanism(model, name, opts, records)
    msgs = mech.randomize(answers(300, seed=2, records_per_client=records),
                          np.random.default_rng(4))
    per_report = mech.client_estimates(msgs.payloads).sum(axis=0)
    np.testing.assert_allclose(mech.finalize(mech.statistic(msgs.payloads), len(msgs)),
                               per_report, rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("v", [v for v in VARIANTS if v[0] in ("local", "shuffle")
                               and v[1] != "multi"], ids=variant_id)
def test_decoding_one_report_at_a_time_gives_the_same_statistic(v, monkeypatch):
    """Hash decoding works over cache-sized chunks of reports (DECODE_CHUNK_ELEMENTS):
    one report per chunk must give the statistic of the whole batch, bit for bit."""
    from rknn_ray.mechanisms import collision, separation
    model, name, opts = v
    records = 2 if opts.get("multi_record") == "normalize" else 1
    mech = mechanism(model, name, opts, records)
    msgs = mech.randomize(answers(300, seed=2, records_per_client=records),
                          np.random.default_rng(4))
    whole = mech.statistic(msgs.payloads)
    for module in (collision, separation):
        monkeypatch.setattr(module, "DECODE_CHUNK_ELEMENTS", 1)
    np.testing.assert_array_equal(mech.statistic(msgs.payloads), whole)


def test_a_statistic_of_the_wrong_shape_is_refused():
    mech = mechanism("local", "concatenation", {})
    with pytest.raises(ValueError, match="statistic has shape"):
        mech.finalize(np.zeros(S * C), 10)


def test_local_and_shuffle_estimates_are_unbiased():
    """Average over independent rounds: the debiased estimate centres on the true counts."""
    ans = answers(400, seed=7)
    truth = ans.counts()
    for model, name in [("local", "rr"), ("local", "collision"), ("local", "separation"),
                        ("local", "concatenation"), ("shuffle", "rr")]:
        mech = mechanism(model, name, {})
        rng = np.random.default_rng(13)
        reps = 200
        total = np.zeros(mech.statistic_size, np.int64)
        for _ in range(reps):
            total += mech.statistic(mech.randomize(ans, rng).payloads)
        mean = mech.finalize(total, reps * ans.num_clients) / reps   # sum of reps rounds
        sd = np.sqrt(mech.cell_variance(ans) / reps)
        assert np.all(np.abs(mean - truth) <= 5 * sd + 1e-9), (model, name)

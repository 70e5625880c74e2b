"""Central mechanism: exact encoding round trip, sensitivity, noise, guarantee."""
import itertools
import math

import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.central import central_error_bound
from rknn_ray.mechanisms.noise import discrete_laplace_pmf, discrete_laplace_variance
from rknn_ray.rng import seeded_generator
from rknn_ray.accounting.guarantee import guarantee_of


def random_answers(rng, m=500, s=15, c=4, k=2, r=1, clients=40):
    nb = np.argsort(rng.random((m, s)), axis=1)[:, :k]
    lab = np.argsort(rng.random((m, c)), axis=1)[:, :r]
    cid = np.sort(rng.integers(0, clients, m))
    return RecordAnswers(nb, lab, cid, s, c)


def mech_for(ans, eps=1.0, **opt):
    _, _, cnt = ans.clients()
    return build("central", "laplace", MechanismParams(
        ans.num_queries, ans.num_classes, ans.k, eps, r=ans.r,
        max_records_per_client=int(cnt.max()), options=opt))


def test_encoding_round_trip_is_exact():
    rng = np.random.default_rng(0)
    for r in (1, 2):
        ans = random_answers(rng, r=r)
        mech = mech_for(ans)
        batch = mech.randomize(ans, rng)
        assert batch.payloads.shape == (ans.num_clients, mech.message_size)
        assert mech.well_formed(batch.payloads).all()
        np.testing.assert_array_equal(mech.exact_sum(batch.payloads), ans.counts())


def test_counts_sum_and_sensitivity_is_2kr():
    rng = np.random.default_rng(1)
    ans = random_answers(rng, k=3, r=2)
    assert ans.counts().sum() == ans.num_records * 3 * 2
    # replace one record: L1 change <= 2kr, and it reaches 2kr for disjoint cells
    nb2, lab2 = ans.neighbors.copy(), ans.labels.copy()
    nb2[0] = [q for q in range(ans.num_queries) if q not in ans.neighbors[0]][:3]
    other = RecordAnswers(nb2, lab2, ans.client_ids, ans.num_queries, ans.num_classes)
    assert np.abs(other.counts() - ans.counts()).sum() == 2 * 3 * 2


def test_exact_likelihood_ratio_on_small_domain():
    """Enumerate neighbouring count vectors on a tiny domain: the worst-case ratio of
    the output pmf (product of per-cell discrete Laplace) equals e^eps exactly."""
    eps, k = 0.9, 1
    s, c = 2, 2
    scale = 2 * k / eps
    base = np.array([3, 1, 0, 2])               # counts of the other records (flattened)
    outputs = np.array(list(itertools.product(range(-6, 10), repeat=4)))
    worst = 0.0
    cells = range(s * c)
    for a, b in itertools.product(cells, cells):   # record at cell a replaced by one at b
        x = base.copy(); x[a] += 1
        y = base.copy(); y[b] += 1
        px = np.prod(discrete_laplace_pmf(outputs - x, scale), axis=1)
        py = np.prod(discrete_laplace_pmf(outputs - y, scale), axis=1)
        worst = max(worst, float(np.max(px / py)))
    assert worst <= math.exp(eps) * (1 + 1e-9)
    assert worst == pytest.approx(math.exp(eps))


def test_noise_unbiased_with_theoretical_variance():
    rng = np.random.default_rng(2)
    ans = random_answers(rng, m=200, s=6, c=3)
    mech = mech_for(ans, eps=2.0)
    payloads = mech.randomize(ans, rng).payloads
    draws = np.stack([mech.estimate(payloads, ans.num_clients, seeded_generator(i))
                      for i in range(300)])
    err = draws - ans.counts()
    var = discrete_laplace_variance(mech.scale)
    assert np.all(np.equal(np.mod(draws, 1), 0))   # integer support
    assert abs(err.mean()) < 6 * math.sqrt(var / err.size)
    assert err.var() == pytest.approx(var, rel=0.12)


def test_continuous_option_and_guarantee():
    rng = np.random.default_rng(3)
    ans = random_answers(rng)
    mech = mech_for(ans, eps=0.5, noise="continuous")
    est = mech.estimate(mech.randomize(ans, rng).payloads, ans.num_clients, seeded_generator(0))
    assert not np.all(np.equal(np.mod(est, 1), 0))
    g = guarantee_of(mech)
    assert (g.eps, g.delta, g.model, g.unit, g.neighbour) == (0.5, 0.0, "central", "record",
                                                               "replace-one")


def test_error_bound_prop1_and_empirical_coverage():
    assert central_error_bound(4.0, 10, 0.05) == pytest.approx(4.0 * math.log(10 / 0.05))
    rng = np.random.default_rng(4)
    ans = random_answers(rng, m=300, s=50, c=10, k=1)
    mech = mech_for(ans, eps=1.0)
    eta = mech.error_bound(0.1)
    est = mech.estimate(mech.randomize(ans, rng).payloads, 1, seeded_generator(7))
    per_bucket = np.abs(est - ans.counts()).max(axis=1)
    assert np.mean(per_bucket >= eta) <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / 50)


def test_malformed_messages_flagged():
    rng = np.random.default_rng(5)
    ans = random_answers(rng)
    mech = mech_for(ans)
    p = mech.randomize(ans, rng).payloads.copy()
    words = p.view("<u4")
    words[0, 0] = 10**6            # nnz beyond slots
    words[1, 1] = 10**6            # cell index out of range
    words[2, 2] = 10**6            # count larger than a client can hold
    ok = mech.well_formed(p)
    assert not ok[:3].any() and ok[3:].all()


def test_bad_parameters():
    with pytest.raises(ValueError, match="eps"):
        build("central", "laplace", MechanismParams(4, 2, 1, 0.0))
    with pytest.raises(ValueError, match="noise"):
        build("central", "laplace", MechanismParams(4, 2, 1, 1.0, options={"noise": "gauss"}))
    with pytest.raises(ValueError, match="unknown mechanism"):
        build("central", "nope", MechanismParams(4, 2, 1, 1.0))


@pytest.mark.parametrize("noise", ["discrete", "continuous"])
def test_run_summary_bound_follows_the_mechanisms_noise(noise):
    """The bound drawn in summary.png is the mechanism's own (it was the discrete one even
    under privacy.noise=continuous)."""
    from rknn_ray.job.finish import release_error_bound
    mech = build("central", "laplace", MechanismParams(
        num_queries=20, num_classes=10, k=2, r=1, eps=0.7, delta=0.0, num_clients=50,
        max_records_per_client=1, options={"noise": noise}))
    assert release_error_bound(mech) == mech.error_bound(0.05)

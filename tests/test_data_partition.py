"""Partitioners: IID balance (vs. the closed-form sampling skew), Dirichlet skew, one per client."""

import numpy as np
import pytest

from rknn_ray.data import client_offsets, label_skew, order_by_client, partition
from rknn_ray.errors import ConfigError, DataError

LABELS = np.random.default_rng(0).integers(0, 10, 100_000)


def test_iid_balanced_and_matches_sampling_theory():
    n = 100
    ids = partition(LABELS, n, "iid", seed=1)
    sizes = np.bincount(ids, minlength=n)
    assert sizes.min() == 1000 and sizes.max() == 1000
    # A client's label mix is a sample of s records without replacement; for large s the
    # expected TV distance from the global mix is 0.5 * sum_c sqrt(2 p_c (1 - p_c) / (pi s)) * fpc.
    p = np.bincount(LABELS) / len(LABELS)
    s, fpc = 1000, np.sqrt(1 - 1000 / len(LABELS))
    expected = 0.5 * np.sum(np.sqrt(2 * p * (1 - p) / (np.pi * s))) * fpc      # ~0.0377
    assert abs(label_skew(LABELS, ids, 10) - expected) < 0.05 * expected
    np.testing.assert_array_equal(ids, partition(LABELS, n, "iid", seed=1))
    assert not np.array_equal(ids, partition(LABELS, n, "iid", seed=2))
    uneven = np.bincount(partition(LABELS[:1003], 10, "iid"), minlength=10)
    assert sorted(uneven.tolist()) == [100] * 7 + [101] * 3


def test_dirichlet_skew_grows_as_alpha_shrinks():
    skews = []
    for alpha in (100.0, 1.0, 0.1, 0.01):
        ids = partition(LABELS, 50, "dirichlet", alpha=alpha, seed=3)
        assert np.bincount(ids, minlength=50).min() >= 1            # every client non-empty
        assert ids.min() >= 0 and ids.max() < 50 and len(ids) == len(LABELS)
        skews.append(label_skew(LABELS, ids, 10))
    assert all(a < b for a, b in zip(skews, skews[1:])), skews
    assert skews[0] < 0.05                    # alpha=100: close to IID
    assert skews[-1] > 0.8                    # alpha=0.01: clients hold ~one class (max 0.9)
    np.testing.assert_array_equal(partition(LABELS, 50, "dirichlet", alpha=0.1, seed=3),
                                  partition(LABELS, 50, "dirichlet", alpha=0.1, seed=3))


def test_dirichlet_tiny_alpha_no_underflow_and_fills_empty_clients():
    ids = partition(LABELS[:2000], 1000, "dirichlet", alpha=1e-4, seed=0)
    sizes = np.bincount(ids, minlength=1000)
    assert sizes.min() == 1 and sizes.sum() == 2000
    raw = partition(LABELS[:2000], 1000, "dirichlet", alpha=1e-4, seed=0, ensure_nonempty=False)
    assert (np.bincount(raw, minlength=1000) == 0).sum() > 900    # what the fill repaired


def test_one_per_client():
    ids = partition(LABELS[:500], None, "one_per_client", seed=4)
    assert sorted(ids.tolist()) == list(range(500))
    np.testing.assert_array_equal(ids, partition(LABELS[:500], 500, "one_per_client", seed=4))
    with pytest.raises(ConfigError,
                       match="num_clients == number of records \\(500\\).*set num_clients to 500"):
        partition(LABELS[:500], 100, "one_per_client")


def test_order_by_client_groups_records():
    ids = partition(LABELS[:1000], 7, "dirichlet", alpha=0.3, seed=5)
    order = order_by_client(ids)
    grouped = ids[order]
    assert np.all(np.diff(grouped) >= 0)
    off = client_offsets(ids, 7)
    assert off[0] == 0 and off[-1] == 1000
    for c in range(7):
        seg = order[off[c]:off[c + 1]]
        assert np.all(ids[seg] == c) and np.all(np.diff(seg) > 0)   # stable within a client


def test_bad_inputs():
    with pytest.raises(ConfigError, match="2000 clients but only 1000 records.*num_clients <= 1000"):
        partition(LABELS[:1000], 2000, "iid")
    with pytest.raises(ConfigError, match="unknown scheme"):
        partition(LABELS, 10, "pathological")
    with pytest.raises(ConfigError, match="alpha"):
        partition(LABELS, 10, "dirichlet", alpha=0.0)
    with pytest.raises(ConfigError, match="positive integer"):
        partition(LABELS, 0, "iid")
    with pytest.raises(DataError, match="1-D integer"):
        partition(LABELS.astype(float), 10)
    with pytest.raises(DataError, match="no records"):
        partition(LABELS[:0], 1)


def test_million_records_and_clients():
    """(Its speed is a bound in benchmarks.cost_bounds, not asserted here.)"""
    y = np.random.default_rng(9).integers(0, 10, 1_000_000)
    for scheme, n in (("iid", 1_000_000), ("dirichlet", 1_000_000), ("dirichlet", 10_000),
                      ("one_per_client", None)):
        ids = partition(y, n, scheme, alpha=0.5, seed=0)
        order = order_by_client(ids)
        assert np.bincount(ids, minlength=n or 1_000_000).min() >= 1
        assert np.all(np.diff(ids[order]) >= 0)


def test_dirichlet_class_shares_follow_beta_marginal():
    # With n clients, client 0's share of one class is Beta(alpha, (n-1) alpha): check the
    # log-space gamma sampler against that law over 400 classes (2,000 records each).
    from scipy import stats
    alpha, n, classes, per = 0.5, 4, 400, 2000
    y = np.repeat(np.arange(classes), per)
    ids = partition(y, n, "dirichlet", alpha=alpha, seed=11, ensure_nonempty=False)
    share = np.bincount(y[ids == 0], minlength=classes) / per
    law = stats.beta(alpha, (n - 1) * alpha)                 # mean 0.25, variance 0.0625
    assert stats.kstest(share, law.cdf).pvalue > 1e-3
    assert abs(share.mean() - law.mean()) < 4 * law.std() / np.sqrt(classes)
    assert abs(share.var() / law.var() - 1) < 0.25

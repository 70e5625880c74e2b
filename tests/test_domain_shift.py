"""The domain-shift benchmark's public-set transforms (benchmarks.domain_shift): no Ray, no
student. Label shift must give the drawn Dirichlet proportions, reproducibly; covariate shift
must keep images in [0, 1] and actually lower their contrast."""
import numpy as np
import pytest

from benchmarks.domain_shift import covariate_shift, degree_profile, dirichlet_subsample


def _labels(per_class=500, classes=10):
    return np.repeat(np.arange(classes), per_class)[np.random.default_rng(1).permutation(
        per_class * classes)]


def test_dirichlet_subsample_follows_its_proportions():
    y = _labels()
    idx, p = dirichlet_subsample(y, 0.3, seed=0, num_classes=10)
    assert p.shape == (10,) and np.isclose(p.sum(), 1.0)
    assert np.unique(idx).size == idx.size and idx.min() >= 0 and idx.max() < y.size
    got = np.bincount(y[idx], minlength=10)
    total = int(np.floor(np.min(500 / p[p > 0])))
    assert np.all(np.abs(got - p * total) < 1.0)        # floor of each class's share
    assert got.max() >= 499                              # the largest share uses its whole class
    # skewed: Dirichlet(0.3) over 10 classes is far from uniform
    assert p.max() > 2 * (1 / 10) and got.min() < 0.5 * got.max()


def test_dirichlet_subsample_is_deterministic_by_seed():
    y = _labels()
    a, pa = dirichlet_subsample(y, 0.3, seed=7, num_classes=10)
    b, pb = dirichlet_subsample(y, 0.3, seed=7, num_classes=10)
    c, pc = dirichlet_subsample(y, 0.3, seed=8, num_classes=10)
    assert np.array_equal(a, b) and np.array_equal(pa, pb)
    assert not np.array_equal(pa, pc)
    with pytest.raises(ValueError, match="alpha"):
        dirichlet_subsample(y, 0.0, seed=0)


def test_covariate_shift_range_contrast_and_seed():
    x = np.random.default_rng(2).random((20, 1, 28, 28), dtype=np.float32)
    low = covariate_shift(x, contrast=0.5, noise=0.0, seed=0)
    assert low.dtype == np.float32 and low.shape == x.shape
    assert np.allclose(low.std(axis=(1, 2, 3)), 0.5 * x.std(axis=(1, 2, 3)), rtol=1e-4)
    assert np.allclose(low.mean(axis=(1, 2, 3)), x.mean(axis=(1, 2, 3)), atol=1e-5)
    noisy = covariate_shift(x, contrast=0.5, noise=0.3, seed=3)
    assert noisy.min() >= 0.0 and noisy.max() <= 1.0
    assert (noisy == 0.0).any() and (noisy == 1.0).any()          # clipped, not rescaled
    assert np.array_equal(noisy, covariate_shift(x, 0.5, 0.3, seed=3))
    assert not np.array_equal(noisy, covariate_shift(x, 0.5, 0.3, seed=4))
    assert np.allclose(covariate_shift(x, 1.0, 0.0, seed=0), x, atol=1e-6)   # identity
    with pytest.raises(ValueError, match="contrast"):
        covariate_shift(x, contrast=1.5, noise=0.0, seed=0)


def test_degree_profile_reads_query_totals():
    exact = np.array([[3, 1], [0, 0], [10, 0], [2, 2], [5, 5]])
    d = degree_profile(exact)
    assert (d["min"], d["median"], d["max"]) == (0, 4.0, 10)
    assert d["p10"] == pytest.approx(np.percentile([4, 0, 10, 4, 10], 10))
    assert d["simulation_diagnostic_private"] is True

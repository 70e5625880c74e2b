"""A Gaussian-mixture source for scale tests (any number of records, known Bayes error).

Class ``c`` has mean ``mu_c`` and identity covariance. When ``num_classes <= dim``
the means are ``separation / sqrt(2)`` times orthonormal vectors, so every pair of
class means is exactly ``separation`` apart (in noise standard deviations) and the
two-class Bayes error is ``Phi(-separation / 2)``. With more classes than
dimensions the means are random directions of the same norm (distances then only
approximately ``separation``).
"""
from __future__ import annotations

import numpy as np

from rknn_ray.errors import ConfigError
from rknn_ray.data.dataset import Dataset, validate_features
from rknn_ray.rng import seeded_generator


def class_means(num_classes: int, dim: int, separation: float, seed: int) -> np.ndarray:
    """(num_classes, dim) float64 means, pairwise ``separation`` apart when num_classes <= dim."""
    rng = seeded_generator(seed)
    g = rng.standard_normal((dim, num_classes))
    if num_classes <= dim:
        q, _ = np.linalg.qr(g)               # orthonormal columns
        directions = q.T
    else:
        directions = (g / np.linalg.norm(g, axis=0)).T
    return directions * (separation / np.sqrt(2.0))


def footprint_bytes(num_samples: int, num_classes: int, dim: int) -> int:
    """Bytes a job holds for a mixture at its peak: the float32 features about three times
    (the pool, then its private / public / evaluation parts and their embeddings), int64
    labels, and the float64 means with their QR (four ``dim x num_classes`` matrices)."""
    return 3 * num_samples * (4 * dim + 8) + 4 * 8 * dim * num_classes


def gaussian_mixture(num_samples: int = 10_000, num_classes: int = 10, dim: int = 32,
                     seed: int = 0, separation: float = 4.0) -> Dataset:
    """A balanced mixture as one pool (``test_x`` empty; split with rule 'stratified').

    Labels are ``arange(N) % C`` shuffled (class sizes differ by at most one);
    features are float32 ``mu_y + N(0, I)``, generated directly in float32.
    """
    for key, val, low in (("num_samples", num_samples, 1), ("num_classes", num_classes, 2),
                          ("dim", dim, 1)):
        if int(val) != val or val < low:
            raise ConfigError(f"synthetic.{key}", f"must be an integer >= {low}, got {val!r}",
                              f"set {key} to an integer >= {low}")
    if not np.isfinite(separation) or separation < 0:
        raise ConfigError("synthetic.separation", f"must be finite and >= 0, got {separation!r}",
                          "set separation to the wanted distance between class means (e.g. 4.0)")
    n, c, d = int(num_samples), int(num_classes), int(dim)
    means = class_means(c, d, float(separation), seed).astype(np.float32)
    rng = seeded_generator(seed + 1)
    y = rng.permutation(np.arange(n, dtype=np.int64) % c)
    x = rng.standard_normal((n, d), dtype=np.float32)
    x += means[y]
    validate_features(x, y, c, "synthetic")
    return Dataset("synthetic", x, y, x[:0], y[:0], c, (d,), tuple(map(str, range(c))),
                   f"gaussian_mixture(num_samples={n}, num_classes={c}, dim={d}, "
                   f"seed={seed}, separation={separation})")

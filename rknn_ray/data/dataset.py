"""The ``Dataset`` every stage consumes and its input checks.

Convention: images are float32 of shape (N, C, H, W) with values in [0, 1]
(torch layout; C = 1 for gray), labels int64 in ``[0, num_classes)``. Feature
data sets (the synthetic mixture) are float32 (N, dim) with ``image_shape = (dim,)``.
Its own module so that the file readers and the generators (rknn_ray.data.synthetic)
share it without importing each other.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rknn_ray.errors import DataError


@dataclass
class Dataset:
    """A labelled data set as read from disk (before the private/public/eval split)."""
    name: str
    train_x: np.ndarray        # (N, C, H, W) float32 in [0, 1], or (N, dim) features
    train_y: np.ndarray        # (N,) int64
    test_x: np.ndarray         # may hold 0 rows (digits, synthetic: one pool, split later)
    test_y: np.ndarray
    num_classes: int
    image_shape: tuple         # (C, H, W) or (dim,)
    class_names: tuple | None = None
    source: str = ""           # where it came from (files / generator), for reports

    @property
    def num_records(self) -> int:
        return int(len(self.train_y) + len(self.test_y))


def validate_features(x: np.ndarray, y: np.ndarray, num_classes: int, what: str = "data") -> None:
    """Raise DataError on shape mismatch, non-finite features or labels out of range.

    Cheap (one pass) and meant to run before any expensive stage; messages name the
    number of offending rows and the first offending index.
    """
    x, y = np.asarray(x), np.asarray(y)
    if y.ndim != 1:
        raise DataError(f"{what}: labels must be 1-D (one label per record), got shape {y.shape}. "
                        "Fix: pass integer class indices, not one-hot rows.")
    if x.ndim < 2:
        raise DataError(f"{what}: features must have shape (N, ...) with N records, got {x.shape}. "
                        "Fix: reshape to (N, dim) or (N, C, H, W).")
    if len(x) != len(y):
        raise DataError(f"{what}: {len(x)} feature rows but {len(y)} labels. "
                        "Fix: pass one label per record.")
    if len(x) == 0:
        raise DataError(f"{what}: no records at all (an empty file or split). "
                        "Fix: check the data files under data.data_root, or the split rule.")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{what}: labels must be integers, got dtype {y.dtype}. "
                        "Fix: convert class labels to int64 indices 0..num_classes-1.")
    bad = np.flatnonzero((y < 0) | (y >= num_classes))
    if bad.size:
        raise DataError(f"{what}: {bad.size} labels outside 0..{num_classes - 1} "
                        f"(first at index {bad[0]}: {y[bad[0]]}). "
                        f"Fix: map labels to 0..{num_classes - 1} or set num_classes correctly.")
    if np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.complexfloating):
        rows_ok = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
        if not rows_ok.all():
            bad = np.flatnonzero(~rows_ok)
            raise DataError(f"{what}: {bad.size} records have NaN or infinite features "
                            f"(first at index {bad[0]}). Fix: drop or impute those records.")
    elif not (np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
        raise DataError(f"{what}: features must be numeric, got dtype {x.dtype}")

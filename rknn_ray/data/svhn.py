"""SVHN cropped digits (format 2): ``{train,test,extra}_32x32.mat``.

Each file is a MATLAB file with ``X`` of shape (32, 32, 3, N) uint8 and ``y`` of
shape (N, 1) holding 1..10, where 10 stands for the digit 0. We map 10 -> 0 so
labels are the digits themselves, and any other value is an error, not a guess.
"""
from __future__ import annotations

import os

import numpy as np
import scipy.io

from rknn_ray.errors import DataError

FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat", "extra": "extra_32x32.mat"}
FOLDER = "svhn"


def read_mat(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and digit labels (N,) int64 of one .mat file."""
    try:
        mat = scipy.io.loadmat(path, variable_names=["X", "y"])
    except (ValueError, OSError, TypeError, NotImplementedError) as exc:
        raise DataError(f"{path}: cannot read as a MATLAB file ({exc}). "
                        "Fix: use the original SVHN format-2 *_32x32.mat files.") from exc
    if "X" not in mat or "y" not in mat:
        raise DataError(f"{path}: lacks variable X or y. Fix: use the SVHN format-2 files.")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise DataError(f"{path}: X must have shape (32, 32, 3, N), got {x.shape}")
    if x.shape[3] != len(y):
        raise DataError(f"{path}: X holds {x.shape[3]} images but y holds {len(y)} labels")
    bad = np.flatnonzero((y < 1) | (y > 10))
    if bad.size:
        raise DataError(f"{path}: {bad.size} labels outside 1..10 (first at index {bad[0]}: "
                        f"{y[bad[0]]}); SVHN uses 1..10 with 10 for digit 0. Fix: use the original files.")
    labels = np.where(y == 10, 0, y).astype(np.int64)
    images = np.ascontiguousarray(np.transpose(x, (3, 2, 0, 1)), dtype=np.uint8)  # N, C, H, W
    return images, labels


def svhn_folder(root: str) -> str:
    """``root`` itself if it holds the files, else ``root/svhn``."""
    if os.path.isfile(os.path.join(root, FILES["test"])):
        return root
    return os.path.join(root, FOLDER)


def read_svhn(root: str, include_extra: bool = False):
    """(train_x, train_y, test_x, test_y); with ``include_extra`` the extra set joins train."""
    folder = svhn_folder(root)
    wanted = ["train", "test"] + (["extra"] if include_extra else [])
    missing = [os.path.join(folder, FILES[k]) for k in wanted
               if not os.path.isfile(os.path.join(folder, FILES[k]))]
    if missing:
        raise FileNotFoundError(", ".join(missing))
    train_x, train_y = read_mat(os.path.join(folder, FILES["train"]))
    test_x, test_y = read_mat(os.path.join(folder, FILES["test"]))
    if include_extra:
        ex_x, ex_y = read_mat(os.path.join(folder, FILES["extra"]))
        train_x, train_y = np.concatenate([train_x, ex_x]), np.concatenate([train_y, ex_y])
    return train_x, train_y, test_x, test_y

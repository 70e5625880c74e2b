"""CIFAR-10 'python version' batches: ``cifar-10-batches-py/{data_batch_1..5,test_batch}``.

Each batch is a pickled dict with ``b"data"`` (10000 x 3072 uint8, channel-major:
1024 red, 1024 green, 1024 blue values per row) and ``b"labels"`` (list of ints).

Pickle can run arbitrary code, so we unpickle with an allow-list: only the numpy
array reconstruction helpers and plain containers may be built. A tampered batch
is rejected with a DataError instead of being executed.
"""
from __future__ import annotations

import os
import pickle

import numpy as np

from rknn_ray.errors import DataError

TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META = "batches.meta"
FOLDER = "cifar-10-batches-py"
CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer",
               "dog", "frog", "horse", "ship", "truck")

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("codecs", "encode"),
    ("_codecs", "encode"),  # protocol-2 pickles rebuild bytes with it (harmless)
}


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"forbidden global {module}.{name}")


def load_pickle(path: str) -> dict:
    """Unpickle one batch with the allow-list (bytes keys, as in the original files)."""
    try:
        with open(path, "rb") as fh:
            obj = _SafeUnpickler(fh, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
        raise DataError(f"{path}: not a CIFAR-10 python batch ({exc}). "
                        "Fix: use the original cifar-10-python.tar.gz contents.") from exc
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a pickled dict, got {type(obj).__name__}")
    return obj


def read_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 3, 32, 32) uint8 and labels (N,) int64 of one batch file."""
    batch = load_pickle(path)
    if b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{path}: batch lacks b'data' or b'labels' (keys: {sorted(batch)}). "
                        "Fix: use the original CIFAR-10 python batches.")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: b'data' must be uint8 of shape (N, 3072), got "
                        f"{data.dtype} {data.shape}")
    if len(data) != len(labels):
        raise DataError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data.reshape(-1, 3, 32, 32), labels


def batch_folder(root: str) -> str:
    """``root`` itself if it holds the batches, else ``root/cifar-10-batches-py``."""
    if os.path.isfile(os.path.join(root, TEST_BATCH)):
        return root
    return os.path.join(root, FOLDER)


def read_cifar10(root: str):
    """(train_x, train_y, test_x, test_y, class_names) from a data root; FileNotFoundError lists gaps."""
    folder = batch_folder(root)
    names = TRAIN_BATCHES + (TEST_BATCH,)
    missing = [n for n in names if not os.path.isfile(os.path.join(folder, n))]
    if missing:
        raise FileNotFoundError(", ".join(os.path.join(folder, n) for n in missing))
    parts = [read_batch(os.path.join(folder, n)) for n in TRAIN_BATCHES]
    train_x = np.concatenate([p[0] for p in parts])
    train_y = np.concatenate([p[1] for p in parts])
    test_x, test_y = read_batch(os.path.join(folder, TEST_BATCH))
    class_names = CLASS_NAMES
    meta_path = os.path.join(folder, META)
    if os.path.isfile(meta_path):
        meta = load_pickle(meta_path)
        raw = meta.get(b"label_names")
        if raw:
            class_names = tuple(v.decode() if isinstance(v, bytes) else str(v) for v in raw)
    return train_x, train_y, test_x, test_y, class_names

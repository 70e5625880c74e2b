"""The built-in data sets' readers, and ``load_dataset``: any registered set by name (the
entries are in rknn_ray/data/kinds/builtin.py; the ``Dataset`` they return and its input
checks live in rknn_ray.data.dataset and are re-exported here).

Convention: images are float32 of shape (N, C, H, W) with values in [0, 1]
(torch layout; C = 1 for gray), labels int64 in ``[0, num_classes)``. Feature
data sets (the synthetic mixture) are float32 (N, dim) with ``image_shape = (dim,)``.

Readers check file formats and labels before converting to float, so a bad
file fails in well under a second with a message naming the file and the fix.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import struct

import numpy as np

from rknn_ray.data.dataset import Dataset, validate_features  # noqa: F401 - re-exported
from rknn_ray.data.registry import aliases, canonical_name as canonical, kind_of, kinds, known
from rknn_ray.errors import ConfigError, DataError
from rknn_ray.data.idx import IDX_STEMS, find_idx_file, read_idx_split
from rknn_ray.data.cifar import read_cifar10

FASHION_MNIST_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                   "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


def __getattr__(name: str):
    """``KNOWN``, ``DEFAULT_ROOTS`` and ``ALIASES``, read from the registry (its entries own them)."""
    if name == "KNOWN":
        return known()
    if name == "DEFAULT_ROOTS":
        return {k.name: k.default_root for k in kinds().values() if k.default_root}
    if name == "ALIASES":
        return aliases()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def to_unit_float(images: np.ndarray) -> np.ndarray:
    """uint8 pixels -> float32 in [0, 1] (one allocation, divided in place)."""
    out = images.astype(np.float32)
    out /= 255.0
    return out


def canonical_name(name: str) -> str:
    """The canonical data set name, or ConfigError listing the known ones."""
    return canonical(name)


def load_dataset(name: str, data_root: str | None = None, **kwargs) -> Dataset:
    """Read a registered data set by name (rknn_ray.data.registry).

    ``data_root`` is a folder holding the standard files (or a parent of the
    standard sub-folder); without it each reader uses its entry's default location.
    Extra keyword arguments: the entry's options (``include_extra`` for SVHN, the
    :func:`rknn_ray.data.synthetic.gaussian_mixture` arguments for "synthetic").
    """
    kind = kind_of(name)
    key = kind.name
    if kind.reader is None:
        raise ConfigError("dataset", f"{key!r} is not read as one labelled pool",
                          f"run it as a job (data.dataset={key}); see docs/running.md")
    allowed = set(kind.options)
    unknown = sorted(set(kwargs) - allowed)
    if unknown:
        raise ConfigError("dataset", f"{key!r} takes no option(s) {unknown}",
                          f"allowed options for {key!r}: {sorted(allowed) or 'none'}")
    root = data_root if data_root is not None else kind.default_root
    return kind.reader(root, **kwargs)


#: scikit-learn's digits: one fixed pool (its public part is known before it loads)
DIGITS_RECORDS = 1797


def load_digits() -> Dataset:
    """scikit-learn's 1,797 real 8x8 digits (shipped in the wheel); one pool, split later."""
    table = None
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        # sklearn's own CSV (64 pixels + target per row): skips the slow sklearn import
        path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
        if os.path.isfile(path):
            table = np.loadtxt(path, delimiter=",")
    if table is None or table.shape != (DIGITS_RECORDS, 65):
        from sklearn.datasets import load_digits as sk_load_digits  # defers sklearn
        bunch = sk_load_digits()
        table = np.column_stack([bunch.data, bunch.target])
    x = (table[:, :64].astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)  # pixels are 0..16
    y = table[:, 64].astype(np.int64)
    validate_features(x, y, 10, "digits")
    return Dataset("digits", x, y, x[:0], y[:0], 10, (1, 8, 8),
                   tuple(str(d) for d in range(10)), "sklearn.datasets.load_digits")


def _missing(what: str, root: str, looked: str, fix: str) -> DataError:
    return DataError(f"{what} files not found under {root!r}: missing {looked}. Fix: {fix}")


def _idx_folders(key: str, root: str) -> list[str]:
    """``root``, ``root/<name>`` and the torchvision layout ``root/<Name>/raw``."""
    sub = {"mnist": ("mnist", "MNIST"), "fashion_mnist": ("fashion-mnist", "FashionMNIST")}[key]
    return [root, os.path.join(root, sub[0]), os.path.join(root, sub[1], "raw")]


def idx_test_count(name: str, data_root: str | None = None) -> int | None:
    """How many records MNIST-style test files hold, from the test labels' IDX header alone
    (8 bytes of a public file; no private record is read); None where it cannot say (the
    full load then names the problem)."""

    key = canonical_name(name)
    if key not in ("fashion_mnist", "mnist"):
        return None
    root = data_root if data_root is not None else kind_of(key).default_root
    path = find_idx_file(_idx_folders(key, root), IDX_STEMS["test"][1])
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as fh:
            magic, count = struct.unpack(">II", fh.read(8))
    except (TypeError, AttributeError, OSError, EOFError, struct.error):  # None: no such file
        return None
    return count if magic == 0x00000801 else None


def load_idx_dataset(key: str, root: str) -> Dataset:
    """MNIST or Fashion-MNIST from IDX files (raw or .gz) in ``root``.

    Looks in ``root``, ``root/<name>`` and the torchvision layout ``root/<Name>/raw``.
    """
    folders = _idx_folders(key, root)
    title = "Fashion-MNIST" if key == "fashion_mnist" else "MNIST"
    stems = [s for pair in IDX_STEMS.values() for s in pair]
    missing = [s for s in stems if find_idx_file(folders, s) is None]
    if missing:
        fix = (f"pass --set data.data_root=DIR naming a folder with {', '.join(stems)} "
               "(raw or .gz)")
        if key == "fashion_mnist":
            fix = ("run `apt-get install dataset-fashion-mnist` (installs them in "
                   f"{FASHION_MNIST_ROOT}) or " + fix)
        looked = f"{', '.join(missing)} (raw or .gz; also looked in {folders[1:]})"
        raise _missing(title, root, looked, fix)
    train_x, train_y = read_idx_split(folders, "train")
    test_x, test_y = read_idx_split(folders, "test")
    for split, (x, y) in (("train", (train_x, train_y)), ("test", (test_x, test_y))):
        validate_features(x, y, 10, f"{title} {split}")
    if train_x.dtype != np.uint8 or test_x.dtype != np.uint8:
        raise DataError(f"{title}: images must be uint8 (IDX type 0x08), "
                        f"got {train_x.dtype}/{test_x.dtype}")
    h, w = train_x.shape[1:]
    if test_x.shape[1:] != (h, w):
        raise DataError(f"{title}: train images are {h}x{w} but test images are {test_x.shape[1:]}")
    return Dataset(key, to_unit_float(train_x).reshape(-1, 1, h, w), train_y.astype(np.int64),
                   to_unit_float(test_x).reshape(-1, 1, h, w), test_y.astype(np.int64), 10,
                   (1, h, w), FASHION_CLASSES if key == "fashion_mnist" else tuple(map(str, range(10))),
                   f"IDX files in {root}")


def load_cifar10(root: str) -> Dataset:
    """CIFAR-10 from the python batches in ``root`` or ``root/cifar-10-batches-py``."""
    try:
        train_x, train_y, test_x, test_y, names = read_cifar10(root)
    except FileNotFoundError as exc:
        raise _missing("CIFAR-10", root, str(exc),
                       "pass --set data.data_root=DIR naming the folder that holds "
                       "cifar-10-batches-py/ (data_batch_1..5, test_batch) "
                       "from cifar-10-python.tar.gz") from None
    validate_features(train_x, train_y, 10, "CIFAR-10 train")
    validate_features(test_x, test_y, 10, "CIFAR-10 test")
    return Dataset("cifar10", to_unit_float(train_x), train_y, to_unit_float(test_x), test_y,
                   10, (3, 32, 32), tuple(names), f"CIFAR-10 python batches in {root}")


def load_svhn(root: str, include_extra: bool = False) -> Dataset:
    """SVHN from ``{train,test[,extra]}_32x32.mat`` in ``root`` or ``root/svhn``.

    ``include_extra=True`` appends the 531,131 extra images to train, as the paper's
    private set does; that is ~7.4 GB as float32, hence opt-in.
    """
    from rknn_ray.data.svhn import read_svhn  # defers scipy
    try:
        train_x, train_y, test_x, test_y = read_svhn(root, include_extra)
    except FileNotFoundError as exc:
        raise _missing("SVHN", root, str(exc),
                       "pass --set data.data_root=DIR naming the folder with the SVHN "
                       "format-2 files train_32x32.mat, test_32x32.mat (and extra_32x32.mat "
                       "for include_extra)") from None
    return Dataset("svhn", to_unit_float(train_x), train_y, to_unit_float(test_x), test_y,
                   10, (3, 32, 32), tuple(map(str, range(10))),
                   f"SVHN .mat files in {root}" + (" (train+extra)" if include_extra else ""))

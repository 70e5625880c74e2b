"""Readers on files written in the real formats (and the real Fashion-MNIST files when installed)."""
import os
import pickle

import numpy as np
import pytest

from rknn_ray.data import Dataset, gaussian_mixture, load_dataset, make_splits, validate_features
from rknn_ray.data.readers import FASHION_MNIST_ROOT
from rknn_ray.errors import ConfigError, DataError
from tests.data_files import write_cifar, write_idx_labels, write_mnist, write_svhn


# ---------- real data shipped on this machine ----------

def test_digits_real():
    d = load_dataset("digits")
    assert d.train_x.shape == (1797, 1, 8, 8) and d.train_x.dtype == np.float32
    assert d.train_x.min() == 0.0 and d.train_x.max() == 1.0
    assert d.train_y.dtype == np.int64 and len(d.test_y) == 0
    # class sizes of the UCI optical digits test set shipped in scikit-learn
    assert np.bincount(d.train_y).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert d.image_shape == (1, 8, 8) and d.num_classes == 10


@pytest.mark.skipif(not os.path.isdir(FASHION_MNIST_ROOT),
                    reason=f"{FASHION_MNIST_ROOT} absent (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_real_files():
    d = load_dataset("fmnist")
    assert d.name == "fashion_mnist"
    assert d.train_x.shape == (60000, 1, 28, 28) and d.test_x.shape == (10000, 1, 28, 28)
    assert d.train_x.dtype == np.float32 and 0.0 <= d.train_x.min() and d.train_x.max() <= 1.0
    assert np.bincount(d.train_y).tolist() == [6000] * 10      # published: balanced classes
    assert np.bincount(d.test_y).tolist() == [1000] * 10
    assert d.train_y[0] == 9                                    # first training image: ankle boot
    # the widely quoted normalisation constants of Fashion-MNIST train: mean 0.2860, std 0.3530
    assert abs(float(d.train_x.mean(dtype=np.float64)) - 0.2860) < 5e-4
    assert abs(float(d.train_x.std(dtype=np.float64)) - 0.3530) < 5e-4
    s = make_splits(d, seed=0)
    assert s.describe()["private"] == 60000 and len(s.public_y) == 5000 and len(s.eval_y) == 5000
    assert s.private_x is d.train_x                             # no copy of the big array


# ---------- MNIST IDX ----------

@pytest.mark.parametrize("gz,dotted", [(True, False), (False, False), (False, True)])
def test_mnist_idx_roundtrip(tmp_path, gz, dotted):
    arrays = write_mnist(str(tmp_path), gz=gz, dotted=dotted)
    d = load_dataset("mnist", data_root=str(tmp_path))
    x, y = arrays["train"]
    assert d.train_x.shape == (40, 1, 28, 28) and d.test_x.shape == (20, 1, 28, 28)
    np.testing.assert_array_equal(np.rint(d.train_x[:, 0] * 255).astype(np.uint8), x)
    np.testing.assert_array_equal(d.train_y, y)
    np.testing.assert_array_equal(d.test_y, arrays["t10k"][1])


def test_mnist_torchvision_layout(tmp_path):
    arrays = write_mnist(str(tmp_path / "MNIST" / "raw"))
    d = load_dataset("mnist", data_root=str(tmp_path))
    np.testing.assert_array_equal(d.test_y, arrays["t10k"][1])


def test_fashion_mnist_reader_with_data_root(tmp_path):
    arrays = write_mnist(str(tmp_path / "fashion-mnist"))
    d = load_dataset("fashion-mnist", data_root=str(tmp_path))
    assert d.class_names[9] == "Ankle boot"
    np.testing.assert_array_equal(d.train_y, arrays["train"][1])


def test_idx_missing_files_error_names_files_and_fix(tmp_path):
    with pytest.raises(DataError) as err:
        load_dataset("fashion_mnist", data_root=str(tmp_path))
    msg = str(err.value)
    for stem in ("train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        assert stem in msg
    assert "apt-get install dataset-fashion-mnist" in msg and "--set data.data_root=DIR" in msg
    write_mnist(str(tmp_path))
    os.remove(tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte \\(raw"):
        load_dataset("mnist", data_root=str(tmp_path))


def test_idx_corrupt_files(tmp_path):
    write_mnist(str(tmp_path), gz=False)
    path = tmp_path / "train-images-idx3-ubyte"
    raw = path.read_bytes()
    path.write_bytes(raw[:-100])                                   # truncated
    with pytest.raises(DataError, match="truncated or corrupt"):
        load_dataset("mnist", data_root=str(tmp_path))
    path.write_bytes(b"\x1f\x00" + raw[2:])                         # bad magic
    with pytest.raises(DataError, match="bad magic"):
        load_dataset("mnist", data_root=str(tmp_path))
    path.write_bytes(raw)
    write_idx_labels(str(tmp_path / "train-labels-idx1-ubyte"), np.zeros(39))   # count mismatch
    with pytest.raises(DataError, match="40 images but .* 39 labels"):
        load_dataset("mnist", data_root=str(tmp_path))
    write_idx_labels(str(tmp_path / "train-labels-idx1-ubyte"), np.full(40, 12))  # label 12
    with pytest.raises(DataError, match="40 labels outside 0..9 \\(first at index 0: 12\\)"):
        load_dataset("mnist", data_root=str(tmp_path))
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(b"not gzip but named .gz")
    os.rename(tmp_path / "t10k-images-idx3-ubyte", tmp_path / "t10k-images-idx3-ubyte.gz")
    write_idx_labels(str(tmp_path / "train-labels-idx1-ubyte"), np.zeros(40))
    with pytest.raises(DataError, match="cannot read"):
        load_dataset("mnist", data_root=str(tmp_path))


# ---------- CIFAR-10 ----------

def test_cifar10_batches(tmp_path):
    written = write_cifar(str(tmp_path))
    d = load_dataset("cifar10", data_root=str(tmp_path))
    assert d.train_x.shape == (40, 3, 32, 32) and d.test_x.shape == (8, 3, 32, 32)
    data, labels = written["data_batch_2"]
    img = d.train_x[8 + 3]                                  # 4th image of the 2nd batch
    raw = data[3]
    # channel-major rows: 1024 red, 1024 green, 1024 blue values, each row-major 32x32
    assert np.rint(img[0, 5, 7] * 255) == raw[5 * 32 + 7]
    assert np.rint(img[1, 5, 7] * 255) == raw[1024 + 5 * 32 + 7]
    assert np.rint(img[2, 31, 0] * 255) == raw[2048 + 31 * 32]
    assert d.train_y[8 + 3] == labels[3]
    np.testing.assert_array_equal(d.test_y, written["test_batch"][1])
    assert d.class_names[3] == "cat"
    # the batch folder itself is accepted as root too
    assert load_dataset("cifar-10", data_root=str(tmp_path / "cifar-10-batches-py")).num_records == 48


def test_cifar10_missing_and_malicious(tmp_path):
    with pytest.raises(DataError, match="data_batch_1.*test_batch.*cifar-10-python.tar.gz"):
        load_dataset("cifar10", data_root=str(tmp_path))
    write_cifar(str(tmp_path))
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    with open(tmp_path / "cifar-10-batches-py" / "test_batch", "wb") as fh:
        pickle.dump({b"data": Evil(), b"labels": []}, fh)
    with pytest.raises(DataError, match="forbidden global"):
        load_dataset("cifar10", data_root=str(tmp_path))
    assert not marker.exists()


# ---------- SVHN ----------

def test_svhn_mat(tmp_path):
    x, y = write_svhn(str(tmp_path), "train_32x32.mat", 12, labels=[10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 5])
    write_svhn(str(tmp_path), "test_32x32.mat", 6)
    d = load_dataset("svhn", data_root=str(tmp_path))
    assert d.train_x.shape == (12, 3, 32, 32) and d.test_x.shape == (6, 3, 32, 32)
    assert d.train_y.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 5]   # 10 means digit 0
    # X[row, col, channel, n] -> out[n, channel, row, col]
    assert np.rint(d.train_x[4, 2, 3, 17] * 255) == x[3, 17, 2, 4]
    with pytest.raises(DataError, match="extra_32x32.mat"):
        load_dataset("svhn", data_root=str(tmp_path), include_extra=True)
    write_svhn(str(tmp_path), "extra_32x32.mat", 5)
    assert len(load_dataset("svhn", data_root=str(tmp_path), include_extra=True).train_y) == 17


def test_svhn_bad_labels_and_missing(tmp_path):
    with pytest.raises(DataError, match="train_32x32.mat.*test_32x32.mat"):
        load_dataset("svhn", data_root=str(tmp_path))
    write_svhn(str(tmp_path), "train_32x32.mat", 4, labels=[1, 11, 2, 0])
    write_svhn(str(tmp_path), "test_32x32.mat", 2)
    with pytest.raises(DataError, match="2 labels outside 1..10 \\(first at index 1: 11\\)"):
        load_dataset("svhn", data_root=str(tmp_path))


# ---------- names, options, validation ----------

def test_unknown_name_and_option():
    with pytest.raises(ConfigError, match="unknown data set 'imagenet'.*digits, fashion_mnist, mnist"):
        load_dataset("imagenet")
    with pytest.raises(ConfigError, match="takes no option"):
        load_dataset("digits", include_extra=True)


def test_validate_features_messages():
    x = np.zeros((10, 4), dtype=np.float32)
    y = np.arange(10) % 3
    validate_features(x, y, 3)
    x[[3, 7], 1] = [np.nan, np.inf]
    with pytest.raises(DataError, match="2 records have NaN or infinite features \\(first at index 3\\)"):
        validate_features(x, y, 3)
    with pytest.raises(DataError, match="3 labels outside 0..1 \\(first at index 2: 2\\)"):
        validate_features(np.zeros((10, 4)), y, 2)
    with pytest.raises(DataError, match="10 feature rows but 9 labels"):
        validate_features(np.zeros((10, 4)), y[:9], 3)
    with pytest.raises(DataError, match="labels must be 1-D"):
        validate_features(np.zeros((10, 4)), np.eye(10, 3, dtype=np.int64), 3)
    with pytest.raises(DataError, match="labels must be integers"):
        validate_features(np.zeros((10, 4)), y.astype(float), 3)


# ---------- synthetic ----------

def test_gaussian_mixture_geometry_and_bayes_accuracy():
    from scipy.stats import norm
    from rknn_ray.data.synthetic import class_means
    mu = class_means(5, 16, 3.0, seed=7)
    dist = np.linalg.norm(mu[:, None] - mu[None], axis=-1)
    np.testing.assert_allclose(dist[~np.eye(5, dtype=bool)], 3.0, rtol=1e-12)
    n, sep = 40_000, 2.0
    d = load_dataset("synthetic", num_samples=n, num_classes=2, dim=8, seed=3, separation=sep)
    assert d.train_x.shape == (n, 8) and d.train_x.dtype == np.float32 and d.image_shape == (8,)
    assert np.bincount(d.train_y).tolist() == [n // 2, n // 2]
    mu = class_means(2, 8, sep, seed=3)
    pred = np.argmin(((d.train_x[:, None, :] - mu[None]) ** 2).sum(-1), axis=1)
    acc, bayes = (pred == d.train_y).mean(), norm.cdf(sep / 2)      # 0.8413
    assert abs(acc - bayes) < 4 * np.sqrt(bayes * (1 - bayes) / n)
    again = gaussian_mixture(n, 2, 8, seed=3, separation=sep)
    np.testing.assert_array_equal(again.train_x, d.train_x)
    with pytest.raises(ConfigError, match="num_classes"):
        gaussian_mixture(10, 1, 4)


def test_dataset_is_plain_container():
    d = Dataset("x", np.zeros((2, 3), np.float32), np.zeros(2, np.int64),
                np.zeros((1, 3), np.float32), np.zeros(1, np.int64), 2, (3,))
    assert d.num_records == 3

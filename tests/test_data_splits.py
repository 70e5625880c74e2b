"""The paper's splits and the stratified one: sizes, disjointness, contents, determinism."""
import numpy as np
import pytest

from rknn_ray.data import Dataset, load_dataset, make_splits
from rknn_ray.errors import ConfigError


def fake(name, n_train, n_test, num_classes=10, features=1):
    """A Dataset whose single feature is the record's pooled position (to check contents)."""
    pos = np.arange(n_train + n_test, dtype=np.float32)[:, None].repeat(features, 1)
    y = np.arange(n_train + n_test, dtype=np.int64) * 7 % num_classes
    return Dataset(name, pos[:n_train], y[:n_train], pos[n_train:], y[n_train:],
                   num_classes, (features,))


def check_partition_of_pool(s, n_pool, expect_cover=True):
    parts = [s.private_index, s.public_index, s.eval_index]
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "parts overlap"
    if expect_cover:
        assert len(allidx) == n_pool
    for idx, x, y in ((s.private_index, s.private_x, s.private_y),
                      (s.public_index, s.public_x, s.public_y), (s.eval_index, s.eval_x, s.eval_y)):
        np.testing.assert_array_equal(x[:, 0], idx)                 # contents follow the index
        np.testing.assert_array_equal(y, idx * 7 % s.num_classes)


@pytest.mark.parametrize("name,n_tr,n_te,sizes", [
    ("mnist", 60000, 10000, (60000, 5000, 5000)),
    ("fashion_mnist", 60000, 10000, (60000, 5000, 5000)),
    ("svhn", 73257, 26032, (73257, 25032, 1000)),
    ("svhn", 73257 + 531131, 26032, (604388, 25032, 1000)),   # with the extra set
    ("cifar10", 50000, 10000, (29000, 30000, 1000)),
])
def test_paper_split_sizes_at_real_dataset_sizes(name, n_tr, n_te, sizes):
    d = fake(name, n_tr, n_te)
    s = make_splits(d, seed=0)
    desc = s.describe()
    assert (desc["private"], desc["public"], desc["eval"]) == sizes
    check_partition_of_pool(s, n_tr + n_te, expect_cover=(name != "cifar10"))
    if name == "cifar10":
        assert np.all(s.public_index < n_tr) and np.all(s.eval_index >= n_tr)
        assert (s.private_index < n_tr).sum() == 20000 and (s.private_index >= n_tr).sum() == 9000
    else:
        assert s.private_x is d.train_x                             # whole train set, no copy
        assert np.all(s.public_index >= n_tr) and np.all(s.eval_index >= n_tr)


def test_digits_stratified_split_real():
    d = load_dataset("digits")
    s = make_splits(d, seed=0)
    assert s.rule == "stratified"
    assert (len(s.private_y), len(s.public_y), len(s.eval_y)) == (1079, 359, 359)
    idx = np.concatenate([s.private_index, s.public_index, s.eval_index])
    assert sorted(idx.tolist()) == list(range(1797))
    np.testing.assert_array_equal(s.public_x, d.train_x[s.public_index])
    np.testing.assert_array_equal(s.eval_y, d.train_y[s.eval_index])
    full = np.bincount(d.train_y)
    for part, frac in ((s.private_y, 0.6), (s.public_y, 0.2), (s.eval_y, 0.2)):
        # stratified: each class within one record of its proportional share
        assert np.all(np.abs(np.bincount(part, minlength=10) - frac * full) <= 1.0)
    again, other = make_splits(d, seed=0), make_splits(d, seed=1)
    np.testing.assert_array_equal(again.public_index, s.public_index)
    assert not np.array_equal(other.public_index, s.public_index)
    assert s.describe()["rule_text"].startswith("pool train+test; per class 60%")


def test_overrides_and_determinism():
    d = fake("mnist", 100, 40)
    s = make_splits(d, seed=5, public_size=10)
    assert (len(s.private_y), len(s.public_y), len(s.eval_y)) == (100, 10, 30)
    check_partition_of_pool(s, 140)
    s2 = make_splits(d, seed=5, public_size=10, eval_size=5)
    np.testing.assert_array_equal(s2.public_index, s.public_index)
    assert len(s2.eval_y) == 5
    c = make_splits(fake("cifar10", 100, 40), seed=2, public_size=60, eval_size=10)
    assert (len(c.private_y), len(c.public_y), len(c.eval_y)) == (70, 60, 10)
    check_partition_of_pool(c, 140)
    v = make_splits(fake("svhn", 50, 30), seed=2, eval_size=10)
    assert (len(v.private_y), len(v.public_y), len(v.eval_y)) == (50, 20, 10)
    st = make_splits(fake("mnist", 100, 40), rule="stratified", seed=0)
    assert (len(st.private_y), len(st.public_y), len(st.eval_y)) == (84, 28, 28)
    check_partition_of_pool(st, 140)


def test_split_errors_name_the_fix():
    with pytest.raises(ConfigError, match="SVHN split keeps 1000 test images.*pass eval_size"):
        make_splits(fake("svhn", 50, 30))
    with pytest.raises(ConfigError, match="CIFAR-10 split needs 30000 public"):
        make_splits(fake("cifar10", 100, 40))
    with pytest.raises(ConfigError, match="split.public_size"):
        make_splits(fake("mnist", 100, 40), public_size=40)
    with pytest.raises(ConfigError, match="unknown split rule"):
        make_splits(fake("mnist", 100, 40), rule="random")

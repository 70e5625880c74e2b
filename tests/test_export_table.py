"""benchmarks.export_table: Fashion-MNIST from the real IDX files as a user's tables (issue 35's
acceptance data), on a slice of the files."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from benchmarks.export_table import holder_sizes, main, skewed_holders
from rknn_ray.data.readers import FASHION_CLASSES, FASHION_MNIST_ROOT, load_dataset
from rknn_ray.data.splits import make_splits

pytestmark = pytest.mark.skipif(not __import__("os").path.isdir(FASHION_MNIST_ROOT),
                                reason=f"Fashion-MNIST IDX files not in {FASHION_MNIST_ROOT}")


def test_slice_is_the_paper_split_with_skewed_holders(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--limit", "800", "--holders", "50", "--seed", "1"]) == 0
    assert "50 holders of 1-" in capsys.readouterr().out
    private, public, evaluation, truth = (pq.read_table(tmp_path / f"{n}.parquet") for n in
                                          ("private", "public", "evaluation", "public_truth"))
    assert private.column_names == ["pixels", "label", "holder"]
    assert public.column_names == ["row_id", "pixels"]                   # no label column
    assert evaluation.column_names == ["pixels", "label"]
    assert (private.num_rows, public.num_rows + evaluation.num_rows) == (800, 800)
    assert private.schema.field("pixels").type.list_size == 784

    # the built-in reader's images and split, value for value
    ds = load_dataset("fashion_mnist")
    ds.train_x, ds.train_y, ds.test_x, ds.test_y = (a[:800] for a in (ds.train_x, ds.train_y,
                                                                       ds.test_x, ds.test_y))
    sp = make_splits(ds, rule="paper", seed=1)
    pix = np.stack(private.column("pixels").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(pix, sp.private_x.reshape(800, -1))
    assert private.column("label").to_pylist() == [FASHION_CLASSES[c] for c in sp.private_y]
    ids = public.column("row_id").to_pylist()
    assert len(set(ids)) == len(ids) and ids == truth.column("row_id").to_pylist()
    assert ids == [f"fmnist-test-{i - 800:05d}" for i in sp.public_index]
    assert truth.column("label").to_pylist() == [FASHION_CLASSES[c] for c in sp.public_y]
    assert evaluation.column("label").to_pylist() == [FASHION_CLASSES[c] for c in sp.eval_y]

    # holders: 50 of 1-40 records; labels more concentrated than the same sizes dealt at random
    holders = np.asarray(private.column("holder").to_pylist())
    names, per = np.unique(holders, return_counts=True)
    assert len(names) == 50 and per.min() >= 1 and per.max() <= 40
    y = sp.private_y

    def top_share(owner):
        return np.mean([np.bincount(y[owner == h]).max() / (owner == h).sum() for h in names])
    shuffled = np.random.default_rng(0).permutation(holders)
    assert top_share(holders) > top_share(shuffled) + 0.1


def test_holder_sizes_fill_the_records_within_the_bound():
    rng = np.random.default_rng(0)
    sizes = holder_sizes(60_000, 3000, 40, rng)
    assert sizes.sum() == 60_000 and sizes.min() >= 1 and sizes.max() <= 40
    y = np.repeat(np.arange(10), 6000)
    owner = skewed_holders(y, sizes, 0.5, rng)
    np.testing.assert_array_equal(np.bincount(owner, minlength=3000), sizes)


@pytest.mark.parametrize("args,needle", [
    (["--holders", "5"], "pass --holders between"),
    (["--data-root", "EMPTY"], "Fashion-MNIST files not found"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, needle):
    args = [str(tmp_path) if a == "EMPTY" else a for a in args]
    assert main(["--out", str(tmp_path / "out"), "--limit", "400", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_parity_slices_idx_files_the_builtin_reader_loads(tmp_path):
    """benchmarks.table_parity's built-in side at --limit: sliced IDX files that the built-in
    fashion_mnist reader loads as the first N images of each split (the export's slice)."""
    from benchmarks.table_parity import sliced_idx
    folder = sliced_idx(str(tmp_path / "idx"), 300)
    small, full = load_dataset("fashion_mnist", folder), load_dataset("fashion_mnist")
    np.testing.assert_array_equal(small.train_x, full.train_x[:300])
    np.testing.assert_array_equal(small.test_y, full.test_y[:300])

"""Issue 35: the user's own data (data.dataset=table) and the dataset registry.

Real files (parquet, CSV, hive-partitioned folders) written by the test, read by the real
readers; the private part is scanned in a real subprocess and each shard source opens its
own rows. The Ray runs (end to end, in memory) are in tests/test_table_jobs.py.
"""
import json
import re
import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.source_identity import job_source
from rknn_ray.config import Config, load_config
from rknn_ray.data import load_dataset, registry
from rknn_ray.data.prepared import prepare_data
from rknn_ray.errors import ConfigError, DataError
from rknn_ray.data.sources import dataset_sources
from tests.table_files import digits_parts, prepared_table, table_config, write, write_parts

BUILTINS = ("digits", "fashion_mnist", "mnist", "cifar10", "svhn", "synthetic")


def test_the_six_built_in_sets_and_table_are_registry_entries():
    kinds = registry.kinds()
    assert set(BUILTINS) | {"table"} <= set(kinds)
    assert all(kinds[name].reader is not None for name in BUILTINS)
    assert kinds["table"].prepare is not None and kinds["table"].reader is None
    assert registry.canonical_name("FMNIST") == "fashion_mnist"
    assert kinds["fashion_mnist"].paper_split == "mnist" and kinds["digits"].paper_split == "stratified"
    with pytest.raises(ConfigError, match="table"):
        registry.canonical_name("imagenet")          # the message lists every entry


def test_adding_a_reader_is_one_new_file(tmp_path, monkeypatch):
    import rknn_ray.data.kinds as kinds_package
    (tmp_path / "tiny_blobs.py").write_text(
        "from rknn_ray.data.registry import register_dataset\n"
        "from rknn_ray.data.synthetic import gaussian_mixture\n"
        "register_dataset('tiny_blobs', lambda root, n=90: gaussian_mixture(num_samples=n, "
        "num_classes=3, dim=4, seed=1), options=('n',), aliases=('blobs',))\n")
    monkeypatch.setattr(kinds_package, "__path__", [*kinds_package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_loaded", False)
    monkeypatch.setattr(registry, "_KINDS", {})
    monkeypatch.syspath_prepend(str(tmp_path.parent))
    try:
        cfg = load_config(None, ["data.dataset=blobs", "queries.s=5", "data.clients=10"])
        assert cfg.data.dataset == "tiny_blobs"
        assert load_dataset("tiny_blobs", n=60).num_records == 60
        data = prepare_data(cfg)                      # split and partitioned like a built-in
        assert data.num_clients == 10 and data.splits.rule == "stratified"
    finally:
        sys.modules.pop("rknn_ray.data.kinds.tiny_blobs", None)


def _prepare(folder, ext="parquet", **data):
    return prepared_table(Config.from_dict(table_config(str(folder), ext, **data)))


def test_table_prepares_from_public_rows_and_the_scan_only(tmp_path):
    priv, pub, ev = write_parts(str(tmp_path))
    data = _prepare(tmp_path)
    sp = data.splits
    # the driver holds no private row: placeholders of the right length, no memory behind them
    assert len(sp.private_y) == priv.num_rows and not sp.private_x.base.shape
    assert all(st == 0 for st in sp.private_x.strides) and data.remote_private
    assert sp.public_ids.tolist() == pub.column("row_id").to_pylist()
    assert sp.class_names == tuple(range(10)) and sp.public_y.tolist() == [-1] * pub.num_rows
    assert sp.eval_y.tolist() == ev.column("label").to_pylist() and sp.eval_x.shape == (ev.num_rows, 64)
    # clients are the holders found (public under the relation); the declared bound;
    # fingerprints of the private part only, keyed where they were read (the public and
    # evaluation files are no one's budget)
    holders = set(priv.column("holder").to_pylist())
    assert data.num_clients == len(holders) == data.holders["holders"]
    assert data.max_records_per_client == 10 and data.public_counts()["records"] == priv.num_rows

    def distinct(tables):
        return len(np.unique(np.concatenate([t.select([f"p{i}" for i in range(64)]).to_pandas()
                                             .to_numpy() for t in tables]), axis=0))
    assert len(data.pool) == len(data.near_pool) == 0
    assert len(data.pool_keyed) == distinct((priv,))
    # public standardization: fitted on the public rows only
    raw = pub.select([f"p{i}" for i in range(64)]).to_pandas().to_numpy()
    std = np.where(raw.std(0) > 0, raw.std(0), 1)
    assert np.allclose(sp.public_x, (raw - raw.mean(0)) / std, atol=1e-5)
    with pytest.raises(ConfigError, match="never loads them"):     # the non-private reference
        data.require_private_rows("the non-private reference")


def test_each_shard_reads_only_the_rows_the_scan_handed_it_never_the_file(tmp_path):
    """The scan reads the part once and hands each shard its own holders' rows: a shard opens
    no file (the private folder is gone once the scan answered), and reads no other row."""
    import shutil
    from rknn_ray.data.tables import bucket_of
    priv, _, _ = digits_parts(holders=12)
    # a folder partitioned by holder: one sub-folder (fragment) per holder
    pq.write_to_dataset(priv, str(tmp_path / "private"), partition_cols=["holder"])
    write(digits_parts()[1], str(tmp_path / "public.parquet"))
    cfg = Config.from_dict({**table_config(str(tmp_path)), "cluster": {"shards": 3}})
    cfg = cfg.with_overrides([f"data.private.path={tmp_path / 'private'}",
                              "data.evaluation=null"])
    data = prepared_table(cfg)
    shutil.rmtree(tmp_path / "private")             # a shard never opens the private path
    sources = dataset_sources(cfg, data)
    holders = np.array(priv.column("holder").to_pylist())
    labels = np.array(priv.column("label").to_pylist())
    shard_of = dict(zip(*bucket_of(pa.array(holders), 3)[1:]))
    seen, lo = set(), 0
    for src in sources:
        records = src.open()
        assert records.opened == []
        mine = {h for h, s in shard_of.items() if s == src.shard}
        assert mine.isdisjoint(seen) and len(mine) == src.client_hi - src.client_lo
        seen |= mine
        # exactly the rows of its holders (at most the bound each), no other row
        rows = np.isin(holders, sorted(mine))
        assert len(records.labels) == sum(min(10, int((holders == h).sum())) for h in mine)
        assert np.bincount(records.labels, minlength=10).sum() <= rows.sum()
        assert set(np.unique(records.client_ids)) == set(range(src.client_lo, src.client_hi))
        assert src.client_lo == lo
        lo = src.client_hi
        assert set(records.labels.tolist()) <= set(labels[rows].tolist())
        with pytest.raises(DataError, match="took them already"):      # handed over once
            src.open()
    assert seen == set(holders.tolist())


def test_without_a_client_column_each_record_is_a_client_and_shards_read_row_ranges(tmp_path):
    priv, pub, ev = write_parts(str(tmp_path))
    # three files read as one glob: the row ranges cross file boundaries
    for i, (lo, hi) in enumerate(((0, 400), (400, 700), (700, priv.num_rows))):
        write(priv.slice(lo, hi - lo).drop(["holder"]), str(tmp_path / "split" / f"{i}.parquet"))
    cfg = Config.from_dict({**table_config(str(tmp_path), private={
        "path": str(tmp_path / "split" / "*.parquet"), "client": None, "holders": None}),
        "cluster": {"shards": 3}})
    cfg = cfg.with_overrides(["data.private.client=null", "data.private.holders=null",
                              "data.max_records_per_client=null"])
    data = prepared_table(cfg)
    assert data.num_clients == priv.num_rows and data.max_records_per_client == 1
    sources = dataset_sources(cfg, data)
    got = [s.open() for s in sources]
    assert [len(r.labels) for r in got] == [s.client_hi - s.client_lo for s in sources]
    ids = np.concatenate([r.client_ids for r in got])
    assert ids.tolist() == list(range(priv.num_rows))
    assert np.concatenate([r.labels for r in got]).tolist() == priv.column("label").to_pylist()


def test_the_same_table_as_parquet_or_csv_or_a_glob_draws_from_one_budget(tmp_path):
    parts = write_parts(str(tmp_path / "pq"))
    write_parts(str(tmp_path / "csv"), "csv", parts)
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    a = _prepare(tmp_path / "pq")
    b = _prepare(tmp_path / "csv", "csv")
    assert np.array_equal(a.pool, b.pool) and a.private_digest == b.private_digest
    assert np.array_equal(a.pool_keyed, b.pool_keyed)
    ida = job_source(store, Config.from_dict(table_config(str(tmp_path / "pq"))), a)[0]
    idb = job_source(store, Config.from_dict(table_config(str(tmp_path / "csv"), "csv")), b)[0]
    assert ida == idb
    # another path: the private rows split over two files of a folder, read by a glob
    priv = parts[0]
    write(priv.slice(0, 500), str(tmp_path / "glob" / "a.parquet"))
    write(priv.slice(500), str(tmp_path / "glob" / "b.parquet"))
    c = _prepare(tmp_path / "pq", private={"path": str(tmp_path / "glob" / "*.parquet")})
    cfg_c = Config.from_dict(table_config(str(tmp_path / "pq"),
                                          private={"path": str(tmp_path / "glob" / "*.parquet")}))
    assert job_source(store, cfg_c, c)[0] == ida
    # other records (every pixel shifted): another source
    shifted = [pa.table({n: (pc.add(t.column(n), 7.0) if n.startswith("p") else t.column(n))
                         for n in t.column_names}) for t in parts]
    write_parts(str(tmp_path / "other"), parts=shifted)
    assert job_source(store, Config.from_dict(table_config(str(tmp_path / "other"))),
                                _prepare(tmp_path / "other"))[0] != ida


def test_the_same_table_rescaled_by_255_256_draws_from_the_same_budget(tmp_path):
    """Near fingerprints (the scan's, of the private rows): a copy with every feature value
    times 255/256 is the same source."""
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    parts = write_parts(str(tmp_path / "a"))
    scaled = [pa.table({n: (pc.multiply(t.column(n), 255 / 256) if n.startswith("p")
                            else t.column(n)) for n in t.column_names}) for t in parts]
    write_parts(str(tmp_path / "b"), parts=scaled)
    a, b = _prepare(tmp_path / "a"), _prepare(tmp_path / "b")
    assert len(np.intersect1d(a.pool_keyed, b.pool_keyed)) == 0   # no exact one is shared
    assert len(a.near_keyed) and np.array_equal(a.near_keyed, b.near_keyed)
    ida = job_source(store, Config.from_dict(table_config(str(tmp_path / "a"))), a)[0]
    assert job_source(store, Config.from_dict(table_config(str(tmp_path / "b"))), b)[0] == ida


def test_parts_given_as_file_uris_are_read_through_pyarrow_file_systems(tmp_path):
    """file:// (as s3://, gs://, hdfs:// would be): the scan, the driver's public and
    evaluation reads and each shard open the URI through pyarrow.fs; a folder is listed
    recursively; a glob in a URI is refused (globs are for local paths only)."""
    parts = write_parts(str(tmp_path / "local"))
    pq.write_to_dataset(parts[0], str(tmp_path / "held"), partition_cols=["holder"])
    uris = {"private": {"path": (tmp_path / "held").as_uri()},
            "public": {"path": (tmp_path / "local" / "public.parquet").as_uri()},
            "evaluation": {"path": (tmp_path / "local" / "evaluation.parquet").as_uri()}}
    cfg = Config.from_dict(table_config(str(tmp_path / "local"), **uris))
    data, local = prepared_table(cfg), _prepare(tmp_path / "local")
    assert np.array_equal(data.pool, local.pool) and len(data.splits.eval_y) == parts[2].num_rows
    assert np.array_equal(data.pool_keyed, local.pool_keyed)
    got = [src.open() for src in dataset_sources(cfg, data)]
    assert sum(len(r.labels) for r in got) == sum(
        min(10, c) for c in np.unique(parts[0].column("holder").to_numpy(zero_copy_only=False),
                                      return_counts=True)[1])
    assert all(r.opened == [] for r in got)   # the scan read the URI; the shards no file
    with pytest.raises(DataError, match="globs work on local paths only"):
        prepared_table(Config.from_dict(table_config(str(tmp_path / "local"), private={
            "path": (tmp_path / "local").as_uri() + "/*.parquet"})))
    with pytest.raises(ConfigError, match="image folders are read from local paths only"):
        prepare_data(Config.from_dict({"data": {
            "dataset": "image_folder", "classes": [0, 1], "private": {"path": uris["private"]["path"]},
            "public": {"path": uris["public"]["path"]}}}))


def test_uint8_image_pixels_are_scaled_to_unit_range_from_the_schema(tmp_path):
    """data.shape with uint8 pixels (a list column typed uint8): every part is read in
    [0, 1], as the built-in readers give images; float pixels stay as given."""
    def as_pixels(t, dtype):
        x = np.rint(t.select([f"p{i}" for i in range(64)]).to_pandas().to_numpy() * 255)
        flat = pa.array(x.astype(dtype).ravel())
        rest = [n for n in t.column_names if not n.startswith("p")]
        return pa.table({"pixels": pa.FixedSizeListArray.from_arrays(flat, 64),
                         **{n: t.column(n) for n in rest}})
    priv, pub, ev = digits_parts()
    got = {}
    for dtype in (np.uint8, np.float32):
        folder = tmp_path / np.dtype(dtype).name
        write_parts(str(folder), parts=[as_pixels(t, dtype) for t in (priv, pub, ev)])
        cfg = Config.from_dict(table_config(str(folder), shape=[1, 8, 8]))
        data = prepared_table(cfg)
        records = [src.open(order_key=bytes(32)) for src in dataset_sources(cfg, data)]
        got[dtype] = (data.splits.public_x, data.splits.eval_x,
                      np.concatenate([r.features for r in records]))
    for scaled, given in zip(got[np.uint8], got[np.float32]):
        assert 0 <= scaled.min() and scaled.max() <= 1 and given.max() > 200
        np.testing.assert_allclose(scaled, given / 255, rtol=1e-6)


def test_string_labels_and_categorical_columns(tmp_path):
    rng = np.random.default_rng(3)
    n = 240
    colour = rng.choice(["red", "green", "blue"], n)
    size = rng.normal(size=n) + (colour == "red") * 3
    label = np.where(size > 1.5, "big", "small")
    table = pa.table({"size": size, "colour": colour, "label": label,
                      "holder": [f"p{i % 40}" for i in range(n)]})
    write(table.slice(0, 160), str(tmp_path / "private.parquet"))
    write(table.slice(160).drop(["label", "holder"]).append_column(
        "row_id", pa.array([f"id-{i}" for i in range(80)])), str(tmp_path / "public.csv"))
    cfg = Config.from_dict(table_config(str(tmp_path), classes=["small", "big"],
                                        public={"path": str(tmp_path / "public.csv"), "id": "row_id"},
                                        evaluation=None))
    cfg = cfg.with_overrides(["data.evaluation=null", "queries.s=20"])
    data = prepared_table(cfg)
    # size standardized, colour one-hot over the public categories
    assert data.image_shape == (4,) and data.num_classes == 2
    assert sorted(map(tuple, np.unique(data.splits.public_x[:, 1:], axis=0))) == \
        [(0, 0, 1), (0, 1, 0), (1, 0, 0)]
    assert data.splits.eval_x.shape == (0, 4)
    records = [s.open() for s in dataset_sources(cfg, data)]
    got = np.concatenate([r.labels for r in records])
    assert sorted(got.tolist()) == sorted(int(v == "big") for v in label[:160])


def test_bad_input_fails_in_the_checks_not_in_a_shard(tmp_path):
    priv, pub, ev = write_parts(str(tmp_path))
    with pytest.raises(DataError, match="not in data.classes"):
        _prepare(tmp_path, classes=list(range(9)))
    with pytest.raises(DataError, match="'nope' not found"):
        _prepare(tmp_path, private={"label": "nope"})
    with pytest.raises(ConfigError, match="data.classes"):
        _prepare(tmp_path, classes=None)


def _list_parts(lengths):
    """A private part with one list column ``pixels`` of the given lengths, a public part."""
    rng = np.random.default_rng(0)
    rows = [rng.random(n).tolist() for n in lengths]
    private = pa.table({"pixels": rows, "label": [i % 3 for i in range(len(rows))],
                        "holder": [f"h{i % 5}" for i in range(len(rows))]})
    public = pa.table({"pixels": [rng.random(4).tolist() for _ in range(30)],
                       "row_id": [f"r{i}" for i in range(30)]})
    return private, public


def _bad(case, tmp):
    """(config overrides, files written) of one bad input."""
    priv, pub, _ = digits_parts(n_private=200, n_public=100)
    over = {}
    if case == "missing column":
        over = {"private": {"features": ["p0", "p1", "nope"]}, "public": {"features": ["p0", "p1", "p2"]}}
    elif case == "label outside classes":
        over = {"classes": [0, 1, 2, 3, 4, 5, 6, 7, 8]}
    elif case == "public label without id":
        pub = pub.drop(["row_id"]).append_column("label", pa.array(np.zeros(100, np.int64)))
        over = {"public": {"id": None}}
    elif case == "empty private file":
        priv = priv.slice(0, 0)
    elif case == "client column with nulls":
        holder = priv.column("holder").to_pylist()
        holder[7] = None
        priv = priv.set_column(priv.column_names.index("holder"), "holder", pa.array(holder))
    elif case == "holders expected differ":
        over = {"private": {"holders": 7}}
    elif case == "a word in a numeric column":
        holder = priv.column("holder")
        words = pa.array([("SECRETVALUE123" if i == 17 else str(v)) for i, v in
                          enumerate(priv.column("p5").to_pylist())])
        priv = priv.set_column(priv.column_names.index("p5"), "p5", words)
        assert holder is not None
    elif case == "an infinite value (outside the domain)":
        big = priv.column("p9").to_pylist()
        big[3] = float("inf")       # a finite value of any size is clipped (test_value_domain)
        priv = priv.set_column(priv.column_names.index("p9"), "p9", pa.array(big))
    elif case == "clip bounds of no feature column":
        over = {"clip": {"bounds": {"nope": [0, 1]}}}
    elif case == "a link to a folder":
        os.makedirs(tmp / "private", exist_ok=True)
        write(priv, str(tmp / "private" / "part.parquet"))
        os.symlink(".", tmp / "private" / "loop")
        priv = None
    elif case == "mixed feature lengths":
        priv, pub = _list_parts([4] * 20 + [5] + [4] * 9)
        over = {"classes": [0, 1, 2]}
    if priv is not None:
        write(priv, str(tmp / "private.parquet"))
    write(pub, str(tmp / "public.parquet"))
    cfg = table_config(str(tmp), **over)
    if priv is None:
        cfg["data"]["private"]["path"] = str(tmp / "private")
    cfg["data"].pop("evaluation")
    cfg["data"]["public"] = {k: v for k, v in cfg["data"]["public"].items() if v is not None}
    return cfg


@pytest.mark.parametrize("case", ["missing column", "label outside classes",
                                  "public label without id", "empty private file",
                                  "client column with nulls", "mixed feature lengths",
                                  "holders expected differ", "a word in a numeric column",
                                  "an infinite value (outside the domain)",
                                  "clip bounds of no feature column", "a link to a folder"])
def test_bad_input_is_one_line_and_exit_2_before_any_budget_is_reserved(case, tmp_path, capsys):
    import yaml

    from jobs.distill import main
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_bad(case, tmp_path)))
    ledger = tmp_path / "ledger.sqlite"
    rc = main(["--config", str(path), "--out", str(tmp_path / "run"), "--ledger", str(ledger)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, err
    assert "Fix:" in err or "fix" in err.lower(), err
    words = {"missing column": "'nope' not found", "label outside classes": "not in data.classes",
             "public label without id": "data.public.id", "empty private file": "no rows",
             "client column with nulls": "empty values", "mixed feature lengths": "mixed feature lengths",
             "holders expected differ": "data.private.holders: declares 7 holders",
             "a word in a numeric column": "not shown, it is private",
             "an infinite value (outside the domain)": "NaN or infinite",
             "clip bounds of no feature column": "data.clip.bounds.nope",
             "a link to a folder": "is a link to a folder"}
    assert words[case] in err, err
    assert "SECRETVALUE" not in err and "1e+300" not in err and " row " + "1" not in err, err
    assert not re.search(r"\brow \d", err), err
    assert not ledger.exists() or BudgetStore(str(ledger)).datasets() == []
    assert not (tmp_path / "run").exists()           # no run folder left behind


def _write_images(folder, x, y=None, names=None):
    from PIL import Image
    for i, img in enumerate(x):
        sub = folder / str(y[i]) if y is not None else folder
        sub.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.rint(img * 255).astype(np.uint8), mode="L").save(
            sub / f"{names[i] if names else i}.png")


def test_an_image_folder_is_a_second_source_kind(tmp_path):
    d = load_dataset("digits")
    x, y = d.train_x[:, 0], d.train_y
    _write_images(tmp_path / "private", x[:300], y[:300])
    _write_images(tmp_path / "public", x[300:400], names=[f"img-{i}" for i in range(100)])
    _write_images(tmp_path / "evaluation", x[400:460], y[400:460])
    cfg = load_config(None, ["data.dataset=image_folder", "data.classes=[0,1,2,3,4,5,6,7,8,9]",
                             f"data.private.path={tmp_path / 'private'}",
                             f"data.public.path={tmp_path / 'public'}",
                             f"data.evaluation.path={tmp_path / 'evaluation'}",
                             "queries.s=20", "cluster.shards=2"])
    data = prepared_table(cfg)
    sp = data.splits
    assert data.image_shape == (1, 8, 8) and data.num_clients == 300 and data.remote_private
    assert sorted(sp.public_ids.tolist()) == sorted(f"img-{i}.png" for i in range(100))
    assert np.allclose(np.sort(sp.public_x.reshape(100, -1), axis=0),
                       np.sort(np.rint(x[300:400] * 255).reshape(100, -1) / 255, axis=0), atol=1e-6)
    assert sorted(sp.eval_y.tolist()) == sorted(y[400:460].tolist())
    got = [s.open() for s in dataset_sources(cfg, data)]
    assert sorted(np.concatenate([r.labels for r in got]).tolist()) == sorted(y[:300].tolist())
    assert sum(len(r.labels) for r in got) == 300 and got[0].features.shape[1:] == (1, 8, 8)
    with pytest.raises(DataError, match="one sub-folder of images per class"):
        prepared_table(cfg.with_overrides([f"data.private.path={tmp_path / 'public'}"]))


def test_rows_given_in_memory_are_dealt_per_shard_and_the_library_drops_them(tmp_path):
    priv, pub, ev = digits_parts(n_private=600, n_public=300)
    cfg = Config.from_dict(table_config(str(tmp_path), evaluation=None))
    cfg = cfg.with_overrides(["data.evaluation=null", "data.private.path=null",
                              "data.public.path=null", "cluster.shards=3"])
    data = prepared_table(cfg, {"private": priv.to_pandas(), "public": pub})
    handover = data.shard_sources.args[0]
    assert handover.table is not None                 # held until the hand-over
    sources = dataset_sources(cfg, data)
    assert handover.table is None                     # the library keeps no copy after it
    holders = np.array(priv.column("holder").to_pylist())
    dealt = [set(s.rows.column("holder").to_pylist()) for s in sources]
    assert sum(len(d) for d in dealt) == len(set(holders)) and all(
        a.isdisjoint(b) for i, a in enumerate(dealt) for b in dealt[i + 1:])
    assert sum(s.rows.num_rows for s in sources) == priv.num_rows
    got = [s.open() for s in sources]
    assert sum(r.num_clients for r in got) == len(set(holders))     # the shards' own count
    assert data.num_clients == len(set(holders))                     # public: found, shown


def test_two_private_tables_that_share_only_their_public_files_are_two_sources(tmp_path):
    """Issue 55 item 9: two jobs whose private parts are disjoint halves of one table, with
    the same public and evaluation files, are charged to two sources (the public files are
    read in the clear and spend nothing: they were the reason the halves merged). The same
    half again meets its own source, and a third table sharing one private record with the
    first half meets that one only."""
    priv, pub, ev = digits_parts()
    half = priv.num_rows // 2
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    key = store.fingerprint_key()
    prepared, names = {}, {}
    for name, rows in (("a", priv.slice(0, half)), ("b", priv.slice(half)),
                       ("a-again", priv.slice(0, half)),
                       ("c", pa.concat_tables([priv.slice(half - 1, 1),     # a's last record
                                               _shifted(priv.slice(0, 300))]))):
        write_parts(str(tmp_path / name), parts=(rows, pub, ev))
        cfg = Config.from_dict(table_config(str(tmp_path / name)))
        prepared[name] = prepared_table(cfg, key=key)
        names[name] = job_source(store, cfg, prepared[name])[0]
    a, b = prepared["a"], prepared["b"]
    # the halves share no record, not even a near copy (else they would rightly merge)
    assert not len(np.intersect1d(a.pool_keyed, b.pool_keyed))
    assert not len(np.intersect1d(a.near_keyed, b.near_keyed))
    assert names["a"] != names["b"] and names["a-again"] == names["a"]
    assert names["c"] == names["a"]
    assert {store.canonical(n)[0] for n in names.values()} == {names["a"], names["b"]}


def _shifted(table: pa.Table) -> pa.Table:
    """Every pixel + 7: records no other table here holds, not even as near copies."""
    return pa.table({n: (pc.add(table.column(n), 7.0) if n.startswith("p") else table.column(n))
                     for n in table.column_names})


def test_a_column_not_found_names_the_closest_match_first():
    """Issue 57: the list of columns was cut before the name the user meant, and no closest
    match was named."""
    from rknn_ray.data.tables import Part, missing
    schema = pa.schema([(f"c{i}", pa.float64()) for i in range(20)] +
                       [("mean area", pa.float64()), ("label", pa.string())])
    with pytest.raises(DataError) as err:
        missing(Part("private", path="x.csv"), schema, ["label", "mean_area"])
    msg = str(err.value)
    assert "column 'mean_area' not found" in msg and "did you mean 'mean area'?" in msg
    assert msg.index("'mean area'") < msg.index("'c0'")
    with pytest.raises(DataError) as err:
        missing(Part("private", path="x.csv"), schema, ["zzz"])
    assert "did you mean" not in str(err.value)

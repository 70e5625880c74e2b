"""The domain of a record's value (issue 55, item 8; docs/threat-model.md, "The domain of a
record's value"): every finite private feature value is clipped to its column's bounds (the
public rows' range widened by ``data.clip.margin``, or ``data.clip.bounds``) before it is
featurized, in the scan, the shards and prediction alike, so no refusal, exit code or count
depends on how large one record's value is. NaN, infinities, unparseable cells and labels
outside the class list are outside the domain: refused as malformed input.
"""
import os

import numpy as np
import pyarrow as pa
import pytest

from rknn_ray.config import Config
from rknn_ray.data.sources import dataset_sources
from rknn_ray.data.tables import CLIP_MARGIN, Columns, Featurizer
from rknn_ray.errors import ConfigError, DataError
from tests.table_files import digits_parts, prepared_table, table_config, write_parts


def _with_cell(table: pa.Table, column: str, row: int, value: float) -> pa.Table:
    values = table.column(column).to_pylist()
    values[row] = value
    return table.set_column(table.column_names.index(column), column,
                            pa.array(values, pa.float64()))


def _records(folder, private, public, evaluation, **data) -> tuple:
    """(the shards' records in client order, the prepared data) of one table, through the
    real scan and the real shard opens (two shards)."""
    write_parts(str(folder), parts=(private, public, evaluation))
    cfg = Config.from_dict(table_config(str(folder), **data))
    prepared = prepared_table(cfg)
    opened = [src.open() for src in dataset_sources(cfg, prepared)]
    x = np.concatenate([r.features for r in opened])
    x = x.reshape(len(x), -1)
    y = np.concatenate([r.labels for r in opened])
    ids = np.concatenate([r.client_ids for r in opened])
    order = np.lexsort((y, *x.T[::-1], ids))
    return (x[order], y[order], ids[order]), prepared


# ------------------------------------------------------------------------ the featurizer
def test_bounds_from_the_public_rows_are_its_range_widened_by_the_margin():
    cols = Columns(("a", "b", "colour"), False, ("colour",))
    public = np.array([[0.0, 10.0, "red"], [1.0, 20.0, "blue"], [2.0, 40.0, "red"]], object)
    f = Featurizer(cols).fit(public)
    assert CLIP_MARGIN == 0.1
    np.testing.assert_allclose(f.low, [0 - 0.2, 10 - 3.0])
    np.testing.assert_allclose(f.high, [2 + 0.2, 40 + 3.0])
    assert f.domain["a"] == {"low": -0.2, "high": 2.2, "from": "public"}
    # 1e300, 1e30 and the bound itself are one value once featurized; -1e300 the low bound
    rows = np.array([[1e300, 15.0, "red"], [1e30, 15.0, "red"], [2.2, 15.0, "red"],
                     [-1e300, -1e300, "green"], [-0.2, 7.0, "green"]], object)
    x = f(rows)
    assert np.isfinite(x).all()
    np.testing.assert_array_equal(x[0], x[1])
    np.testing.assert_array_equal(x[0], x[2])
    np.testing.assert_array_equal(x[3], x[4])
    # a value inside the domain is left as it was
    inside = f(np.array([[1.5, 25.0, "blue"]], object))
    np.testing.assert_allclose(inside[0, :2], (np.array([1.5, 25.0]) - f.mean) / f.std, rtol=1e-6)
    # margin 0: the public range itself
    g = Featurizer(cols).fit(public, {"margin": 0.0})
    np.testing.assert_allclose([g.low, g.high], [[0.0, 10.0], [2.0, 40.0]])


def test_bounds_from_the_config_replace_the_public_range_for_their_columns():
    cols = Columns(("a", "b"), False)
    public = np.array([[0.0, 10.0], [1.0, 20.0], [2.0, 40.0]])
    f = Featurizer(cols).fit(public, {"bounds": {"b": [0.0, 100.0]}})
    assert f.domain["b"] == {"low": 0.0, "high": 100.0, "from": "data.clip.bounds"}
    assert f.domain["a"]["from"] == "public"
    x = f(np.array([[1.0, 1e300], [1.0, 100.0], [1.0, 99.0]]))
    np.testing.assert_array_equal(x[0], x[1])
    assert x[2, 1] < x[1, 1]
    described = f.describe_domain()
    assert described["columns"]["b"]["from"] == "data.clip.bounds"
    assert "NaN" in described["outside"] and described["margin"] == CLIP_MARGIN


def test_an_image_has_one_pair_of_bounds_for_all_its_values():
    cols = Columns(("pixels",), True)
    rng = np.random.default_rng(0)
    public = rng.random((20, 4))
    f = Featurizer(cols, (1, 2, 2)).fit(public)
    lo, hi = public.min(), public.max()
    assert list(f.domain) == ["pixels"]
    np.testing.assert_allclose(f.low, np.full(4, lo - 0.1 * (hi - lo)))
    x = f(np.array([[1e300, -1e300, 0.5, 1e30]]))
    assert x.shape == (1, 1, 2, 2) and np.isfinite(x).all()
    flat = x.ravel()
    assert flat[0] == flat[3] == np.float32(f.high[0]) and flat[1] == np.float32(f.low[0])
    assert flat[2] == np.float32(0.5)


def test_the_saved_featurizer_clips_as_the_job_did_and_an_older_one_does_not():
    """predictor.json (rknn_ray/predictor.py) saves the bounds: prediction featurizes a row
    as the job's scan and shards did; a predictor.json saved before domains reads as before."""
    cols = Columns(("a", "b"), False)
    f = Featurizer(cols).fit(np.array([[0.0, 10.0], [1.0, 20.0], [2.0, 40.0]]))
    rows = np.array([[1e300, 15.0], [-1e30, 12.0]])
    saved = f.to_dict()
    np.testing.assert_array_equal(Featurizer.from_dict(saved)(rows), f(rows))
    old = {k: v for k, v in saved.items() if k not in ("low", "high", "domain", "margin")}
    assert Featurizer.from_dict(old).low is None
    with pytest.raises(DataError, match="malformed"):
        Featurizer.from_dict({**saved, "high": None})


# ------------------------------------------------------------------------ the config
@pytest.mark.parametrize("clip,word", [
    ({"margin": -1}, "data.clip.margin"),
    ({"margin": "wide"}, "data.clip.margin"),
    ({"bounds": {"p0": [5, 1]}}, "data.clip.bounds.p0"),
    ({"bounds": {"p0": [0, float("inf")]}}, "data.clip.bounds.p0"),
    ({"bounds": {"p0": [0, 1, 2]}}, "data.clip.bounds.p0"),
    ({"bounds": {"p0": ["a", 1]}}, "data.clip.bounds.p0"),
    ({"bounds": [0, 1]}, "data.clip.bounds"),
    ({"low": 0}, "data.clip.low"),
    ("wide", "data.clip")])
def test_invalid_clip_settings_are_refused_in_one_line(clip, word):
    cfg = table_config("/nowhere")
    cfg["data"]["clip"] = clip
    with pytest.raises(ConfigError) as err:
        Config.from_dict(cfg)
    text = str(err.value)
    assert word in text and "Fix:" in text and "\n" not in text, text


def test_clip_is_read_only_for_a_table():
    with pytest.raises(ConfigError, match="data.clip"):
        Config.from_dict({"data": {"dataset": "digits", "clip": {"margin": 0.5}}})


@pytest.mark.parametrize("bounds,word", [
    ({"nope": [0, 1]}, "is not a numeric feature column"),
    ({"p3": [-1e300, 1e300]}, "is too wide")])
def test_bounds_the_public_part_cannot_hold_are_refused_before_any_scan(bounds, word, tmp_path):
    write_parts(str(tmp_path), parts=digits_parts(n_private=60, n_public=40))
    cfg = Config.from_dict(table_config(str(tmp_path), clip={"bounds": bounds}))
    with pytest.raises(ConfigError) as err:
        prepared_table(cfg)
    text = str(err.value)
    assert word in text and "data.clip.bounds." in text and "\n" not in text, text


# ------------------------------------------------------------------------ scan and shards
def test_a_huge_value_is_clipped_alike_in_the_scan_and_the_shards(tmp_path):
    """A private table and its neighbour where one record's p9 is 1e300 vs 1e30 (and another
    record's p4 -1e300 vs -1e30): both scanned and opened without a refusal, every shard's
    records equal (both clipped to the same bound), the counts equal; the record is charged
    (the scan's fingerprints count it). The same with config bounds."""
    priv, pub, ev = digits_parts(n_private=200, n_public=100)
    runs = {}
    for name, big in (("d", 1e300), ("d2", 1e30)):
        table = _with_cell(_with_cell(priv, "p9", 3, big), "p4", 11, -big)
        runs[name] = _records(tmp_path / name, table, pub, ev)
    (a, data_a), (b, data_b) = runs["d"], runs["d2"]
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    assert np.isfinite(a[0]).all()
    assert data_a.holders == data_b.holders and data_a.num_clients == data_b.num_clients
    assert len(data_a.pool_keyed) == len(data_b.pool_keyed)
    assert data_a.domain == data_b.domain and data_a.domain["columns"]["p9"]["from"] == "public"
    # the clipped value is the bound: the same as a record holding the bound itself
    hi = data_a.domain["columns"]["p9"]["high"]
    (c, _) = _records(tmp_path / "d3", _with_cell(_with_cell(priv, "p9", 3, hi), "p4", 11,
                                                   data_a.domain["columns"]["p4"]["low"]),
                      pub, ev)
    np.testing.assert_allclose(c[0], a[0], rtol=1e-6, atol=1e-6)
    # bounds from the config: p9 clipped to [0, 4]
    (e, data_e) = _records(tmp_path / "e", _with_cell(priv, "p9", 3, 1e300), pub, ev,
                           clip={"bounds": {"p9": [0, 4]}})
    (f, _) = _records(tmp_path / "f", _with_cell(priv, "p9", 3, 4.0), pub, ev,
                      clip={"bounds": {"p9": [0, 4]}})
    np.testing.assert_array_equal(e[0], f[0])
    assert data_e.domain["columns"]["p9"] == {"low": 0.0, "high": 4.0,
                                              "from": "data.clip.bounds"}


def test_an_image_list_column_with_a_huge_value_is_clipped_not_refused(tmp_path):
    rng = np.random.default_rng(1)

    def part(n, **extra):
        return pa.table({"pixels": pa.array([rng.random(4).tolist() for _ in range(n)],
                                            pa.list_(pa.float64())), **extra})
    pub = part(80, row_id=[f"r{i}" for i in range(80)])
    ev = part(10, label=[i % 3 for i in range(10)])
    priv = part(40, label=[i % 3 for i in range(40)], holder=[f"h{i % 7}" for i in range(40)])
    out = []
    for name, big in (("a", 1e300), ("b", 1e30)):
        pixels = priv.column("pixels").to_pylist()
        pixels[5] = [big, -big, 0.5, big]
        table = priv.set_column(0, "pixels", pa.array(pixels, pa.list_(pa.float64())))
        out.append(_records(tmp_path / name, table, pub, ev, classes=[0, 1, 2], shape=[1, 2, 2],
                            max_records_per_client=10)[0])
    for u, v in zip(*out):
        np.testing.assert_array_equal(u, v)
    assert np.isfinite(out[0][0]).all()


def test_outside_the_domain_nan_is_refused_without_its_value(tmp_path):
    priv, pub, ev = digits_parts(n_private=60, n_public=40)
    write_parts(str(tmp_path), parts=(_with_cell(priv, "p9", 3, float("nan")), pub, ev))
    cfg = Config.from_dict(table_config(str(tmp_path)))
    with pytest.raises(DataError) as err:
        prepared_table(cfg)
    text = str(err.value)
    assert "NaN or infinite" in text and "Fix:" in text and "\n" not in text, text


# ------------------------------------------------------------------------ the real job
def _set_cell(value: str):
    """D / D': one private record's 'mean area' set to ``value`` (its holder unchanged)."""
    def change(rows):
        rows[40][rows[0].index("mean area")] = value
    return change


def test_a_value_of_1e300_and_of_1e30_end_alike_through_the_real_job(tmp_path, ray_session):
    """The audit's finding: 1e300 exited 2 ('finite in the file but not once standardized')
    where 1e30 ran. Now both run to the end: the same exit code 0, the same console (but for
    what the release decides), the same report.json counts, guarantees and domain, the same
    ledger rows; report.json and the console state the domain. The run's predictor clips a
    row as the job did: 1e300, 1e30 and the bound predict alike."""
    from rknn_ray.predictor import Predictor
    from tests.test_table_holders import _job, _shipped_copy, _views
    d = _job(_shipped_copy(str(tmp_path / "d"), _set_cell("1e300")), "table_central.yaml",
             ray=ray_session)
    d2 = _job(_shipped_copy(str(tmp_path / "d2"), _set_cell("1e30")), "table_central.yaml",
              ray=ray_session)
    assert d[0] == 0, "\n".join(d[1][-20:])
    assert _views(d) == _views(d2)
    domain = d[2]["privacy"]["domain"]
    assert domain == d2[2]["privacy"]["domain"]
    area = domain["columns"]["mean area"]
    assert area["from"] == "public" and area["low"] < area["high"] < 1e5
    assert "NaN" in domain["outside"] and domain["margin"] == CLIP_MARGIN
    assert any("private values: clipped" in line for line in d[1]), d[1]
    assert not any("RuntimeWarning" in line or "Traceback" in line for line in d[1] + d2[1])
    import pandas as pd
    rows = pd.read_csv(tmp_path / "d" / "private.csv").drop(columns=["label", "holder"])
    rows = pd.concat([rows.iloc[[0]]] * 3, ignore_index=True)
    rows.loc[:, "mean area"] = [1e300, 1e30, area["high"]]
    proba = Predictor.from_run(os.path.join(tmp_path, "d", "run")).predict_proba(rows)
    np.testing.assert_allclose(proba[0], proba[1])
    np.testing.assert_allclose(proba[0], proba[2], rtol=1e-5, atol=1e-6)

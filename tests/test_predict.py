"""Issue 48: a run's student applied to new rows. The featurizer fitted on the public rows and
the class names are saved beside the student as plain JSON (predictor.json, no pickle);
``RunResult.predict`` and ``rknn-ray predict`` on the raw evaluation rows reproduce the
reported student accuracy."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import rknn_ray
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.data.tables import Columns, Featurizer
from rknn_ray.errors import DataError
from rknn_ray.job import RunResult
from tests.table_files import digits_parts, table_config, write_parts

ROOT = Path(__file__).resolve().parents[1]
NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def _named(table: pa.Table, rng) -> pa.Table:
    """String labels and a text column (one-hot encoded by the featurizer)."""
    if "label" in table.column_names:
        labels = [NAMES[int(v)] for v in table.column("label").to_pylist()]
        table = table.set_column(table.column_names.index("label"), "label", pa.array(labels))
    return table.append_column("colour", pa.array(rng.choice(["red", "green", "blue"],
                                                             table.num_rows).tolist()))


def test_the_featurizer_round_trips_through_json():
    raw = np.array([[1.0, "a"], [3.0, "b"], [5.0, "a"]], dtype=object)
    f = Featurizer(Columns(("x", "c"), False, ("c",))).fit(raw)
    back = Featurizer.from_dict(json.loads(json.dumps(f.to_dict())))
    new = np.array([[2.0, "b"], [9.0, "z"]], dtype=object)     # "z": unseen, all zeros
    assert np.array_equal(back(new), f(new)) and back(new)[1, 1:].sum() == 0
    img = Featurizer(Columns(("pixels",), True), (1, 2, 2), scale=1 / 255)
    back = Featurizer.from_dict(json.loads(json.dumps(img.to_dict())))
    x = np.arange(8, dtype=np.float64).reshape(2, 4)
    assert np.array_equal(back(x), img(x)) and back.output_shape == (1, 2, 2)
    with pytest.raises(DataError, match="malformed"):
        Featurizer.from_dict({"columns": {"names": ["x"]}})


@pytest.fixture(scope="module")
def table_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("predict")
    rng = np.random.default_rng(3)
    parts = tuple(_named(t, rng) for t in digits_parts(n_private=900, n_public=400))
    write_parts(str(folder), "csv", parts)
    cfg = table_config(str(folder), "csv", classes=NAMES)
    cfg["student"]["epochs"] = 8
    cfg["data"]["name"] = "digits with names"       # the user's name for the source
    result = rknn_ray.run(cfg, out_dir=str(folder / "run"),
                          ledger=str(folder / "ledger.sqlite"))
    return folder, result


def test_run_result_predict_reproduces_the_student_accuracy(table_run):
    folder, result = table_run
    # run(..., ledger=...) from Python: the job is recorded in that ledger file
    assert result.report["privacy"]["budget"]["ledger"] == str(folder / "ledger.sqlite")
    assert result.report["privacy"]["budget"]["description"] == "table: digits with names"
    (source,) = BudgetStore(str(folder / "ledger.sqlite")).datasets()
    assert source["description"] == "table: digits with names"
    with open(result.paths["predictor"]) as fh:
        spec = json.load(fh)                       # plain JSON: public facts only
    assert spec["classes"] == NAMES and spec["table"]["id"] == "row_id"
    assert "colour" in spec["table"]["featurizer"]["columns"]["categorical"]
    evaluation = pd.read_csv(folder / "evaluation.csv")
    pred = result.predict(evaluation)              # the label column is left out
    assert list(pred.columns) == ["class", "probability"] and len(pred) == len(evaluation)
    accuracy = float((pred["class"] == evaluation["label"]).mean())
    assert accuracy == pytest.approx(result.report["student"]["test_accuracy"], abs=0.01)
    assert ((pred["probability"] > 0) & (pred["probability"] <= 1)).all()
    proba = result.predictor().predict_proba(evaluation)
    assert proba.shape == (len(evaluation), 10) and np.allclose(proba.sum(1), 1, atol=1e-5)
    public = pd.read_csv(folder / "public.csv")
    again = RunResult.from_path(result.out_dir).predict(public.head(5))
    assert list(again.columns) == ["row_id", "class", "probability"]
    assert list(again["row_id"]) == list(public["row_id"].head(5))
    with pytest.raises(DataError, match="column 'p3' not found"):
        result.predict(evaluation.drop(columns=["p3"]))


def test_rknn_ray_predict_writes_ids_classes_and_probabilities(table_run):
    folder, result = table_run
    out = folder / "pred.parquet"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "predict", result.out_dir,
                           "--input", str(folder / "public.csv"), "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=str(folder), timeout=120)
    assert done.returncode == 0, done.stderr
    frame = pd.read_parquet(out)
    assert list(frame.columns) == ["row_id", "class", "probability"] and len(frame) == 400
    assert set(frame["class"]) <= set(NAMES)
    done = subprocess.run([sys.executable, "-m", "jobs.cli", "predict", result.out_dir,
                           "--input", str(folder / "evaluation.csv"),
                           "--out", str(folder / "pred.csv")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    reported = result.report["student"]["test_accuracy"]
    said = float(done.stdout.split("column: ")[1].split()[0])
    assert said == pytest.approx(reported, abs=0.01)
    bad = subprocess.run([sys.executable, "-m", "jobs.cli", "predict", str(folder),
                          "--input", str(folder / "public.csv"), "--out", str(folder / "x.csv")],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "no predictor.json" in bad.stderr


@pytest.mark.parametrize("name,kwargs", [("raw", {}), ("pca", {"dim": 5}), ("hog", {"dim": 6}),
                                         ("hog", {"dim": 0})])
def test_a_fitted_encoder_round_trips_without_pickle(tmp_path, name, kwargs):
    from rknn_ray.job.predict import encoder_from_state, encoder_state
    from rknn_ray.representation.represent import make_encoder
    rng = np.random.default_rng(0)
    public, new = rng.random((60, 1, 8, 8), np.float32), rng.random((7, 1, 8, 8), np.float32)
    enc = make_encoder(name, **kwargs).fit(public)
    meta, arrays = encoder_state(enc)
    np.savez(tmp_path / "encoder.npz", **arrays)
    back = encoder_from_state(json.loads(json.dumps(meta)), str(tmp_path / "encoder.npz"))
    assert back.dim == enc.dim
    assert np.allclose(back.transform(new), enc.transform(new), atol=1e-6)

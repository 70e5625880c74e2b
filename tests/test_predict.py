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
    from rknn_ray.predictor import encoder_from_state, encoder_state
    from rknn_ray.representation.represent import make_encoder
    rng = np.random.default_rng(0)
    public, new = rng.random((60, 1, 8, 8), np.float32), rng.random((7, 1, 8, 8), np.float32)
    enc = make_encoder(name, **kwargs).fit(public)
    meta, arrays = encoder_state(enc)
    np.savez(tmp_path / "encoder.npz", **arrays)
    back = encoder_from_state(json.loads(json.dumps(meta)), str(tmp_path / "encoder.npz"))
    assert back.dim == enc.dim
    assert np.allclose(back.transform(new), enc.transform(new), atol=1e-6)


# ------------------------------------------------------------- issue 57: the edges of predict
def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "jobs.cli", "predict", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=120)


def _one_line_exit_2(done):
    assert done.returncode == 2, done.stdout + done.stderr
    err = done.stderr.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_a_word_in_a_numeric_column_is_the_projects_data_error(table_run, tmp_path):
    folder, result = table_run
    evaluation = pd.read_csv(folder / "evaluation.csv")
    evaluation["p3"] = evaluation["p3"].astype(object)
    evaluation.loc[5, "p3"] = "twelve"
    with pytest.raises(DataError, match="'p3' holds text where the student takes numbers"):
        result.predict(evaluation)
    evaluation.to_csv(tmp_path / "words.csv", index=False)
    err = _one_line_exit_2(_cli(result.out_dir, "--input", tmp_path / "words.csv",
                                "--out", tmp_path / "p.csv"))
    assert "'p3'" in err and "Fix:" in err and not (tmp_path / "p.csv").exists()


def test_a_header_that_is_not_utf8_is_one_line_naming_the_file(table_run, tmp_path):
    # a spreadsheet's Latin-1 export: pyarrow decodes column names only when asked
    folder, result = table_run
    lines = (folder / "evaluation.csv").read_bytes().splitlines()
    latin = tmp_path / "latin.csv"
    latin.write_bytes(b"\n".join([lines[0] + b",caf\xe9"] + [x + b",1" for x in lines[1:]]))
    os.makedirs(tmp_path / "rows")
    (tmp_path / "rows" / "a.csv").write_bytes(latin.read_bytes())
    for source in (latin, tmp_path / "rows"):
        err = _one_line_exit_2(_cli(result.out_dir, "--input", source,
                                    "--out", tmp_path / "p.csv"))
        assert f"cannot read '{source}' as csv: its column names are not UTF-8" in err, err
        assert "Fix: save the file as UTF-8" in err and not (tmp_path / "p.csv").exists()


def test_out_naming_the_input_is_refused_and_the_input_kept(table_run, tmp_path):
    folder, result = table_run
    source = tmp_path / "in.csv"
    source.write_bytes((folder / "evaluation.csv").read_bytes())
    before = source.read_bytes()
    err = _one_line_exit_2(_cli(result.out_dir, "--input", source, "--out", source))
    assert "is the --input file" in err and source.read_bytes() == before
    os.makedirs(tmp_path / "rows")
    (tmp_path / "rows" / "a.csv").write_bytes(before)
    err = _one_line_exit_2(_cli(result.out_dir, "--input", tmp_path / "rows",
                                "--out", tmp_path / "rows" / "p.csv"))
    assert "inside the --input folder" in err


def test_predictions_are_streamed_batch_by_batch_with_the_same_rows(table_run, tmp_path,
                                                                    monkeypatch):
    """The input is read a batch at a time (a 1 GB CSV took 9.9 GB read whole): batches of 7
    rows give the rows, classes and accuracy of one pass."""
    import jobs.predict as cli
    folder, result = table_run
    predictor = result.predictor()
    whole = predictor.predict(pd.read_csv(folder / "public.csv"))
    monkeypatch.setattr(cli, "BATCH_ROWS", 7)
    out = tmp_path / "p.parquet"
    rows, right, labelled = cli.predict_file(predictor, str(folder / "public.csv"), str(out),
                                             ".parquet", None, "label")
    got = pd.read_parquet(out)
    assert rows == len(whole) == len(got) and not labelled
    assert list(got["class"]) == list(whole["class"])
    # the same inputs, row for row; the student's float32 forward differs by a few ulps with the
    # batch size (7 rows vs 400: up to ~1e-5 relative measured), so not bit for bit
    np.testing.assert_allclose(got["probability"], whole["probability"], rtol=1e-4)


def _copy_run(result, tmp_path) -> Path:
    import shutil
    run = tmp_path / "copy"
    shutil.copytree(result.out_dir, run)
    return run


def _edit_predictor(run: Path, edit) -> None:
    spec = json.loads((run / "predictor.json").read_text())
    edit(spec)
    (run / "predictor.json").write_text(json.dumps(spec))


@pytest.mark.parametrize("damage,words", [
    ("mean cut", "'mean' has 5 values"),
    ("table null", "no 'table' section"),
    ("three classes", "names 3 classes"),
    ("input shape", "does not fit the run's student.pt"),
    ("student.pt cut", "student.pt is not the file the run wrote"),
    ("student.pt gone", "is missing"),
    ("not json", "is not valid JSON"),
])
def test_a_damaged_or_foreign_run_folder_is_refused_in_one_line(table_run, tmp_path, damage,
                                                                words):
    """Issue 57: each of these was a traceback, or (3 class names, input_shape [7]) ran."""
    folder, result = table_run
    run = _copy_run(result, tmp_path)
    if damage == "mean cut":
        _edit_predictor(run, lambda s: s["table"]["featurizer"].update(
            mean=s["table"]["featurizer"]["mean"][:5]))
    elif damage == "table null":
        _edit_predictor(run, lambda s: s.update(table=None))
    elif damage == "three classes":
        _edit_predictor(run, lambda s: s.update(classes=["a", "b", "c"]))
    elif damage == "input shape":
        _edit_predictor(run, lambda s: s.update(input_shape=[7]))
    elif damage == "student.pt cut":
        data = (run / "student.pt").read_bytes()
        (run / "student.pt").write_bytes(data[:len(data) // 2])
    elif damage == "student.pt gone":
        (run / "student.pt").unlink()
    else:
        (run / "predictor.json").write_text("{not json")
    with pytest.raises(DataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        RunResult.from_path(str(run)).predict(pd.read_csv(folder / "evaluation.csv"))
    err = _one_line_exit_2(_cli(run, "--input", folder / "evaluation.csv",
                                "--out", tmp_path / "p.csv"))
    assert words in err


def test_a_built_in_runs_student_given_a_table_says_it_takes_images(table_run, tmp_path):
    folder, result = table_run
    run = _copy_run(result, tmp_path)
    _edit_predictor(run, lambda s: s.update(dataset="digits", table=None, files={}))
    err = _one_line_exit_2(_cli(run, "--input", folder / "evaluation.csv",
                                "--out", tmp_path / "p.csv"))
    assert "takes images" in err and "data.dataset: table" in err


def test_a_run_folder_with_no_release_is_told_to_run_again_not_resume(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "incomplete.json").write_text("{}")
    with pytest.raises(DataError, match="released nothing") as err:
        RunResult.from_path(str(tmp_path / "run")).predict(np.zeros((1, 3)))
    assert "--resume" not in str(err.value)


def test_a_cut_encoder_file_is_a_data_error(tmp_path):
    from rknn_ray.predictor import encoder_from_state, encoder_state
    from rknn_ray.representation.represent import make_encoder
    x = np.random.default_rng(0).random((50, 1, 8, 8), dtype=np.float32)
    meta, arrays = encoder_state(make_encoder("pca", dim=5).fit(x))
    path = tmp_path / "encoder.npz"
    np.savez(path, **arrays)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match="the saved encoder is malformed"):
        encoder_from_state(meta, str(path))

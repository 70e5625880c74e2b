"""Issue 35 item 5: labels on the user's rows. labels.parquet is keyed by the user's public
row ids with the class name and the released vote margin; without public labels or without
an evaluation set the report says so instead of printing a number."""
import dataclasses
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from jobs.distill import main
from jobs.report import build_report
from rknn_ray.data import prepared
from rknn_ray.job.labels_file import NO_EVALUATION, NO_PUBLIC_LABELS, vote_margins
from rknn_ray.plots import run_summary_figure

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def test_vote_margin_is_top_minus_runner_up_of_released_counts():
    counts = np.array([[5.0, -1.0, 2.5], [0.0, 0.0, 0.0], [-3.0, -1.0, -2.0]])
    np.testing.assert_allclose(vote_margins(counts), [2.5, 0.0, 1.0])


def _user_rows(monkeypatch, ids):
    """The job's own data (digits), as a user's table would give it: public rows under
    string ids and without labels, declared class names, no evaluation set."""
    real = prepared.prepare_data

    def prepare(cfg):
        data = real(cfg)
        sp = data.splits
        n = len(sp.public_y)
        ids[:] = [f"row-{i:05d}" for i in np.random.default_rng(3).permutation(10 * n)[:n]]
        user = dataclasses.replace(
            sp, public_y=np.full(n, -1, np.int64), eval_x=sp.eval_x[:0], eval_y=sp.eval_y[:0],
            public_ids=np.array(ids, dtype=object), class_names=NAMES)
        return dataclasses.replace(data, splits=user)

    monkeypatch.setattr(prepared, "prepare_data", prepare)


def test_user_rows_get_ids_classes_margins_and_no_made_up_accuracy(ray_session, tmp_path,
                                                                    monkeypatch, capsys):
    ids: list = []
    _user_rows(monkeypatch, ids)
    out = tmp_path / "user"
    code = main(["--config", "jobs/configs/digits_central.yaml", "--out", str(out), "--quiet",
                 "--set", "student.epochs=2", "--set", "queries.restarts=1",
                 "--set", "student.trainer=local", "--set", "run.diagnostics=true",
                 "--set", "run.rng=seeded", "--insecure-seeded"])
    console = capsys.readouterr().out
    assert code == 0, console
    table = pq.read_table(out / "labels.parquet")
    assert table.column("id").to_pylist() == ids                # every public id, once, in order
    assert len(set(table.column("id").to_pylist())) == len(ids)
    assert "true_label" not in table.column_names and "public_index" not in table.column_names
    labels = table.column("label").to_numpy()
    assert table.column("class").to_pylist() == [NAMES[i] for i in labels]
    with np.load(out / "release.npz") as release:               # margins from the release only
        counts = release["counts_0"]
    q = table.column("query").to_numpy()
    top2 = np.sort(counts, axis=1)[:, -2:]
    np.testing.assert_allclose(table.column("margin").to_numpy(), (top2[:, 1] - top2[:, 0])[q])

    report = json.loads((out / "report.json").read_text())
    acc = report["accuracy"]
    assert acc["student"] is None and report["student"]["test_accuracy"] is None
    assert acc["labels"] is None and acc["query_labels"] is None
    assert acc["not_measured"] == {"student": NO_EVALUATION, "labels": NO_PUBLIC_LABELS,
                                   "query_labels": NO_PUBLIC_LABELS}
    assert report["diagnostics"]["nonprivate_labels"] is None
    assert (out / "student.pt").stat().st_size > 0             # the student is still trained
    assert NO_EVALUATION in console and "nan" not in console.lower()
    assert pq.read_table(out / "diagnostics" / "nonprivate_labels.parquet") \
        .column("id").to_pylist() == ids

    text, html_file = build_report(str(out))
    assert re.search(rf"student accuracy \(evaluation set\) +{NO_EVALUATION}", text)
    assert NO_EVALUATION in open(html_file).read()
    fig = run_summary_figure(report, [], np.zeros(0), np.zeros(0, bool), None)
    # the reasons under the bars (the x label), not a bar of 0.000
    shown = [t.get_text() for ax in fig.axes for t in ax.texts] + \
        [ax.get_xlabel() for ax in fig.axes]
    assert any(NO_EVALUATION in t for t in shown) and "0.000" not in shown


@pytest.mark.parametrize("public_y", [np.array([0, 1, 1, -1]), np.array([-1, -1, -1, -1])])
def test_label_accuracy_counts_only_labelled_public_rows(public_y):
    from rknn_ray.labeling.labels import accuracy
    got = accuracy(np.array([0, 1, 0, 2]), public_y)
    assert (got == pytest.approx(2 / 3)) if (public_y >= 0).any() else np.isnan(got)


def test_builtin_rows_keep_row_numbers_and_a_partial_truth_is_null_where_missing():
    """Without public_ids / class_names (the built-in sets): ids are row numbers, classes the
    indices as text; a public row without a label (-1) has a null true_label."""
    from rknn_ray.data.splits import Splits
    from rknn_ray.job.labels_file import labels_table
    from rknn_ray.labeling.queries import QuerySet
    from rknn_ray.labeling.stage import derive_labels
    counts = np.array([[9.0, 1.0, 0.0], [2.0, 3.5, 4.0]])
    qs = QuerySet(np.zeros((2, 2), np.float32), np.array([0, 3]), np.array([0, 1, 1, 0, 1]), 0.0)
    public_y = np.array([0, 2, -1, 0, 1])
    lab = derive_labels(counts, qs, public_y, "soft")
    x = np.zeros((5, 2), np.float32)
    sp = Splits("t", "stratified", 0, x, public_y, x, public_y, x[:0], public_y[:0], 3, (2,))
    table = labels_table(sp, 3, counts, qs, lab)
    assert table.column("id").to_pylist() == [0, 1, 2, 3, 4]
    assert table.column("class").to_pylist() == ["0", "2", "2", "0", "2"]
    assert table.column("true_label").to_pylist() == [0, 2, None, 0, 1]
    assert table.column("margin").to_pylist() == [8.0, 0.5, 0.5, 8.0, 0.5]
    assert lab.label_accuracy == pytest.approx(3 / 4)          # the unlabelled row is not counted


@pytest.mark.parametrize("name,kwargs", [("raw", {}), ("pca", {"dim": 6}), ("hog", {"dim": 5}),
                                         ("hog", {})])
def test_encoders_map_an_absent_evaluation_set_to_zero_rows(name, kwargs):
    """student.input: features maps the evaluation images with the public encoder: with no
    evaluation set (0 rows) that is a (0, dim) array, not a reshape error."""
    from rknn_ray.representation.represent import make_encoder
    x = np.random.default_rng(0).random((40, 1, 8, 8), dtype=np.float32)
    enc = make_encoder(name, **kwargs).fit(x)
    assert enc.transform(x[:0]).shape == (0, enc.dim) == (0, enc.transform(x[:2]).shape[1])


@pytest.mark.parametrize("user_id,column", [("row_id", "row_id"), ("label", "id"), (None, "id")])
def test_labels_parquet_keeps_the_users_id_column_name_unless_it_is_one_of_its_own(user_id,
                                                                                    column):
    """Issue 57: labels.parquet named the user's id column ``id`` while predict kept the
    user's name. Now both keep it; a name labels.parquet uses for its own columns (or no id
    column: row numbers) gives ``id``; the schema's metadata names the column either way."""
    from rknn_ray.data.splits import Splits
    from rknn_ray.job.labels_file import labels_table
    from rknn_ray.labeling.queries import QuerySet
    from rknn_ray.labeling.stage import derive_labels
    counts = np.array([[9.0, 1.0], [2.0, 3.5]])
    qs = QuerySet(np.zeros((2, 2), np.float32), np.array([0, 2]), np.array([0, 1, 1]), 0.0)
    lab = derive_labels(counts, qs, np.array([-1, -1, -1]), "hard")
    x = np.zeros((3, 2), np.float32)
    ids = None if user_id is None else np.array(["a", "b", "c"], dtype=object)
    sp = Splits("t", "table", 0, x, np.full(3, -1), x, np.full(3, -1), x[:0], np.zeros(0, int),
                2, (2,), public_ids=ids,
                table_input=None if user_id is None else {"id": user_id})
    table = labels_table(sp, 2, counts, qs, lab)
    assert table.schema.metadata[b"id_column"] == column.encode()
    assert table.column(column).to_pylist() == (["a", "b", "c"] if ids is not None else [0, 1, 2])
    assert table.column_names.count(column) == 1

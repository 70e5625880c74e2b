"""jobs.compare on digits with a few fast baselines: the files, the rows, the ledger."""
import json
import os
import sqlite3

import pytest

from jobs import compare
from jobs.experiments import ROW_FIELDS


def test_compare_writes_table_files_and_ledger(tmp_path, capsys, ray_session):
    out = tmp_path / "cmp"
    rc = compare.main(["--dataset", "digits", "--eps", "1", "4", "--methods", "pate_gnmax",
                       "dpdfd_selective_rr", "private_knn", "--out", str(out),
                       "--student-epochs", "1", "--json"])
    assert rc == 0
    printed = json.loads(capsys.readouterr().out)
    rows = json.loads((out / "compare.json").read_text())
    assert printed == rows and len(rows) == 6
    for r in rows:
        # the one row schema, less its NOT PRIVATE fields (only with --diagnostics, elsewhere)
        assert set(compare.COLUMNS) <= set(r)
        assert set(ROW_FIELDS) - set(compare.NOT_PRIVATE_FIELDS) <= set(r)
        assert "nonprivate_label_accuracy" not in r
        assert not r["error"], r["error"]
        assert r["unit"] == ("label" if r["method"] == "dpdfd_selective_rr" else "record")
        assert r["eps"] <= r["target_eps"] * (1 + 1e-9)
        assert r["delta"] == (0.0 if r["method"] == "dpdfd_selective_rr" else 1e-5)
        # a baseline's row fills the schema from its release, as an rknn row does from its run
        assert r["model"] == "central" and r["mechanism"] and r["ledger_events"] == 1
        assert "details" not in r
    for name in ("compare.csv", "compare.md", "compare.png", "meta.json", "ledgers.json"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "meta.json").read_text())["complete"] is True
    ledgers = json.loads((out / "ledgers.json").read_text())
    assert sorted(ledgers) == sorted(f"{m}@{e}" for m in ("pate_gnmax", "dpdfd_selective_rr",
                                                          "private_knn") for e in (1, 4))
    assert ledgers["pate_gnmax@1"]["details"]["noise"] > 0
    # figures read from the exact private votes stay out without --diagnostics
    text = (out / "ledgers.json").read_text()
    for name in ("plurality_accuracy", "noiseless_vote_accuracy", "teacher_query_accuracy",
                 "data_dependent_eps"):
        assert name not in text, name
    assert not (out / "diagnostics").exists()
    assert len(ledgers["private_knn@4"]["ledger"]["entries"]) == 1
    assert "| label |" in (out / "compare.md").read_text()
    assert (out / "compare.csv").read_text().splitlines()[0].startswith("method,dataset,eps")
    # every release of every method is an event in the compare's own ledger
    with sqlite3.connect(out / "ledger.sqlite") as con:
        events = [json.loads(e) for (e,) in con.execute(
            "SELECT event FROM releases WHERE status = 'released'")]
    assert sorted(e["type"] for e in events) == sorted(   # standard events, no computed eps
        ["SelfComposedDpEvent"] * 4 + ["SelectiveRRDpEvent"] * 2)
    # the caller's ledger setting is back as it was
    assert os.environ["RKNN_RAY_LEDGER"] != str(out / "ledger.sqlite")


def test_compare_failed_cell_is_a_row_not_a_crash(tmp_path, ray_session):
    rows = compare.compare("digits", [1e-4], ["fedmd_nfdp"], str(tmp_path / "c"),
                           student_epochs=1, log=lambda s: None)
    assert len(rows) == 1 and "k=1" in rows[0]["error"]
    assert set(ROW_FIELDS) - set(compare.NOT_PRIVATE_FIELDS) <= set(rows[0])
    assert rows[0]["target_eps"] == 1e-4 and "nonprivate_label_accuracy" not in rows[0]
    # its reservation is settled as the main job settles one (rknn_ray.job.rounds): counted
    # as spent (a release may have happened), none left open for `rknn-ray budget settle`
    with sqlite3.connect(tmp_path / "c" / "ledger.sqlite") as con:
        states = con.execute("SELECT status, note FROM releases").fetchall()
    assert [s for s, _ in states] == ["released"] and "fedmd_nfdp failed" in states[0][1]


def test_cli_dispatches_compare(monkeypatch):
    from jobs import cli
    seen = {}
    monkeypatch.setattr(compare, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    cli.main(["compare", "--dataset", "digits", "--out", "x"])
    assert seen["argv"] == ["--dataset", "digits", "--out", "x"]


@pytest.mark.parametrize("ds,model", [("digits", "central"), ("fashion_mnist", "shuffle")])
def test_rknn_configs_exist(ds, model):
    assert os.path.isfile(compare.config_path(ds, model))


def test_rknn_row_is_a_full_distill_run_with_its_ledger_event(tmp_path, ray_session):
    """An rknn cell: a real jobs.distill run (actors, sealed reports) whose student is trained
    in the driver (student.trainer=local), with (--diagnostics) the noise-free reference labels
    beside it and its release recorded as an event in the compare's ledger."""
    ledger = tmp_path / "ledger.sqlite"
    row = compare.run_rknn("digits", "local", 4.0, 1e-5, str(tmp_path / "run"), str(ledger),
                           student_epochs=1, diagnostics=True)
    assert set(compare.COLUMNS) <= set(row) and row["method"] == "rknn_local"
    assert set(ROW_FIELDS) <= set(row) and row["mechanism"] and row["ledger_events"] == 1
    assert row["eps"] == 4.0 and row["unit"] == "record" and row["model"] == "local"
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["student"]["trainer"] == "local" and report["student"]["epochs"] == 1
    assert os.path.isfile(report["student"]["checkpoint"])
    # s = 10 queries: the noise-free labels are the row's reference (digits: 0.80)
    assert 0.7 < row["nonprivate_label_accuracy"] <= 1.0
    assert row["nonprivate_label_accuracy"] == report["diagnostics"]["nonprivate_labels"]
    assert (tmp_path / "run" / "diagnostics" / "README.txt").is_file()
    with sqlite3.connect(ledger) as con:
        events = [json.loads(e) for (e,) in con.execute(
            "SELECT event FROM releases WHERE status = 'released'")]
    assert [e["type"] for e in events] == ["LocalRandomizerDpEvent"]


def test_nonprivate_values_only_under_diagnostics_and_named_not_private(tmp_path):
    """compare.json/csv/md never carry the labels from exact counts; --diagnostics runs the
    rknn rows with run.diagnostics and writes them to an owner-only diagnostics/ whose README
    says NOT PRIVATE."""
    assert "run.diagnostics=true" not in compare.RKNN_OVERRIDES
    assert compare.rknn_config("digits", "central", 1.0, 1e-5).run.diagnostics is False
    assert compare.rknn_config("digits", "central", 1.0, 1e-5, diagnostics=True).run.diagnostics
    assert compare.parse_args(["--out", "x", "--diagnostics"]).diagnostics
    assert not compare.parse_args(["--out", "x"]).diagnostics
    rows = [{**dict.fromkeys(compare.COLUMNS, ""), "method": "rknn_central", "target_eps": 1.0,
             "eps": 1.0, "delta": 0.0, "accuracy": 0.9, "label_accuracy": 0.88, "unit": "record",
             "wall_s": 3.0, "nonprivate_label_accuracy": 0.95}]
    meta = {"dataset": "digits", "delta": 1e-5, "wall_s": 3.0, "cpus": 2}
    for diagnostics in (False, True):
        out = tmp_path / f"d{diagnostics}"
        compare.write_outputs(str(out), rows, {**meta, "diagnostics": diagnostics}, {},
                              {"pate_gnmax@1": {"plurality_accuracy": 0.97}})
        for name in ("compare.json", "compare.csv", "compare.md"):
            text = (out / name).read_text()
            assert "nonprivate" not in text and "0.95" not in text, name
        assert (out / "diagnostics").is_dir() == diagnostics
    diag = tmp_path / "dTrue" / "diagnostics"
    assert (diag / "README.txt").read_text().startswith("NOT PRIVATE")
    assert oct(diag.stat().st_mode & 0o777) == "0o700"
    assert "rknn_central,1.0,0.88,0.95" in (diag / "nonprivate_labels.csv").read_text()
    assert json.loads((diag / "baselines.json").read_text()) == {
        "private": False, "runs": {"pate_gnmax@1": {"plurality_accuracy": 0.97}}}
    assert "0.97" not in (tmp_path / "dFalse" / "ledgers.json").read_text()
    assert "NOT PRIVATE" in (tmp_path / "dTrue" / "compare.md").read_text()


def test_footnotes_only_for_rows_in_the_table():
    row = {"method": "rknn_central", "unit": "record", "error": ""}
    assert compare.footnotes([row], {}) == []
    notes = compare.footnotes([row, {"method": "dpdfd_selective_rr", "unit": "label", "error": ""},
                               {"method": "fedmd_nfdp", "unit": "record", "error": "boom"}], {})
    assert any("DP-DFD" in n for n in notes) and any("FedMD-NFDP" in n for n in notes)
    assert any("error" in n for n in notes)

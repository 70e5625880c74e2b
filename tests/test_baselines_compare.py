"""jobs.compare on digits with a few fast baselines: the files, the rows, the ledger."""
import json
import os
import sqlite3

import pytest

from jobs import compare


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
        assert set(compare.COLUMNS) <= set(r)
        assert not r["error"], r["error"]
        assert r["unit"] == ("label" if r["method"] == "dpdfd_selective_rr" else "record")
        assert r["eps"] <= r["target_eps"] * (1 + 1e-9)
        assert r["delta"] == (0.0 if r["method"] == "dpdfd_selective_rr" else 1e-5)
    for name in ("compare.csv", "compare.md", "compare.png", "meta.json", "ledgers.json"):
        assert (out / name).stat().st_size > 0
    assert json.loads((out / "meta.json").read_text())["complete"] is True
    assert "| label |" in (out / "compare.md").read_text()
    assert (out / "compare.csv").read_text().splitlines()[0].startswith("method,dataset,eps")
    # every release of every method is an event in the compare's own ledger
    with sqlite3.connect(out / "ledger.sqlite") as con:
        events = [json.loads(e) for (e,) in con.execute(
            "SELECT event FROM releases WHERE status = 'released'")]
    assert sorted(e["type"] for e in events) == sorted(
        ["PateDpEvent"] * 2 + ["SelectiveRRDpEvent"] * 2 + ["PrivateKnnDpEvent"] * 2)
    # the caller's ledger setting is back as it was
    assert os.environ["RKNN_RAY_LEDGER"] != str(out / "ledger.sqlite")


def test_compare_failed_cell_is_a_row_not_a_crash(tmp_path, ray_session):
    rows = compare.compare("digits", [1e-4], ["fedmd_nfdp"], str(tmp_path / "c"),
                           student_epochs=1, log=lambda s: None)
    assert len(rows) == 1 and "k=1" in rows[0]["error"]


def test_cli_dispatches_compare(monkeypatch):
    from jobs import cli
    seen = {}
    monkeypatch.setattr(compare, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    cli.main(["compare", "--dataset", "digits", "--out", "x"])
    assert seen["argv"] == ["--dataset", "digits", "--out", "x"]


@pytest.mark.parametrize("ds,model", [("digits", "central"), ("fashion_mnist", "shuffle")])
def test_rknn_configs_exist(ds, model):
    assert os.path.isfile(compare.config_path(ds, model))

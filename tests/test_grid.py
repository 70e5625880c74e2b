"""jobs.grid on real digits runs: the files, the table, the NOT PRIVATE reference, resuming."""
import csv
import io
import json
import os
import sqlite3

import pytest

from jobs import grid
from rknn_ray.errors import ConfigError

FAST = ["student.num_workers=1", "queries.restarts=1", "student.epochs=2", "student.trainer=local"]
DEFAULT = grid.parse_args(["--out", "x"]).config


@pytest.fixture(scope="module")
def digits_grid(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("grid")
    out = tmp / "g"
    saved = os.environ.get("RKNN_RAY_LEDGER")
    user_ledger = os.environ["RKNN_RAY_LEDGER"] = str(tmp / "user-ledger.sqlite")
    lines = []
    try:
        doc = grid.grid(grid.GridSpec(DEFAULT, tuple(FAST), eps=[0.5, 2]), str(out),
                        log=lines.append)
        yield out, doc, lines, user_ledger
    finally:
        if saved is None:
            os.environ.pop("RKNN_RAY_LEDGER", None)
        else:
            os.environ["RKNN_RAY_LEDGER"] = saved


def test_grid_writes_table_files(digits_grid):
    out, doc, lines, user_ledger = digits_grid
    for name in ("grid.json", "grid.csv", "grid.md", "grid.png", "meta.json", "ledger.sqlite"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "grid.json").read_text()) == json.loads(json.dumps(doc, default=str))
    assert doc["meta"]["complete"] and doc["meta"]["dataset"] == "digits"
    cells, summary = doc["cells"], doc["summary"]
    assert [c["target_eps"] for c in cells] == [0.5, 2.0] and len(summary) == 2
    for c in cells:
        assert not c["error"], c["error"]
        assert c["eps"] == pytest.approx(c["target_eps"]) and c["delta"] == 0.0
        assert c["unit"] == "record" and c["private"] is True
        assert (c["s_used"], c["k_used"]) == (60, 1) and 0 <= c["accuracy"] <= 1
        assert os.path.isfile(os.path.join(c["run"], "report.json"))
    for s in summary:                  # one seed: the median is that seed's value
        cell = next(c for c in cells if c["target_eps"] == s["target_eps"])
        assert s["accuracy"] == cell["accuracy"] and s["seeds"] == 1
        assert (s["encoder"], s["s"], s["k"], s["model"]) == ("pca", 60, 1, "central/laplace")
        assert s["paper_accuracy"] is None          # paper 000 has no digits rows
    table = list(csv.DictReader(io.StringIO((out / "grid.csv").read_text())))
    assert len(table) == 2 and list(table[0]) == list(grid.SUMMARY_COLUMNS)
    assert float(table[0]["accuracy"]) == summary[0]["accuracy"]
    md = (out / "grid.md").read_text()
    assert "| pca | 60 | 1 | central/laplace | 0.5 / 0.5 |" in md and "## Per seed" in md
    assert sum("skipped" not in ln for ln in lines if ln.startswith("[")) == 3   # 2 cells + 1 ref
    # every release in the grid's own ledger, none in the caller's
    with sqlite3.connect(out / "ledger.sqlite") as con:
        assert con.execute("SELECT COUNT(*) FROM releases WHERE status = 'released'").fetchone()[0] == 2
    assert not os.path.exists(user_ledger)


def test_reference_is_labeled_not_private_and_kept_out_of_runs(digits_grid):
    out, doc, _, _ = digits_grid
    (ref,) = doc["reference"]
    assert ref["private"] is False and "NOT PRIVATE" in ref["warning"] and not ref["error"]
    assert (ref["s"], ref["k"]) == (60, 1) and 0 <= ref["accuracy"] <= 1
    assert "NOT PRIVATE" in (out / "reference" / ref["name"] / "README.txt").read_text()
    for s in doc["summary"]:
        assert s["reference_accuracy"] == ref["accuracy"]
        assert s["reference_label_accuracy"] == ref["label_accuracy"]
    assert "NOT PRIVATE" in doc["reference_note"]
    md = (out / "grid.md").read_text()
    assert "NOT PRIVATE ref. student" in md and "**reference_* columns are NOT PRIVATE" in md
    for c in doc["cells"]:           # private run folders: no diagnostics, no reference values
        assert not os.path.exists(os.path.join(c["run"], "diagnostics"))
        report = json.loads(open(os.path.join(c["run"], "report.json")).read())
        assert "diagnostics" not in report and report["accuracy"]["nonprivate_labels"] is None


def test_grid_resumes_without_rerunning(digits_grid):
    out, doc, _, _ = digits_grid
    lines = []
    again = grid.grid(grid.GridSpec(DEFAULT, tuple(FAST), eps=[0.5, 2]), str(out),
                      log=lines.append)
    progress = [ln for ln in lines if ln.startswith("[")]
    assert len(progress) == 3 and all("done before, skipped" in ln for ln in progress)
    assert again["cells"] == json.loads(json.dumps(doc["cells"]))
    assert again["reference"] == json.loads(json.dumps(doc["reference"]))
    with sqlite3.connect(out / "ledger.sqlite") as con:      # nothing released again
        assert con.execute("SELECT COUNT(*) FROM releases WHERE status = 'released'").fetchone()[0] == 2


def test_grid_cli_prints_the_table_of_a_finished_grid(digits_grid, capsys):
    """`rknn-ray grid` on a finished grid: every cell read back, the markdown table printed."""
    out = digits_grid[0]
    sets = [arg for s in FAST for arg in ("--set", s)]
    assert grid.main(["--out", str(out), "--eps", "0.5", "2", *sets]) == 0
    captured = capsys.readouterr()
    assert "## Per seed" in captured.out and "| pca | 60 | 1 | central/laplace |" in captured.out
    assert captured.err.count("done before, skipped") == 3


@pytest.mark.parametrize("args,match", [
    (["--eps", "0"], "'--eps'.*eps must be a finite number > 0"),
    (["--eps", "-1"], "'--eps'.*> 0"),
    (["--set", "privacy.epz=1"], "privacy.epz.*unknown key.*did you mean 'privacy.eps'"),
    (["--s", "30", "--k", "40"], "rknn.k.*in grid cell pca_s30_k40"),
    (["--model", "central/rr"], "privacy.mechanism.*not a central mechanism"),
    (["--encoder", "pca:x"], "--encoder.*NAME:DIM"),
    (["--set", "run.rng=seeded"], "run.rng.*--insecure-seeded"),
    (["--concurrent", "0"], "'--concurrent'.*not a positive number"),
])
def test_bad_input_is_refused_before_anything_runs(tmp_path, capsys, args, match):
    import re
    out = tmp_path / "bad"
    assert grid.main(["--out", str(out), *args]) == 2
    assert re.search(match, capsys.readouterr().err)
    assert not out.exists()


def test_empty_grid_is_refused():
    with pytest.raises(ConfigError, match="'--eps': is empty: the grid would have no cells"):
        grid.plan(grid.GridSpec(DEFAULT, eps=[]))


def test_plan_axes_and_model_defaults():
    base, cells, axes = grid.plan(grid.GridSpec(
        DEFAULT, encoders=["pca", "hog:16"], s=["auto", "30"], k=["1"],
        models=["central", "shuffle", "local/rr"], eps=[1], seeds=[0, 1], delta=1e-6))
    assert len(cells) == 2 * 2 * 1 * 3 * 1 * 2
    assert axes["model"] == ["central/laplace", "shuffle/collision", "local/rr"]
    assert axes["s"] == ["auto", 30]
    shuffle = next(cfg for c, cfg in cells if c.model == "shuffle/collision")
    assert shuffle.privacy.delta == 1e-6 and shuffle.privacy.budget_eps == 100
    hog = next(cfg for c, cfg in cells if c.encoder == "hog:16")
    assert (hog.represent.encoder, hog.represent.dim) == ("hog", 16)
    assert len({c.name for c, _ in cells}) == len(cells)


def test_cli_dispatches_grid(monkeypatch):
    from jobs import cli
    seen = {}
    monkeypatch.setattr(grid, "main", lambda argv: seen.setdefault("argv", argv) and 0)
    cli.main(["grid", "--out", "x"])
    assert seen["argv"] == ["--out", "x"]


def test_paper_numbers_side_by_side_where_the_dataset_matches(tmp_path):
    """The summary of an MNIST grid puts Table 1's Ours row at the same eps beside it."""
    cells = [grid.Cell("hog:64", 40, 1, "central/laplace", e, 0) for e in (0.1, 0.5)]
    rows = {c.name: {"encoder": c.encoder, "s": c.s, "k": c.k, "model": c.model,
                     "target_eps": c.eps, "seed": 0, "wall_s": 1.0, "error": "", "eps": c.eps,
                     "delta": 0.0, "unit": "record", "accuracy": 0.9, "label_accuracy": 0.8,
                     "s_used": 40, "k_used": 1} for c in cells}
    summary = grid.summarize(cells, rows, {}, {}, "mnist")
    assert summary[0]["paper_accuracy"] == 0.991 and summary[0]["paper_label_accuracy"] == 0.985
    assert "paper [general] s=40" in summary[0]["paper_setting"]
    assert summary[1]["paper_accuracy"] is None              # no Table 1 row at eps = 0.5
    meta = {"dataset": "mnist", "config": "mnist_general_eps0.1.yaml", "cells": 2, "cpus": 2,
            "axes": {"seed": [0]}, "wall_s": 1.0, "complete": True, "reference": False}
    md = grid.to_markdown(summary, list(rows.values()), [], meta)
    assert "| 0.991 | 0.985 |" in md and "NOT PRIVATE ref." not in md
    grid.plot(summary, str(tmp_path / "g.png"), "mnist")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_sigterm_to_the_grid_is_one_line_exit_143_that_says_how_to_go_on(tmp_path, ray_session):
    """`rknn-ray grid` stopped by SIGTERM after its first cell, as a job is (jobs.signals):
    one line that says what is kept and how to go on, exit 143, no Ray stack dump ("***
    SIGTERM received", Ray's own handler, printed before), no traceback. A real process that
    joins this session's Ray (as under `ray job submit`)."""
    import signal
    import subprocess
    import sys
    import time
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "g"
    env = {**os.environ, "RKNN_RAY_LEDGER": str(tmp_path / "ledger.sqlite"),
           "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address, "PYTHONPATH": root}
    sets = [arg for s in FAST for arg in ("--set", s)]
    proc = subprocess.Popen([sys.executable, "-m", "jobs.grid", "--out", str(out), "--eps", "0.5",
                             "1", "2", "4", "--no-reference", *sets], cwd=root, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    try:
        end = time.monotonic() + 240
        while time.monotonic() < end:
            line = proc.stdout.readline()
            lines.append(line)
            if not line or line.startswith("[1/4]"):
                break
        assert lines[-1].startswith("[1/4]"), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + rest
    assert proc.returncode == 143, text
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert errors == [f"error: interrupted by SIGTERM; the cells that finished are kept in "
                      f"{out}. Fix: run the same command again: it skips them and runs the rest"]
    assert "SIGTERM received" not in text and "Traceback" not in text, text
    assert (out / "runs").is_dir()

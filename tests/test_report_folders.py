"""rknn-ray report on run folders of every trust model and mechanism, unfinished runs and
folders of runs, without Ray: the run folders are written here the way jobs.distill writes them."""
import base64
import json
import os
import re

import matplotlib
import pytest

matplotlib.use("Agg")

from jobs.cli import main as cli_main  # noqa: E402
from jobs.report import ReportError, build_report, find_runs, main  # noqa: E402
from rknn_ray.mechanisms import available  # noqa: E402
from tests.run_folders import write_png, write_run  # noqa: E402


def _embedded_pngs(html_text):
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"',
                                                    html_text)]


def _self_contained(html_text):
    """No reference to anything outside the file (links to files, scripts, styles, the web)."""
    assert not re.search(r'(src|href)="(?!data:)', html_text)
    assert "<script" not in html_text


MECHANISMS = [(model, name) for model, names in sorted(available().items()) for name in sorted(names)]


@pytest.mark.parametrize("model,mechanism", MECHANISMS)
def test_run_report_for_every_mechanism(tmp_path, model, mechanism, capsys):
    delta = 0.0 if model != "shuffle" else 1e-6
    run = write_run(str(tmp_path / "run"), model, mechanism, eps=2.0, delta=delta,
                    shuffler=model == "shuffle")
    assert main([run]) == 0
    out = capsys.readouterr().out
    for needle in (f"trust model       {model}", f"mechanism         {mechanism}",
                   f"eps = 2, delta = {0 if not delta else '1e-06'}", "record-level, replace-one",
                   "student accuracy (evaluation set)  0.9331", "private records      1,079",
                   "reports rejected     tampered 2", "student                         31.0 s",
                   f"report: {run}/report.html"):
        assert needle in out, (needle, out)
    if model == "shuffle":
        assert "round 1 shuffled     1,079 messages from 1,079 senders" in out
    html_text = open(os.path.join(run, "report.html")).read()
    _self_contained(html_text)
    pngs = _embedded_pngs(html_text)
    assert len(pngs) == 1 and pngs[0][:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{model}/{mechanism}" in html_text and "0.933" in html_text


def test_diagnostics_are_named_but_embedded_only_when_asked(tmp_path, capsys):
    run = write_run(str(tmp_path / "diag"), "central", "laplace", diagnostics=True)
    text, written = build_report(run)
    assert "NOT private, do not share (not embedded here)" in text
    assert "non-private label accuracy [diagnostics, NOT private]" in text
    assert len(_embedded_pngs(open(written).read())) == 1
    text, written = build_report(run, out=str(tmp_path / "with-diag.html"), include_diagnostics=True)
    page = open(written).read()
    assert len(_embedded_pngs(page)) == 2
    assert "includes NOT private diagnostics" in page and "Do not share this page" in page


def test_unfinished_run_says_how_to_finish(tmp_path, capsys):
    run = tmp_path / "broken"
    run.mkdir()
    (run / "incomplete.json").write_text(json.dumps({"error": "interrupted (SIGINT)",
                                                     "release_saved": True}))
    (run / "release.npz").write_bytes(b"x")
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "unfinished" in out and "interrupted (SIGINT)" in out
    assert f"python -m jobs.distill --resume {run}" in out
    assert "did not finish" in (run / "report.html").read_text()


def test_folder_of_runs_compares_them_and_shows_the_folder_results(tmp_path, capsys):
    grid = tmp_path / "grid"
    write_run(str(grid / "eps0.5"), "central", "laplace", eps=0.5)
    write_run(str(grid / "eps1"), "central", "laplace", eps=1.0)
    write_run(str(grid / "local" / "collision"), "local", "collision", eps=4.0)
    (grid / "deep" / "a" / "b" / "c").mkdir(parents=True)         # below the search depth
    write_run(str(grid / "deep" / "a" / "b" / "c" / "run"), "central", "laplace")
    (grid / "compare.json").write_text(json.dumps({"runs": ["eps0.5", "eps1"], "metric": "student"}))
    (grid / "grid.csv").write_text("eps,student\n0.5,0.91\n1,0.93\n")
    (grid / "table.txt").write_text("eps  student\n0.5  0.91\n")
    write_png(str(grid / "accuracy_vs_eps.png"))
    (grid / "notes.bin").write_bytes(b"\x00\x01")                     # ignored
    assert [os.path.relpath(p, grid) for p in find_runs(str(grid))] == \
        ["eps0.5", "eps1", os.path.join("local", "collision")]
    assert cli_main(["report", str(grid)]) == 0                        # through the console script
    out = capsys.readouterr().out
    assert "3 run(s)" in out and "grid.csv: 2 rows x 2 columns" in out and "compare.json" in out
    rows = [ln for ln in out.splitlines() if ln.startswith(("eps0.5", "eps1", "local"))]
    assert len(rows) == 3 and "collision" in rows[2] and "0.9331" in rows[0]
    page = (grid / "report.html").read_text()
    _self_contained(page)
    assert len(_embedded_pngs(page)) == 5          # the folder's plot, the comparison, one per run
    assert "<h2>Comparison</h2>" in page
    assert "&quot;metric&quot;: &quot;student&quot;" in page and '<td class="num">0.91</td>' in page
    assert "<details><summary>compare.json (raw JSON" in page       # raw data folded away


def test_run_folder_under_a_run_is_not_a_run(tmp_path):
    run = write_run(str(tmp_path / "r"), "central", "laplace")
    os.makedirs(os.path.join(run, "student-1234", "checkpoint_x"))
    with open(os.path.join(run, "student-1234", "checkpoint_x", "report.json"), "w") as f:
        f.write("{}")
    assert find_runs(str(tmp_path)) == [run]


def test_nothing_to_report_is_an_error(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert "holds no run folder" in capsys.readouterr().err
    assert main([str(tmp_path / "missing")]) == 2
    with pytest.raises(ReportError):
        build_report(str(tmp_path))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "report.json").write_text("{not json")
    assert main([str(bad)]) == 2
    assert "error:" in capsys.readouterr().err


def test_no_html_prints_only(tmp_path, capsys):
    run = write_run(str(tmp_path / "r"), "local", "rr", eps=4.0)
    assert main([run, "--no-html"]) == 0
    assert not os.path.exists(os.path.join(run, "report.html"))
    assert "report:" not in capsys.readouterr().out


@pytest.mark.parametrize("config", sorted(f for f in os.listdir("jobs/configs") if f.endswith(".yaml")))
def test_report_for_every_named_config(tmp_path, config, capsys):
    """A run folder shaped by each named config (its trust model, mechanism, eps, delta and
    resolved config); the digits ones also run for real in test_report_runs.py."""
    from rknn_ray.config import load_config
    cfg = load_config(os.path.join("jobs/configs", config))
    p = cfg.privacy
    run = write_run(str(tmp_path / config[:-5]), p.model, p.mechanism, eps=p.eps,
                    delta=p.delta or 0.0, shuffler=p.model == "shuffle")
    rep_path = os.path.join(run, "report.json")
    report = json.load(open(rep_path))
    report["config"] = cfg.to_dict()
    json.dump(report, open(rep_path, "w"))
    assert main([run]) == 0
    out = capsys.readouterr().out
    assert f"trust model       {p.model}" in out and f"dataset              {cfg.data.dataset}" in out
    assert (tmp_path / config[:-5] / "report.html").exists()

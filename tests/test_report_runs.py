"""rknn-ray report on real run folders (digits central / local / shuffle through Ray, one
student epoch each), and the HTML it writes rendered by headless Chromium."""
import json
import os
import shutil
import subprocess

import pytest

from jobs.report import main as report_main

CONFIGS = ["digits_central.yaml", "digits_local.yaml", "digits_shuffle.yaml"]


@pytest.fixture(scope="module")
def runs(digits_runs):
    """The three digits configs, run once per session into one folder of runs (conftest)."""
    return digits_runs


@pytest.mark.parametrize("config", CONFIGS)
def test_report_of_a_real_run(runs, config, capsys):
    run = runs / config[:-5]
    report = json.loads((run / "report.json").read_text())
    assert report_main([str(run)]) == 0
    out = capsys.readouterr().out
    p = report["privacy"]
    assert f"trust model       {p['model']}" in out and f"mechanism         {p['mechanism']}" in out
    assert f"student accuracy (evaluation set)  {report['accuracy']['student']:.4g}" in out
    assert f"clients              {report['counts']['clients']:,}" in out
    html_text = (run / "report.html").read_text()
    assert "data:image/png;base64," in html_text and 'src="http' not in html_text
    # each run has a ledger of its own: the budget line names the command with its --ledger
    ledger = p["budget"]["ledger"]
    assert f"`rknn-ray budget --ledger {ledger}` shows its budget and spend" in out


def test_report_of_the_folder_of_runs(runs, capsys):
    assert report_main([str(runs)]) == 0
    out = capsys.readouterr().out
    assert "3 run(s)" in out
    for name in ("digits_central", "digits_local", "digits_shuffle"):
        assert any(line.startswith(name) for line in out.splitlines()), name
    assert (runs / "report.html").stat().st_size > 10_000


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


@pytest.mark.skipif(_chromium() is None, reason="no headless Chromium here (apt-get install chromium)")
def test_report_html_renders_in_headless_chromium(runs, tmp_path):
    from PIL import Image
    run = runs / "digits_central"
    assert report_main([str(run), "--out", str(tmp_path / "page.html")]) == 0
    shot = tmp_path / "shot.png"
    proc = subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", "--window-size=1200,1600", f"--screenshot={shot}",
                           f"file://{tmp_path / 'page.html'}"], capture_output=True, text=True,
                          timeout=120)
    assert shot.exists(), proc.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1200, 1600)
    small = img.resize((120, 160))
    pixels = list(small.getdata())
    non_white = sum(1 for px in pixels if min(px) < 235) / len(pixels)
    assert len(set(pixels)) > 20 and 0.01 < non_white < 0.9, (len(set(pixels)), non_white)
    # the embedded plot rendered: the summary's bar colours are on the page (further down)
    full = tmp_path / "full.png"
    subprocess.run([_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,3000", f"--screenshot={full}", f"file://{tmp_path / 'page.html'}"],
                   capture_output=True, timeout=120)
    colours = set(Image.open(full).convert("RGB").getdata())
    assert any(abs(r - 0x22) < 12 and abs(g - 0x88) < 12 and abs(b - 0x33) < 12 for r, g, b in colours), \
        "the student bar (#228833) of summary.png is not on the page"

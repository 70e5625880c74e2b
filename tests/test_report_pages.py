"""Every kind of report page (a run, a folder of runs, a comparison) in headless Chromium at
1280 px: nothing wider than the window, no raw block longer than a screen, and the terms a
reader may not know explained. Pages from tests/report_pages.py (run folders as jobs.distill
writes them; a comparison written by jobs.compare's writer from measured rows)."""
import html
import os
import re

import pytest

from jobs.report import HELP, build_report
from tests import report_pages
from tests.run_folders import write_run

MAX_PRE_LINES = 40
needs_chromium = pytest.mark.skipif(report_pages.chromium() is None,
                                    reason="no headless Chromium here (apt-get install chromium)")


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """{kind: report.html} for the three kinds of page."""
    base = str(tmp_path_factory.mktemp("pages"))
    folders = {"run": report_pages.run_page(base), "folder": report_pages.folder_of_runs(base),
               "compare": report_pages.compare_folder(base)}
    return {kind: build_report(folder)[1] for kind, folder in folders.items()}


@needs_chromium
@pytest.mark.parametrize("kind", ["run", "folder", "compare"])
def test_page_fits_1280_px_and_shows_no_raw_wall(pages, kind):
    seen = report_pages.measure(pages[kind], width=1280)
    assert seen["scrollWidth"] <= seen["innerWidth"] == 1280, (kind, seen)
    assert not seen["scrolled_boxes"], (kind, seen)          # nothing behind an inner scrollbar
    assert all(n <= MAX_PRE_LINES for n in seen["pre_lines"]), (kind, seen["pre_lines"])
    shot = report_pages.screenshot(pages[kind], pages[kind][:-5] + ".png")
    assert os.path.getsize(shot) > 10_000


def test_compare_page_numbers_are_short_and_raw_json_is_folded(pages):
    page = open(pages["compare"]).read()
    cells = re.findall(r'<td class="num">([^<]*)</td>', page)
    assert cells and max(len(c) for c in cells) <= 8, max(cells, key=len)
    assert "0.9999999999999" not in page.split("<h2>Raw files</h2>")[0]
    assert re.search(r"<details><summary>compare\.json \(raw JSON", page)
    assert re.search(r"<details><summary>ledgers\.json \(raw JSON", page)
    assert "<h2>Comparison</h2>" in page                  # the runs' accuracy vs eps


def test_footnotes_only_for_methods_that_ran(tmp_path):
    folder = report_pages.compare_folder(str(tmp_path), methods=("rknn_central", "pate_gnmax"))
    notes = open(os.path.join(folder, "compare.md")).read()
    assert "DP-DFD" not in notes and "FedMD-NFDP" not in notes
    full = open(build_report(report_pages.compare_folder(str(tmp_path / "all")))[1]).read()
    assert "DP-DFD" in full and "FedMD-NFDP" in full


def test_terms_are_explained_on_hover_and_in_a_legend(pages):
    page = open(pages["run"]).read()
    for term in ("query label accuracy", "labels (private)", "2 x error bound (Remark 1)"):
        why = html.escape(HELP[term])
        assert f'title="{why}"' in page or term in ("labels (private)",
                                                    "2 x error bound (Remark 1)"), term
        assert f"<dt>{term}</dt><dd>{why}</dd>" in page, term     # visible, not only on hover


def test_a_resumed_run_says_so(tmp_path):
    folder = tmp_path / "sweep"
    write_run(str(folder / "a"), "central", "laplace", resumed=True)
    write_run(str(folder / "b"), "central", "laplace", eps=2.0)
    run_page = open(build_report(str(folder / "a"))[1]).read()
    assert "Resumed run: finished at 2026-11-27T10:02:00Z from the release saved at " \
           "2026-11-27T09:58:00Z, after: interrupted by SIGINT during student" in run_page
    text, _ = build_report(str(folder / "b"))
    assert not any(line.strip().startswith("resumed") for line in text.splitlines())
    text, _ = build_report(str(folder))
    lines = text.splitlines()
    assert "complete (resumed)" in lines[3] and "complete (resumed)" not in lines[4]


def test_a_run_without_public_labels_draws_two_panels_and_its_reasons_under_the_bars():
    """Issue 57: the caption of what was not measured was drawn across the student's bar, and
    an empty third panel (count gaps need a public truth) kept its axes."""
    import numpy as np
    from rknn_ray.plots import plt, run_summary_figure
    report = {"accuracy": {"labels": None, "student": 0.8,
                           "not_measured": {"labels": "the public rows carry no labels"}},
              "privacy": {"model": "central", "mechanism": "laplace", "eps": 1.0, "delta": 0.0}}
    fig = run_summary_figure(report, [{"epoch": 1, "train_loss": 1.0}], np.zeros(0),
                             np.zeros(0, bool), None)
    assert len(fig.axes) == 2
    assert fig.axes[0].get_xlabel() == "n/a: the public rows carry no labels"
    assert not fig.axes[0].texts[1:] or all("carry no labels" not in t.get_text()
                                             for t in fig.axes[0].texts)
    plt.close(fig)
    fig = run_summary_figure({**report, "accuracy": {"labels": 0.9, "student": 0.8}}, [],
                             np.array([1.0, 3.0]), np.array([True, False]), None)
    assert len(fig.axes) == 3
    plt.close(fig)


def test_the_folder_view_draws_no_line_across_two_data_sets():
    from rknn_ray.plots import plt, runs_vs_eps_figure
    points = [(("digits", "central/laplace"), 1.0, 0.9, 0.9),
              (("digits", "central/laplace"), 2.0, 0.95, 0.95),
              (("table", "central/laplace"), 1.0, 0.6, float("nan")),
              (("table", "central/laplace"), 2.0, 0.7, float("nan"))]
    fig = runs_vs_eps_figure(points)
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "digits: central/laplace: student" in labels and \
        "table: central/laplace: student" in labels
    assert all(len(line.get_xdata()) == 2 for line in fig.axes[0].get_lines())
    plt.close(fig)
    fig = runs_vs_eps_figure(points[:2])       # one data set: the group says only the method
    assert "central/laplace: student" in [line.get_label() for line in fig.axes[0].get_lines()]
    plt.close(fig)

"""The three kinds of report page (a run, a folder of runs, a comparison), made from run
folders written the way jobs.distill writes them (tests/run_folders.py) and a comparison
folder written by jobs.compare's own writer from the rows measured in benchmarks/results/,
and a headless-Chromium measure of how each page lays out at a given width."""
import json
import os
import re
import shutil
import subprocess

from tests.run_folders import write_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEASURED = os.path.join(ROOT, "benchmarks", "results")

#: written into a copy of the page after load: how wide the document is, which boxes the
#: reader sees scroll sideways inside (a table or text behind a scrollbar), and how many
#: lines each <pre> the reader sees (not one folded in a closed <details>) spans
MEASURE_JS = """<script>window.addEventListener('load', function () {
  var pres = Array.prototype.filter.call(document.querySelectorAll('pre'),
    function (p) { return !p.closest('details:not([open])') && p.getClientRects().length > 0; });
  var boxes = Array.prototype.filter.call(document.querySelectorAll('.fit, pre'),
    function (b) { return !b.closest('details:not([open])') && b.getClientRects().length > 0
                          && b.scrollWidth > b.clientWidth + 1; });
  var out = {scrollWidth: document.documentElement.scrollWidth, innerWidth: innerWidth,
    scrolled_boxes: boxes.map(function (b) { return (b.textContent || '').slice(0, 60); }),
    pre_lines: pres.map(function (p) { return p.textContent.split('\\n').length; }),
    wide: Array.prototype.filter.call(document.querySelectorAll('body *'), function (e) {
      return e.getBoundingClientRect().right > innerWidth + 1; }).slice(0, 5).map(
      function (e) { return e.tagName + ' ' + (e.textContent || '').slice(0, 60); })};
  var d = document.createElement('div'); d.id = 'page-measure';
  d.textContent = JSON.stringify(out); document.body.appendChild(d);
});</script>"""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def _browser(*args, timeout=90):
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                           "--hide-scrollbars", *args], capture_output=True, text=True,
                          timeout=timeout)


def measure(page: str, width: int = 1280, height: int = 900) -> dict:
    """Load a copy of ``page`` (the page itself holds no script) at ``width`` px and return
    what MEASURE_JS saw."""
    with open(page) as fh:
        text = fh.read()
    probe = page[:-5] + ".measure.html"
    with open(probe, "w") as fh:
        fh.write(text.replace("</body>", MEASURE_JS + "</body>"))
    proc = _browser(f"--window-size={width},{height}", "--virtual-time-budget=5000",
                    "--dump-dom", f"file://{probe}")
    os.unlink(probe)
    found = re.search(r'<div id="page-measure">([^<]*)</div>', proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(found.group(1).replace("&quot;", '"'))


def screenshot(page: str, png: str, width: int = 1280, height: int = 2400) -> str:
    _browser(f"--window-size={width},{height}", f"--screenshot={png}", f"file://{page}")
    return png


def run_page(base: str) -> str:
    """A finished central run's folder; its page is written by the caller."""
    return write_run(os.path.join(base, "run"), "central", "laplace", eps=1.0)


def folder_of_runs(base: str) -> str:
    """A folder of runs (a grid-like sweep): central at three eps, local and shuffle, one
    unfinished."""
    folder = os.path.join(base, "sweep")
    for eps, acc in ((0.5, 0.62), (1.0, 0.85), (4.0, 0.93)):
        run = write_run(os.path.join(folder, f"central-eps{eps:g}"), "central", "laplace", eps=eps)
        with open(os.path.join(run, "report.json")) as fh:
            report = json.load(fh)
        report["accuracy"].update(student=acc, labels=acc - 0.04)
        with open(os.path.join(run, "report.json"), "w") as fh:
            json.dump(report, fh)
    write_run(os.path.join(folder, "local-eps4"), "local", "collision", eps=4.0)
    write_run(os.path.join(folder, "shuffle-eps2"), "shuffle", "collision", eps=2.0,
              delta=1e-5, shuffler=True)
    os.makedirs(os.path.join(folder, "broken"))
    with open(os.path.join(folder, "broken", "incomplete.json"), "w") as fh:
        json.dump({"status": "incomplete", "reason": "interrupted (SIGINT)",
                   "release_saved": False}, fh)
    return folder


def compare_folder(base: str, methods=None) -> str:
    """A comparison folder as jobs.compare leaves it: its writer run on the rows measured on
    digits (benchmarks/results/compare-digits.json), rknn run folders under runs/."""
    from jobs import compare
    with open(os.path.join(MEASURED, "compare-digits.json")) as fh:
        rows = json.load(fh)
    with open(os.path.join(MEASURED, "compare-digits-meta.json")) as fh:
        meta = json.load(fh)
    if methods:
        rows = [r for r in rows if r["method"] in methods]
    out = os.path.join(base, "compare")
    for r in rows:
        r["wall_s"] *= 1.0000000000000002          # the 16 digits a measured time carries
        if r["method"].startswith("rknn_"):
            model = r["method"][5:]
            r["run"] = write_run(os.path.join(out, "runs", f"{r['method']}-eps{r['target_eps']:g}"),
                                 model, "laplace" if model == "central" else "collision",
                                 eps=r["eps"], delta=r["delta"], shuffler=model == "shuffle")
    ledgers = {f"{r['method']}@{r['target_eps']:g}": {"ledger": {"entries": [
        {"eps": r["eps"], "delta": r["delta"], "model": r.get("model"), "round": t}
        for t in range(8)]}, "details": {"noise": 1.2345678901234567}}
        for r in rows if not r["method"].startswith("rknn_")}
    compare.write_outputs(out, rows, meta, ledgers)
    return out

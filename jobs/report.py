"""A readable report of a run folder, or of a folder of runs (a comparison, a grid).

    rknn-ray report RUN_DIR [--out FILE] [--no-html] [--include-diagnostics]
    python -m jobs.report RUN_DIR ...

Prints a summary to stdout (privacy, accuracy, counts, timings) and writes one
self-contained ``report.html`` into the folder (or ``--out``): inline CSS, the PNG
plots embedded as base64, no file or network it depends on, so it can be mailed or
attached as it is.

What a folder may be:

- a run folder (``report.json``, written last by ``python -m jobs.distill``);
- an unfinished run (``incomplete.json``, maybe ``release.npz``): what happened and
  how to finish it;
- a folder of runs (a comparison or grid folder): every run folder below it (up to
  three levels down) becomes one row of a comparison table, and what the folder
  itself holds is shown as it is: JSON files (``compare.json``, ``results.json``)
  pretty-printed, CSV files as tables, ``.txt`` tables, PNG plots embedded.

Privacy: a run's ``diagnostics/`` subfolder holds NON-private values (exact counts);
the report names it but embeds nothing from it unless ``--include-diagnostics`` is
given, and then marks that part and the page title as not private.
"""
from __future__ import annotations

import argparse
import base64
import csv
import html
import json
import os
import sys
import time

from jobs.experiments import STAGES   # the job's own stages, in order
from jobs.experiments import NAN, empty_row, report_row, stage_seconds
from jobs.signals import reader_gone
from rknn_ray.errors import RknnError, first_line
from rknn_ray.runio import write_text

REPORT = "report.json"
INCOMPLETE = "incomplete.json"
HTML_NAME = "report.html"
MAX_DEPTH = 3
MAX_CSV_ROWS = 200
MAX_TEXT_CHARS = 20_000
ROUND_PARTS = ("clients", "shuffle", "server_open", "server_finalize")


class ReportError(Exception):
    """The folder holds nothing a report can be made from."""


# ------------------------------------------------------------------ reading

def _read_json(path: str):
    try:
        with open(path) as f:
            return json.load(f)
    except RecursionError:          # nested thousands deep: no run wrote that
        raise ReportError(f"{path} is nested too deeply to be a run's JSON") from None
    except ValueError as exc:       # truncated or not JSON: name the file
        raise ReportError(f"{path} is not valid JSON ({exc}); the run that wrote it may have "
                          "been cut off") from None


#: report.json's sections that the summary reads as objects
SECTIONS = ("accuracy", "privacy", "counts", "timings_s", "student", "config", "utility",
            "diagnostics")


def _check_shape(path: str, doc, sections=SECTIONS) -> dict:
    """A run's JSON must be an object whose known sections are objects too."""
    if not isinstance(doc, dict):
        raise ReportError(f"{path} holds a JSON {type(doc).__name__}, not an object: it is not "
                          "a run's report")
    bad = [k for k in sections if doc.get(k) is not None and not isinstance(doc[k], dict)]
    if bad:
        raise ReportError(f"{path}: {', '.join(bad)} should be an object (found "
                          f"{', '.join(type(doc[k]).__name__ for k in bad)}): not a run's report")
    return doc


def _recosted(path: str, report: dict) -> dict:
    """The report with the (eps, delta) it shows beside its events recomputed from them
    (rknn_ray.accounting.ledger.recosted): what it stores there is a cache."""
    if not (report.get("privacy") or {}).get("ledger"):
        return report
    # defers dp_accounting and scipy: a report of runs without events never loads them
    from rknn_ray.accounting.ledger import recosted
    try:
        return {**report, "privacy": recosted(report["privacy"])}
    except (RknnError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ReportError(f"{path}: its privacy events cannot be costed ({first_line(exc)}); "
                          "the run was written by another version: read it with that "
                          "version, or run the job again") from None


def find_runs(folder: str, max_depth: int = MAX_DEPTH) -> list[str]:
    """Run folders (with report.json or incomplete.json) below ``folder``, sorted by path."""
    found = []
    base = os.path.abspath(folder)
    for root, dirs, files in os.walk(base):
        depth = os.path.relpath(root, base).count(os.sep) + (root != base)
        if root != base and (REPORT in files or INCOMPLETE in files):
            found.append(root)
            dirs[:] = []            # a run's own subfolders (diagnostics, Train storage) are not runs
            continue
        if depth >= max_depth:
            dirs[:] = []
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    return sorted(found)


def load_run(folder: str) -> dict:
    """What a run folder says: its report (or incomplete marker), plots, diagnostics, history."""
    folder = os.path.abspath(folder)
    run = {"path": folder, "name": os.path.basename(folder.rstrip(os.sep)), "report": None,
           "incomplete": None, "plots": [], "history": None,
           "diagnostics": os.path.isdir(os.path.join(folder, "diagnostics"))}
    rp, ip = os.path.join(folder, REPORT), os.path.join(folder, INCOMPLETE)
    if os.path.isfile(rp):
        run["report"] = _recosted(rp, _check_shape(rp, _read_json(rp)))
    elif os.path.isfile(ip):
        run["incomplete"] = _check_shape(ip, _read_json(ip), ())
        run["release_saved"] = os.path.isfile(os.path.join(folder, "release.npz"))
    else:
        raise ReportError(f"{folder} is not a run folder (no {REPORT} or {INCOMPLETE})")
    run["plots"] = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".png"))
    hp = os.path.join(folder, "history.json")
    if os.path.isfile(hp):
        try:
            run["history"] = _read_json(hp)
        except (OSError, ValueError, ReportError):     # a side file: the run is still shown
            pass
    return run


# ------------------------------------------------------------------ numbers to text

def _fmt(v, digits: int = 4) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        if v != v:
            return "n/a"
        return f"{v:.{digits}g}" if abs(v) < 1e5 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _acc(acc: dict, key: str, digits: int = 4) -> str:
    """An accuracy, or the report's reason it was not measured (no evaluation set given)."""
    why = (acc.get("not_measured") or {}).get(key)
    return why if why and acc.get(key) is None else _fmt(acc.get(key), digits)


def _seconds(v) -> str:
    return "n/a" if v is None else f"{float(v):.1f} s"


def local_eps0(privacy: dict) -> list:
    """Each round's local eps0 (a shuffle round's randomizer: its event's ``eps0``; None for
    a round without one: central, multi-message), in round order."""
    out = []
    for r in privacy.get("rounds") or []:
        event = r.get("event") if isinstance(r, dict) else None
        out.append(event.get("eps0") if isinstance(event, dict) else None)
    return out


def eps0_words(privacy: dict) -> str | None:
    """'2.31' or '2.31 (round 1), 2.4 (round 2)': the local eps0 each report was randomized
    at, None when no round had one."""
    values = local_eps0(privacy)
    if not any(v is not None for v in values):
        return None
    if len(values) == 1:
        return f"{values[0]:.4g}"
    return ", ".join(f"{v:.4g} (round {i + 1})" for i, v in enumerate(values) if v is not None)


def _round_label(key: str) -> str:
    """A timing key in words: round_0 -> 'round 1', select_1 -> 'round 2 query selection'
    (the console counts rounds from 1)."""
    kind, _, index = key.partition("_")
    if not index.isdigit():
        return key
    return f"round {int(index) + 1}" + (" query selection" if kind == "select" else "")


def _plural(n, word: str) -> str:
    return f"{_fmt(n)} {word}{'' if n == 1 else 's'}"


def run_sections(run: dict) -> list[tuple[str, list[tuple[str, str]]]]:
    """The summary as (section, [(label, value)]) pairs: one source for text and HTML."""
    rep = run["report"]
    if rep is None:
        inc = run["incomplete"] or {}
        rows = [(k, _fmt(v) if not isinstance(v, (dict, list)) else json.dumps(v))
                for k, v in inc.items()]
        rows.append(("release saved", "yes (release.npz): finish with "
                     f"python -m jobs.distill --resume {run['path']}" if run.get("release_saved")
                     else "no: nothing was released"))
        return [("Unfinished run", rows)]
    acc, p, c = rep.get("accuracy", {}), rep.get("privacy", {}), rep.get("counts", {})
    cfg = rep.get("config") or {}
    data = cfg.get("data") or {}
    privacy = [("trust model", _fmt(p.get("model"))), ("mechanism", _fmt(p.get("mechanism"))),
               ("guarantee", f"eps = {_fmt(p.get('eps'))}, delta = {_fmt(p.get('delta'))}"),
               ("unit, neighbours", f"{_fmt(p.get('unit'))}-level, {_fmt(p.get('neighbour'))}"),
               ("rounds", _fmt(len(p.get("rounds") or []) or c.get("rounds")))]
    eps0 = eps0_words(p)
    if eps0 is not None:            # the local randomizer's eps0 the shuffle bound granted
        privacy.append(("local eps0", f"{eps0} (each client's report)"))
    budget = p.get("budget") or {}
    if budget:          # the source's budget and spend are its history: the ledger's views
        shown_by = budget.get("shown_by") or "rknn-ray budget"     # with its --ledger
        privacy.append(("dataset budget", f"{_fmt(budget.get('description'))}: charged to "
                        f"the ledger {_fmt(budget.get('ledger'))}; `{shown_by}` shows "
                        "its budget and spend"))
    privacy.append(("randomness", _fmt(rep.get("rng"))))
    accuracy = [("label accuracy (public set)", _acc(acc, "labels")),
                ("student accuracy (evaluation set)", _acc(acc, "student")),
                ("query label accuracy", _acc(acc, "query_labels"))]
    diag = rep.get("diagnostics")
    if diag:
        accuracy.append(("non-private label accuracy [diagnostics, NOT private]",
                         _fmt(diag.get("nonprivate_labels"))))
    counts = [("dataset", _fmt(data.get("dataset"))), ("clients", _fmt(c.get("clients"))),
              ("private records", _fmt(c.get("records"))), ("queries", _fmt(c.get("queries"))),
              ("public / evaluation", f"{_fmt(c.get('public'))} / {_fmt(c.get('evaluation'))}"),
              ("messages accepted", _fmt(c.get("messages"))),
              ("reports received", _fmt(c.get("received")))]
    counts[2:2] = holder_rows(c.get("holders"))
    rejected = {k: v for k, v in (c.get("rejected") or {}).items() if v}
    counts.append(("reports rejected", ", ".join(f"{k} {_fmt(v)}" for k, v in sorted(rejected.items()))
                   if rejected else "none"))
    for i, sh in enumerate(rep.get("shuffler") or []):
        if sh:
            counts.append((f"round {i + 1} shuffled", f"{_fmt(sh.get('messages'))} messages from "
                           f"{_fmt(sh.get('senders'))} senders"))
    for sel in rep.get("selection") or []:        # how each round's queries were chosen
        if sel.get("round", 0) > 0 and "pool" in sel:
            counts.append((f"round {sel['round'] + 1} queries",
                           f"{_fmt(sel.get('rule'))}: {_fmt(sel.get('queries'))} among the "
                           f"{_fmt(sel.get('pool'))} least certain (uncertainty "
                           f"{_fmt(sel.get('uncertainty_chosen'))} vs "
                           f"{_fmt(sel.get('uncertainty_all'))} over all public)"))
        elif sel.get("round", 0) > 0:
            counts.append((f"round {sel['round'] + 1} queries",
                           f"{_fmt(sel.get('rule'))}: {_fmt(sel.get('queries'))}"))
    conn = rep.get("connection") or {}
    if conn.get("configured", "reverse_knn") != "reverse_knn":    # rknn.connection (issue 37)
        chose = (f" (auto: {conn['auto']['reason']})" if conn.get("auto") else "")
        counts.append(("connection", ", ".join(conn.get("rules") or []) + chose))
    timings = rep.get("timings_s") or {}
    times = [(k, _seconds(timings[k])) for k in STAGES if k in timings]
    times += [(_round_label(k), _seconds(v)) for k, v in sorted(timings.items())
              if k.startswith(("round_", "select_")) and k.count("_") == 1]
    times += [(f"  {k} (all rounds)", _seconds(timings[k])) for k in ROUND_PARTS if timings.get(k)]
    if "job" in timings:          # a run from before the job's wall was recorded: stages only
        times.append(("job wall time", f"{_seconds(timings['job'])} (Ray's start and the time "
                      "between stages included; the release's noise sampling left out)"))
    times.append(("total of the stages", _seconds(stage_seconds(timings))))
    student = rep.get("student") or {}
    if student:
        where = ("in process" if student.get("trainer") == "local"
                 else _plural(student.get("num_workers"), "Ray Train worker"))
        times.append(("student run", f"{_plural(student.get('epochs'), 'epoch')}, {where} on "
                      f"{_fmt(student.get('device'))}, {_fmt(student.get('train_samples'))} "
                      "samples" + (f" ({student['trainer_reason']})"
                                   if student.get("trainer_configured") == "auto" else "")))
    about = [("folder", run["path"]), ("job id", _fmt(rep.get("job_id"))),
             ("version", _fmt(rep.get("version")))]
    if rep.get("resumed"):
        about.append(("resumed", resumed_words(rep["resumed"])))
    if run.get("diagnostics"):
        about.append(("diagnostics/", "present: NOT private, do not share (not embedded here)"
                      if not run.get("include_diagnostics") else "embedded below: NOT private"))
    sections = [("Privacy", privacy), ("Accuracy", accuracy), ("Counts", counts),
                ("Timings", times), ("Run", about)]
    placement = rep.get("placement") or {}
    if placement:            # which Ray node ran each party (and, with sites, each site's)
        sections.insert(4, ("Placement", [(party, ", ".join(n[:12] for n in nodes))
                                          for party, nodes in sorted(placement.items())]))
    return sections


def holder_rows(holders) -> list:
    """The Counts rows of a table's holders (public under the job's relation): how many, the
    records they keep, and per site (data.private.sites) its holders and records."""
    if not isinstance(holders, dict):
        return []
    rows = [("holders", f"{_fmt(holders.get('holders'))} ({_fmt(holders.get('kept'))} records "
             f"kept, at most {_fmt(holders.get('bound'))} each)")]
    for name, site in sorted((holders.get("sites") or {}).items()):
        rows.append((f"  site {name}", f"{_fmt(site.get('records'))} records of "
                     f"{_fmt(site.get('holders'))} holders, {_fmt(site.get('shards'))} "
                     "shard(s) on its own nodes"))
    return rows


def resumed_words(resumed) -> str:
    """report.json's ``resumed`` in words: when it was finished, from which release, after what."""
    if not isinstance(resumed, dict):
        return "yes"
    words = f"finished at {_fmt(resumed.get('at'))} from the release saved at " \
            f"{_fmt(resumed.get('release_saved_at'))}"
    if resumed.get("after"):
        words += f", after: {resumed['after']}"
    return words + " (no new private round, no budget spent)"


def run_row(run: dict) -> dict:
    """One line of a comparison table: the run's name and status, then the report-row
    schema (jobs.experiments.ReportRow), the same fields compare and grid rows hold."""
    rep = run["report"]
    if rep is None:
        return {"run": run["name"], "status": "incomplete", **empty_row()}
    return {"run": run["name"], "status": "complete (resumed)" if rep.get("resumed") else "complete",
            **report_row(rep).to_dict()}


#: the table's columns (schema names: accuracy is the student's, stage_s the stage total)
ROW_COLUMNS = ("run", "status", "model", "mechanism", "eps", "delta", "unit", "label_accuracy",
               "accuracy", "clients", "queries", "messages", "stage_s")


def text_summary(run: dict) -> str:
    title = f"run {run['name']}" + ("" if run["report"] else " (unfinished)")
    out = [title, "=" * len(title)]
    for section, rows in run_sections(run):
        out.append(f"{section}:")
        width = max(len(k) for k, _ in rows)
        out += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    if run["plots"]:
        out.append("plots: " + ", ".join(os.path.basename(p) for p in run["plots"]))
    return "\n".join(out)


def table_text(rows: list[dict], columns=ROW_COLUMNS) -> str:
    cells = [[_fmt(r.get(col)) if col != "stage_s" or r.get(col) is None else f"{r[col]:.1f}"
              for col in columns] for r in rows]
    widths = [max([len(col)] + [len(row[i]) for row in cells]) for i, col in enumerate(columns)]
    lines = ["  ".join(col.ljust(w) for col, w in zip(columns, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


# ------------------------------------------------------------------ HTML

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1100px;
     color:#222;padding:0 1em;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em} h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}
.sub{color:#666;margin-top:0} table{border-collapse:collapse;margin:.5em 0;font-size:.92em;max-width:100%}
td,th{border:1px solid #ddd;padding:.3em .7em;text-align:left;vertical-align:top}
table.wide{font-size:.82em} table.wide td,table.wide th{padding:.25em .4em}
td.num{text-align:right;white-space:nowrap}
[title]{text-decoration:underline dotted #999;cursor:help} td[title],th[title]{text-decoration:none}
.legend{color:#555;font-size:.85em;margin:.2em 0 1em} .legend dt{font-weight:600;display:inline}
.legend dd{display:inline;margin:0 0 0 .3em} .legend dd:after{content:"";display:block}
details{margin:.5em 0} summary{cursor:pointer;color:#345} .fit{max-width:100%;overflow-x:auto}
th{background:#f3f5f8} .kv td:first-child{color:#555;white-space:nowrap}
.cards{display:flex;gap:1em;flex-wrap:wrap;margin:1em 0}
.card{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;min-width:9em;background:#f9fafb}
.card .v{font-size:1.5em;font-weight:600} .card .k{color:#666;font-size:.85em}
.warn{background:#fff3cd;border:1px solid #e0c36a;padding:.6em 1em;border-radius:6px}
img{max-width:100%;border:1px solid #eee;margin:.5em 0} figure{margin:0}
pre{background:#f6f8fa;padding:.8em;overflow:auto;max-height:40em}
.note{background:#e8f1fb;border:1px solid #9bbde0;padding:.6em 1em;border-radius:6px}
"""


def _png_tag(path, alt: str) -> str:
    """A PNG file (or its bytes) embedded in the page."""
    if isinstance(path, bytes):
        raw = path
    else:
        with open(path, "rb") as f:
            raw = f.read()
    data = base64.b64encode(raw).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">' \
           f"<figcaption>{html.escape(alt)}</figcaption></figure>"


#: one line for each term a page shows that a reader may not know: a title (hover) on the
#: term, and a visible legend under the table or plot that shows it
HELP = {
    "label accuracy (public set)": "the released (private) labels, propagated to every public "
                                   "sample, against the public set's true labels (Acc_pl)",
    "student accuracy (evaluation set)": "the student trained on those labels, on the held-out "
                                         "evaluation set (Acc_pc)",
    "query label accuracy": "the labels of the queries themselves (the public samples whose "
                            "counts the private round released), before they are propagated",
    "non-private label accuracy [diagnostics, NOT private]": "the same labels from the exact, "
                                                             "noise-free counts: a simulation "
                                                             "figure, not private",
    "labels (private)": "bar: label accuracy on the public set, from the released noisy counts",
    "student": "bar: the student's accuracy on the evaluation set",
    "query label correct / wrong": "per query, the released count gap of its true class over "
                                   "the best other class, split by whether its label came out right",
    "2 x error bound (Remark 1)": "central runs: twice the mechanism's noise bound eta (every "
                                  "count within eta with probability 0.95); a query whose exact "
                                  "gap exceeds it keeps its true label (paper 000, Remark 1)",
    "resumed": "the run was finished with --resume from the release an earlier, interrupted "
               "attempt saved: no new private round, no budget spent",
}
#: the columns of a comparison table (folder and compare pages), explained the same way
COLUMN_HELP = {
    "eps": "the privacy loss the run's accountant reports, all rounds composed",
    "delta": "the guarantee's delta (0: pure eps-DP)",
    "target_eps": "the eps the comparison asked for",
    "unit": "what the guarantee protects: record (one private record) or label (one query's label)",
    "neighbour": "the neighbour relation of the guarantee (replace-one or add/remove-one)",
    "label_accuracy": "released labels on the public set (Acc_pl)",
    "accuracy": "the student on the evaluation set (Acc_pc)",
    "labels": "released labels on the public set (Acc_pl)",
    "student": "the student on the evaluation set (Acc_pc)",
    "rounds": "private interactions (rounds, stages or SGD steps)",
    "bytes_per_client": "what one data holder uploads",
    "messages": "reports the server accepted",
    "stage_s": "seconds: the sum of the run's stage timings",
    "wall_s": "seconds of wall time for the row",
    "reference_accuracy": "NOT PRIVATE: the student of the same pipeline on exact counts (grid)",
    "reference_label_accuracy": "NOT PRIVATE: the labels of the same pipeline on exact counts "
                                "(grid)",
}


def _term(text: str) -> str:
    """A term with its explanation on hover (HELP), else just the escaped text."""
    why = HELP.get(text) if text not in COLUMN_HELP else None
    return (f'<span title="{html.escape(why)}">{html.escape(text)}</span>' if why
            else html.escape(text))


def _legend(terms, help_=None) -> str:
    """The visible explanations of the terms among ``terms`` that ``help_`` (HELP) explains."""
    help_ = HELP if help_ is None else help_
    items = [t for t in dict.fromkeys(map(str, terms)) if t in help_]
    return ('<dl class="legend">' + "".join(f"<dt>{html.escape(t)}</dt><dd>{html.escape(help_[t])}"
                                            "</dd>" for t in items) + "</dl>") if items else ""


def _kv_table(rows) -> str:
    body = "".join(f"<tr><td>{_term(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="kv">{body}</table>' + _legend(k for k, _ in rows
                                                          if k not in COLUMN_HELP)


def _numeric(v: str) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _cell(v) -> str:
    """A table cell: a float (as text from a CSV too) to 4 significant digits."""
    if isinstance(v, str) and _numeric(v) and any(c in v for c in ".eE") and v.strip():
        return _fmt(float(v))
    return str(v)


def _breakable(text) -> str:
    """Escaped text that may wrap after ``_``, ``-`` and ``/`` (method and run names)."""
    out = html.escape(str(text))
    for ch in "_-/":
        out = out.replace(ch, ch + "<wbr>")
    return out


def _table(header, rows, wide: bool = False) -> str:
    """A table whose numbers are short and whose column names may break at an underscore,
    so it fits the page; a header in COLUMN_HELP explains itself on hover."""
    def th(h):
        why = COLUMN_HELP.get(str(h))
        return f'<th title="{html.escape(why)}">{_breakable(h)}</th>' if why \
            else f"<th>{_breakable(h)}</th>"
    head = "".join(th(h) for h in header)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{html.escape(c)}</td>' if _numeric(c) else f"<td>{_breakable(c)}</td>"
        for c in map(_cell, r)) + "</tr>" for r in rows)
    return ('<table class="wide">' if wide else "<table>") + f"<tr>{head}</tr>{body}</table>"


def _cards(run: dict) -> str:
    rep = run["report"] or {}
    p, acc = rep.get("privacy", {}), rep.get("accuracy", {})
    cards = [("student accuracy", _acc(acc, "student", 3)),
             ("label accuracy", _acc(acc, "labels", 3)),
             ("eps", _fmt(p.get("eps"))), ("delta", _fmt(p.get("delta"))),
             ("trust model", f"{_fmt(p.get('model'))}/{_fmt(p.get('mechanism'))}")]
    return '<div class="cards">' + "".join(
        f'<div class="card"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
        for k, v in cards) + "</div>"


def _history_svg(history: list[dict] | None) -> str:
    """The training curve as inline SVG (train loss and accuracy per epoch), if there is one."""
    if not history:
        return ""
    w, h, pad = 520, 180, 30
    epochs = [r.get("epoch", i + 1) for i, r in enumerate(history)]
    lo, hi = min(epochs), max(epochs)
    span = max(hi - lo, 1)

    def path(values, top):
        finite = [v for v in values if isinstance(v, (int, float))]
        if not finite:
            return ""
        vmax = top if top is not None else max(finite) or 1.0
        pts = [f"{pad + (e - lo) / span * (w - 2 * pad):.1f},"
               f"{h - pad - (v / vmax) * (h - 2 * pad):.1f}" for e, v in zip(epochs, values)
               if isinstance(v, (int, float))]
        return "M" + " L".join(pts)

    loss = path([r.get("train_loss") for r in history], None)
    accp = path([r.get("train_accuracy") for r in history], 1.0)
    return (f'<svg width="{w}" height="{h}" role="img" aria-label="training curve">'
            f'<rect x="0" y="0" width="{w}" height="{h}" fill="#fff" stroke="#ddd"/>'
            f'<path d="{loss}" fill="none" stroke="#cc3311" stroke-width="2"/>'
            f'<path d="{accp}" fill="none" stroke="#228833" stroke-width="2"/>'
            f'<text x="{pad}" y="18" font-size="12" fill="#cc3311">train loss (scaled to its max)</text>'
            f'<text x="{w - 190}" y="18" font-size="12" fill="#228833">train accuracy (0..1)</text>'
            f'<text x="{pad}" y="{h - 8}" font-size="11" fill="#666">epoch {lo}</text>'
            f'<text x="{w - pad - 50}" y="{h - 8}" font-size="11" fill="#666">epoch {hi}</text>'
            "</svg>")


def run_html_body(run: dict, heading: str = "h2") -> str:
    parts = []
    if run["report"] is None:
        parts.append('<p class="warn">This run did not finish.</p>')
    else:
        parts.append(_cards(run))
        if run["report"].get("resumed"):
            parts.append(f'<p class="note" title="{html.escape(HELP["resumed"])}">Resumed run: '
                         f'{html.escape(resumed_words(run["report"]["resumed"]))}.</p>')
    for section, rows in run_sections(run):
        parts.append(f"<{heading}>{html.escape(section)}</{heading}>{_kv_table(rows)}")
    if run["plots"] or run["history"]:
        parts.append(f"<{heading}>Plots</{heading}>")
        parts += [_png_tag(p, os.path.basename(p)) for p in run["plots"]]
        if any(os.path.basename(p) == "summary.png" for p in run["plots"]):
            central = ((run["report"] or {}).get("privacy") or {}).get("model") == "central"
            parts.append(_legend(["labels (private)", "student", "query label correct / wrong"]
                                 + (["2 x error bound (Remark 1)"] if central else [])))
        if run["history"] and not run["plots"]:      # summary.png already has the curve
            parts.append(_history_svg(run["history"]))
    if run.get("include_diagnostics") and run.get("diagnostics"):
        folder = os.path.join(run["path"], "diagnostics")
        parts.append(f'<{heading}>Diagnostics</{heading}><p class="warn">NOT PRIVATE: computed from '
                     "the private data without noise. Do not share this page.</p>")
        parts += [_png_tag(os.path.join(folder, f), f"diagnostics/{f}")
                  for f in sorted(os.listdir(folder)) if f.endswith(".png")]
    return "\n".join(parts)


def page(title: str, subtitle: str, body: str) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"<h1>{html.escape(title)}</h1><p class=\"sub\">{html.escape(subtitle)} &middot; "
            f"report made {html.escape(stamp)} by rknn-ray report</p>{body}</body></html>")


MAX_PRE_LINES = 40


def _text_block(name: str, body: str, folded: bool) -> str:
    """A file's text: as it is when short, folded into a <details> when long or raw."""
    pre = f"<pre>{html.escape(body)}</pre>"
    if not folded:
        return f"<h2>{html.escape(name)}</h2>{pre}"
    return (f"<details><summary>{html.escape(name)} ({body.count(chr(10)) + 1} lines; "
            f"click to show)</summary>{pre}</details>")


def _notes(markdown: str) -> str:
    """The prose of a markdown file (its notes and footnotes), its tables left out."""
    paras = [p.strip() for p in markdown.split("\n\n")]
    keep = [p for p in paras if p and not p.startswith(("|", "#"))]
    return "".join(f'<p class="legend">{html.escape(p)}</p>' for p in keep)


def _squeeze(header, rows) -> tuple[list, list, str]:
    """A CSV table made narrow enough to read: columns empty in every row left out, columns
    with one value in every row said once above it; returns (header, rows, that line)."""
    if len(rows) < 2:
        return list(header), rows, ""
    cols = list(range(len(header)))
    values = {i: {r[i] if i < len(r) else "" for r in rows} for i in cols}
    empty = [i for i in cols if values[i] <= {""}]
    same = [i for i in cols if i not in empty and len(values[i]) == 1]
    keep = [i for i in cols if i not in empty and i not in same]
    line = ""
    if same or empty:
        parts = [f"{header[i]} = {_cell(next(iter(values[i])))}" for i in same]
        if empty:
            parts.append("empty: " + ", ".join(header[i] for i in empty))
        line = f'<p class="legend">In every row: {html.escape("; ".join(parts))}</p>'
    return [header[i] for i in keep], [[r[i] if i < len(r) else "" for i in keep]
                                       for r in rows], line


def _folder_artifacts(folder: str) -> tuple[str, str]:
    """(text, html) of what a collection folder itself holds: CSV tables (numbers to 4
    significant digits), PNG plots, the notes of a markdown table beside its CSV, short
    text files; JSON (raw data) and long text folded into a <details>."""
    texts, blocks, raw = [], [], []
    names = sorted(os.listdir(folder))
    stems = {n[:-4] for n in names if n.endswith(".csv")}
    for name in names:
        path = os.path.join(folder, name)
        if not os.path.isfile(path) or name == HTML_NAME:
            continue
        try:
            if name.endswith(".json"):
                body = json.dumps(_read_json(path), indent=2)[:MAX_TEXT_CHARS]
                raw.append(_text_block(f"{name} (raw JSON, {os.path.getsize(path):,} bytes)",
                                       body, True))
                texts.append(f"{name}: JSON ({os.path.getsize(path):,} bytes)")
            elif name.endswith(".csv"):
                with open(path, newline="") as f:
                    rows = list(csv.reader(f))
                if rows:
                    shown = rows[1:MAX_CSV_ROWS + 1]
                    more = len(rows) - 1 - len(shown)
                    header, shown, same = _squeeze(rows[0], shown)
                    blocks.append(f"<h2>{html.escape(name)}</h2>" + same
                                  + '<div class="fit">' + _table(header, shown, True) + "</div>"
                                  + _legend(header, COLUMN_HELP)
                                  + (f"<p>{more} more rows in the file</p>" if more > 0 else ""))
                    texts.append(f"{name}: {len(rows) - 1} rows x {len(rows[0])} columns")
            elif name.endswith(".txt") or name.endswith(".md"):
                with open(path, errors="replace") as f:
                    body = f.read(MAX_TEXT_CHARS)
                if name.endswith(".md") and name[:-3] in stems:    # the CSV shows its table
                    blocks.append(f"<h2>Notes ({html.escape(name)})</h2>" + _notes(body))
                    raw.append(_text_block(name, body, True))
                else:
                    lines = body.splitlines()
                    blocks.append(_text_block(name, body, len(lines) > MAX_PRE_LINES))
                texts.append(f"{name}:\n{body.rstrip()}")
            elif name.endswith(".png"):
                blocks.append(_png_tag(path, name))
                texts.append(f"{name}: plot")
        except (OSError, ValueError, ReportError) as exc:   # show what is broken, keep going
            blocks.append(f'<p class="warn">{html.escape(name)}: could not read ({html.escape(str(exc))})</p>')
            texts.append(f"{name}: could not read ({exc})")
    if os.path.isdir(os.path.join(folder, "diagnostics")):
        blocks.append('<p class="warn">diagnostics/ is present: NOT private values (exact, '
                      "noise-free counts); not embedded here, do not share that folder.</p>")
        texts.append("diagnostics/: present, NOT private (not shown)")
    if raw:
        blocks.append("<h2>Raw files</h2>" + "\n".join(raw))
    return "\n".join(texts), "\n".join(blocks)


def comparison_plot(rows: list[dict]) -> bytes | None:
    """The folder's runs side by side: student and label accuracy against eps, one line per
    trust model / mechanism (PNG bytes; None when fewer than two runs have both)."""
    pts = [r for r in rows if r.get("status", "").startswith("complete")
           and isinstance(r.get("eps"), (int, float)) and r["eps"] == r["eps"]]
    if len(pts) < 2:
        return None
    from rknn_ray.plots import runs_vs_eps_png  # defers matplotlib
    return runs_vs_eps_png([((str(r.get("dataset")), f"{r.get('model')}/{r.get('mechanism')}"),
                             r["eps"],
                             r.get("accuracy", NAN), r.get("label_accuracy", NAN)) for r in pts])


# ------------------------------------------------------------------ the command

def build_report(path: str, out: str | None = None, write_html: bool = True,
                 include_diagnostics: bool = False) -> tuple[str, str | None]:
    """Returns (the text summary, the HTML file written or None)."""
    folder = os.path.abspath(path)
    if not os.path.isdir(folder):
        raise ReportError(f"{path} is not a folder")
    is_run = os.path.isfile(os.path.join(folder, REPORT)) or \
        os.path.isfile(os.path.join(folder, INCOMPLETE))
    if is_run:
        run = load_run(folder)
        run["include_diagnostics"] = include_diagnostics
        try:
            run_sections(run)
        except (AttributeError, TypeError, KeyError) as exc:
            raise ReportError(f"{os.path.join(folder, REPORT if run['report'] else INCOMPLETE)} "
                              f"does not have a run report's shape ({type(exc).__name__}: {exc})") from None
        text = text_summary(run)
        title = f"rknn-ray run {run['name']}" + (" [includes NOT private diagnostics]"
                                                   if include_diagnostics and run["diagnostics"] else "")
        rep = run["report"] or {}
        sub = (f"{(rep.get('privacy') or {}).get('model', '?')} model, version {rep.get('version', '?')}"
               if rep else "unfinished run")
        doc = page(title, sub, run_html_body(run))
    else:
        runs, skipped = [], []
        for f in find_runs(folder):
            try:
                run = load_run(f)
                run_row(run), run_sections(run)        # a run the summary cannot read is skipped
                runs.append(run)
            except (OSError, ValueError, ReportError, AttributeError, TypeError, KeyError) as exc:
                skipped.append((os.path.relpath(f, folder), str(exc).splitlines()[0][:300]))
        for r in runs:
            r["name"] = os.path.relpath(r["path"], folder)
        art_text, art_html = _folder_artifacts(folder)
        if not runs and not art_text and not skipped:
            raise ReportError(f"{path} holds no run folder ({REPORT} or {INCOMPLETE}) and no "
                              "results (JSON, CSV, TXT, PNG) to report")
        rows = [run_row(r) for r in runs]
        text = f"folder {folder}: {len(runs)} run(s)"
        if rows:
            text += "\n" + table_text(rows)
        if art_text:
            text += "\n" + art_text
        if skipped:
            text += f"\nskipped {len(skipped)} unreadable run folder(s):" + "".join(
                f"\n  {name}: {why}" for name, why in skipped)
        body = []
        if skipped:
            body.append('<h2>Skipped</h2><p class="warn">' + "<br>".join(
                f"{html.escape(name)}: {html.escape(why)}" for name, why in skipped) + "</p>")
        if rows:
            body.append("<h2>Runs</h2>" + _table(
                ROW_COLUMNS, [[_fmt(r.get(c)) if c != "stage_s" or r.get(c) is None
                               else f"{r[c]:.1f}" for c in ROW_COLUMNS] for r in rows], True)
                + _legend(ROW_COLUMNS, COLUMN_HELP))
            png = comparison_plot(rows)
            if png:
                body.append("<h2>Comparison</h2>" + _png_tag(
                    png, "student accuracy (solid) and label accuracy (dashed) of every "
                    "finished run against its eps"))
        body.append(art_html)
        for r in runs:
            body.append(f"<h2>Run {html.escape(r['name'])}</h2>" + run_html_body(r, "h3"))
        doc = page(f"rknn-ray runs in {os.path.basename(folder)}", f"{len(runs)} run(s)",
                   "\n".join(body))
    written = None
    if write_html:
        written = os.path.abspath(out or os.path.join(folder, HTML_NAME))
        write_text(written, doc)              # atomic; a full disk is named
    return text, written


EXAMPLES = """\
examples:
  rknn-ray report runs/eps05               # a run: summary + runs/eps05/report.html
  rknn-ray report runs/compare-digits      # a folder of runs: one table
  python -m jobs.report runs/eps05 --no-html"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray report", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a run folder, or a folder of runs (comparison, grid)")
    ap.add_argument("--out", default=None, help=f"HTML file (default PATH/{HTML_NAME})")
    ap.add_argument("--no-html", action="store_true", help="print the summary only")
    ap.add_argument("--include-diagnostics", action="store_true",
                    help="embed the NOT private diagnostics/ plots too (the page says so)")
    args = ap.parse_args(argv)
    try:
        text, written = build_report(args.path, args.out, not args.no_html, args.include_diagnostics)
    except (ReportError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(text)
        if written:
            print(f"report: {written}")
        sys.stdout.flush()          # a closed pipe shows here, not at exit
    except BrokenPipeError:         # `rknn-ray report DIR | head`: the reader had enough
        return reader_gone()
    return 0


if __name__ == "__main__":
    sys.exit(main())

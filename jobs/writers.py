"""The files every experiment writes (jobs.compare, jobs.grid, benchmarks.adaptive_rounds):
a JSON document, a CSV and a markdown table, a PNG figure and meta.json, each written
atomically (rknn_ray.runio) and rewritten after every cell, so an interrupted experiment
leaves a consistent set. The experiments say what goes into each file; how a cell is
printed, how a table is laid out and how a file reaches the disk are said once, here.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from typing import Callable

from rknn_ray.runio import write_json, write_text


def fmt(v, nd: int = 4) -> str:
    """A table cell: floats to ``nd`` significant digits, NaN as n/a, None as empty."""
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.{nd}g}"
    return "" if v is None else str(v)


def rows_to_csv(rows: list[dict], columns) -> str:
    """CSV text of ``rows`` with exactly ``columns`` (other keys are left out)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(columns), extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()


def markdown_table(header, rows, tails=None) -> list[str]:
    """Markdown table lines: ``header`` names, ``rows`` lists of cell texts; ``tails[i]``
    (optional) is appended after row i's closing bar (a failed cell's error)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, r in enumerate(rows):
        lines.append("| " + " | ".join(str(c) for c in r) + " |" + (tails[i] if tails else ""))
    return lines


def print_result(doc, as_json: bool, markdown_path: str) -> None:
    """An experiment job's answer on stdout: its JSON (``--json``) or its markdown table."""
    if as_json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        with open(markdown_path) as fh:
            print(fh.read())


def rows_markdown(rows: list[dict], columns, nd: int = 4) -> list[str]:
    """Markdown table lines of ``rows`` with exactly ``columns``, each cell through :func:`fmt`;
    a row with an ``error`` gets it after its closing bar."""
    return markdown_table(columns, [[fmt(r.get(c), nd) for c in columns] for r in rows],
                          [f" error: {r['error']}" if r.get("error") else "" for r in rows])


def accuracy_vs_eps_png(path: str, lines, title: str, size=(8, 5), notes=(), **finish) -> None:
    """The experiments' "student accuracy vs eps" figure: one line per ``(xs, ys, style)``
    (``style``: matplotlib keywords, ``label`` among them), a small ``(text, (x, y))`` note
    per point of ``notes``, log eps axis (``finish``: the keywords of
    rknn_ray.plots.save_accuracy_vs_eps)."""
    # matplotlib loads only when a figure is drawn, not with every experiment module
    from rknn_ray.plots import plt, save_accuracy_vs_eps
    fig, ax = plt.subplots(figsize=size)
    for xs, ys, style in lines:
        ax.plot(xs, ys, **style)
    for text, xy in notes:
        ax.annotate(text, xy, fontsize=7, xytext=(4, -10), textcoords="offset points")
    save_accuracy_vs_eps(fig, ax, path, title, **finish)


def write_tables(out: str, stem: str, doc, *, table: list[dict] | None = None, columns=(),
                 markdown: str | None = None, plot: Callable[[str], None] | None = None,
                 meta: dict | None = None, json_name: str | None = None,
                 extra: dict | None = None) -> None:
    """An experiment's files in ``out``: ``json_name`` (default ``<stem>.json``) holds ``doc``;
    ``<stem>.csv`` the ``table`` rows with exactly ``columns`` (when columns are given);
    ``<stem>.md`` the ``markdown``; ``meta.json`` the ``meta``; each ``extra`` name its JSON
    document; ``<stem>.png`` what ``plot(path)`` draws. What is None is not written."""
    write_json(os.path.join(out, json_name or f"{stem}.json"), doc)
    if columns:
        write_text(os.path.join(out, f"{stem}.csv"), rows_to_csv(table or [], columns))
    if markdown is not None:
        write_text(os.path.join(out, f"{stem}.md"), markdown)
    if meta is not None:
        write_json(os.path.join(out, "meta.json"), meta)
    for name, value in (extra or {}).items():
        write_json(os.path.join(out, name), value)
    if plot is not None:
        plot(os.path.join(out, f"{stem}.png"))

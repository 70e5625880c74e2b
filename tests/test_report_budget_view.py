"""What a published report says of the budget is no function of the matched source's history.

Which source a job's records are charged to depends on which of them match a known one, so
the source's budget and its spend after the job are the ledger's (the operator's `rknn-ray
budget`), not report.json's or report.html's. Tested with neighbouring tables: D, one of
whose records a prior job on another table Q also held (so D is charged to Q's source, with
Q's spend behind it), and D' with that record's value replaced (a source of its own). The
ledgers differ, as they should; the reports' budget sections and report pages do not.

The console is the operator's view (docs/threat-model.md, "What the operator's console
shows"): of its lines, exactly the two that quote the matched source's budget and spend may
differ between D and D', and do here (Q set a budget of its own, so both lines show it).
"""
import csv
import difflib
import json
import os
import re
import shutil

import pytest

from tests.test_table_holders import _job, _replace_value, _shipped_copy, _views

#: the console lines that are the operator's view: the matched source's budget (before the
#: round) and its spend after the job, read from the ledger (docs/threat-model.md)
OPERATOR_LINES = re.compile(r"^(privacy budget of \S.*: eps=\S+, delta=\S+; this job reserved "
                            r"eps=\S+ \(ledger .*\)|budget of \S.*: eps=\S+, spent eps=\S+ after "
                            r"this job \(composed by .*\))$")
Q_BUDGET = "privacy.budget_eps=7"      # Q's source's budget: not D's config's (its eps)

SHARED_ROW = 40          # the row _replace_value replaces: Q holds it unchanged


def _all_but_the_shared_record_changed(rows):
    """Q's private rows: every record's value changed (each number v to -v - 1: no value of D's is negative, so not even a near fingerprint
    meets D's; label swapped) but the
    shared one's: Q and D overlap in that one record only."""
    header = rows[0]
    label = header.index("label")
    for i, row in enumerate(rows[1:], start=1):
        if i == SHARED_ROW:
            continue
        for j, cell in enumerate(row):
            try:
                row[j] = str(-float(cell) - 1)
            except ValueError:
                pass
        row[label] = "benign" if row[label] == "malignant" else "malignant"


def _q_tables(folder: str) -> str:
    """Q's folder: its private part shares D's one record; its public and evaluation rows
    (which join the record pool too) are changed as well, so nothing else overlaps."""
    _shipped_copy(folder, _all_but_the_shared_record_changed)
    for name in ("public.csv", "evaluation.csv"):
        path = os.path.join(folder, name)
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        for row in rows[1:]:
            for j, cell in enumerate(row):
                try:
                    row[j] = str(-float(cell) - 1)
                except ValueError:
                    pass
        with open(path, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    return folder


def _page_budget_line(folder: str) -> str:
    from jobs.report import main as report_main
    assert report_main([os.path.join(folder, "run")]) == 0
    page = open(os.path.join(folder, "run", "report.html")).read().replace(folder, "FOLDER")
    at = page.index("dataset budget")
    return page[at:page.index("</tr>", at)]


@pytest.fixture(scope="module")
def merge_example(tmp_path_factory, ray_session):
    """Q's job, then D's and D''s, each on a copy of the ledger Q left: the three real jobs
    (joined to the session's Ray)."""
    tmp_path = tmp_path_factory.mktemp("merge")
    q = _job(_q_tables(str(tmp_path / "q")), "table_central.yaml", Q_BUDGET, ray=ray_session)
    assert q[0] == 0, "\n".join(q[1][-20:])
    folders = {}
    for name, change in (("d", None), ("d2", _replace_value)):
        folders[name] = _shipped_copy(str(tmp_path / name), change)
        for f in ("ledger.sqlite", "ledger.sqlite.key"):
            shutil.copy(os.path.join(q[4], f), os.path.join(folders[name], f))
    d, d2 = (_job(folders[n], "table_central.yaml", ray=ray_session) for n in ("d", "d2"))
    assert d[0] == d2[0] == 0, "\n".join((d[1] + d2[1])[-30:])
    return q, d, d2


def test_a_report_shows_nothing_of_the_matched_source_s_history(merge_example):
    _, d, d2 = merge_example
    # the ledgers (the operator's view) differ: D met Q's source, D' made its own
    eps = d[2]["privacy"]["eps"]
    assert [s["spent"]["eps"] for s in d[3]] == [2 * eps]
    assert [s["spent"]["eps"] for s in d2[3]] == [eps, eps]
    # the published reports do not
    budget = [json.loads(json.dumps(j[2]["privacy"]["budget"]).replace(j[4], "FOLDER"))
              for j in (d, d2)]
    assert budget[0] == budget[1]
    assert not {"eps", "delta", "spent_eps", "spent_delta"} & set(budget[0])
    assert _page_budget_line(d[4]) == _page_budget_line(d2[4])


def test_the_consoles_of_the_merge_example_differ_in_the_operator_s_two_lines_only(
        merge_example):
    """D is charged to Q's source (budget 7, Q's spend behind it), D' to a new one: their
    consoles (timings, accuracies and the release's other products left out, as for every
    neighbour test) differ in exactly the two lines docs/threat-model.md names as the
    operator's view; the exit code, report.json's counts and guarantees, and the run
    folder's files do not."""
    _, d, d2 = merge_example
    a, b = _views(d)["console"], _views(d2)["console"]
    diff = [line for line in difflib.unified_diff(a, b, "D (one record in Q's source)",
                                                  "D' (that record replaced)", n=0, lineterm="")
            if not line.startswith("@@")]
    print("\n".join(diff))                       # the console diff of the merge example
    changed = [line[1:] for line in diff[2:]]
    assert len(changed) == 4 and all(OPERATOR_LINES.match(line) for line in changed), diff
    assert [line for line in a if not OPERATOR_LINES.match(line)] == \
        [line for line in b if not OPERATOR_LINES.match(line)]
    assert sum("eps=7" in line for line in changed) == 2            # Q's budget, in D's lines
    # every other view: the same
    assert d[0] == d2[0] == 0
    for key in ("counts", "privacy"):
        one, two = (json.loads(json.dumps(j[2][key]).replace(j[4], "FOLDER")) for j in (d, d2))
        if key == "privacy":
            for p in (one, two):
                p.pop("rounds"), p.pop("details"), p.pop("ledger")   # each holds the job id
        assert one == two, key
    files = [sorted(os.listdir(os.path.join(j[4], "run"))) for j in (d, d2)]
    assert files[0] == files[1]
    docs = open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs",
                             "threat-model.md")).read()
    assert "privacy budget of <source>: eps=B, delta=D; this job reserved eps=E" in docs
    assert "budget of <source>: eps=B, spent eps=S after this job" in docs

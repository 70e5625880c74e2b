"""What a published report says of the budget is no function of the matched source's history.

Which source a job's records are charged to depends on which of them match a known one, so
the source's budget and its spend after the job are the ledger's (the operator's `rknn-ray
budget`), not report.json's or report.html's. Tested with neighbouring tables: D, one of
whose records a prior job on another table Q also held (so D is charged to Q's source, with
Q's spend behind it), and D' with that record's value replaced (a source of its own). The
ledgers differ, as they should; the reports' budget sections and report pages do not.
"""
import csv
import json
import os
import shutil

from tests.test_table_holders import _job, _replace_value, _shipped_copy

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


def test_a_report_shows_nothing_of_the_matched_source_s_history(tmp_path):
    q = _job(_q_tables(str(tmp_path / "q")), "table_central.yaml")
    assert q[0] == 0, "\n".join(q[1][-20:])
    folders = {}
    for name, change in (("d", None), ("d2", _replace_value)):
        folders[name] = _shipped_copy(str(tmp_path / name), change)
        shutil.copy(os.path.join(q[4], "ledger.sqlite"), os.path.join(folders[name],
                                                                      "ledger.sqlite"))
        shutil.copy(os.path.join(q[4], "ledger.sqlite.key"), os.path.join(folders[name],
                                                                          "ledger.sqlite.key"))
    d, d2 = _job(folders["d"], "table_central.yaml"), _job(folders["d2"], "table_central.yaml")
    assert d[0] == d2[0] == 0, "\n".join((d[1] + d2[1])[-30:])
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

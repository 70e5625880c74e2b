"""The ledger's files looked at while other processes make and remove them.

SQLite creates and deletes a ledger's ``-wal`` and ``-shm`` files as connections open and
close, so the regular-file check (rknn_ray/accounting/ledger_file.py) can find a file absent
at one look and present at the next. That was once read as a link to nothing, and
``readlink`` of the regular file raised a bare ``OSError: [Errno 22] Invalid argument``:
one of four Tune cells making one new ledger at once failed with it (2026-12-07)."""
import os
import subprocess
import sys
import time

import pytest

from rknn_ray.accounting import ledger_file
from rknn_ray.errors import LedgerError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _first_look_misses(monkeypatch, path, then=None):
    """``os.stat(path)`` in the module raises FileNotFoundError once, running ``then`` just
    after (the other process's move), then behaves."""
    real, missed = os.stat, []

    def stat(p, *a, **k):
        if os.fspath(p) == str(path) and not missed:
            missed.append(p)
            if then is not None:
                then()
            raise FileNotFoundError(2, "No such file or directory", str(p))
        return real(p, *a, **k)
    monkeypatch.setattr(ledger_file.os, "stat", stat)
    return missed


def test_a_file_made_between_two_looks_is_a_regular_file(tmp_path, monkeypatch):
    wal = tmp_path / "ledger.sqlite-wal"
    missed = _first_look_misses(monkeypatch, wal, then=lambda: wal.write_bytes(b"x"))
    assert ledger_file.regular_file(str(wal), "the WAL", "fix it") is True
    assert missed


def test_a_file_removed_between_two_looks_is_absent(tmp_path, monkeypatch):
    shm = tmp_path / "ledger.sqlite-shm"
    shm.write_bytes(b"x")
    _first_look_misses(monkeypatch, shm, then=shm.unlink)
    assert ledger_file.regular_file(str(shm), "the shm", "fix it") is False


def test_a_link_to_nothing_is_still_refused(tmp_path, monkeypatch):
    link = tmp_path / "ledger.sqlite"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(LedgerError, match="is a symbolic link to nothing"):
        ledger_file.regular_file(str(link), "the privacy ledger", "point it elsewhere")
    # a link whose target appears between the looks is the target's file
    missed = _first_look_misses(monkeypatch, link,
                                then=lambda: (tmp_path / "nowhere").write_bytes(b"x"))
    assert ledger_file.regular_file(str(link), "the privacy ledger", "fix it") is True
    assert missed


def test_a_file_that_never_settles_is_one_line(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"x")
    monkeypatch.setattr(ledger_file.os, "stat", lambda p, *a, **k: (_ for _ in ()).throw(
        FileNotFoundError(2, "No such file or directory", str(p))))
    with pytest.raises(LedgerError, match=r"kept appearing and vanishing .* Fix: "):
        ledger_file.regular_file(str(path), "the privacy ledger", "fix it")


WRITER = r"""
import sys, time
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.ledger_file import regular_file
path, job, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
time.sleep(max(0.0, start - time.time()))
store = BudgetStore(path)
store.reserve("digits/x", "digits", job, 0.1, 0.0, (1e9, 1.0))
for _ in range(50):         # look at the side files while the others open and close theirs
    for side in ("-wal", "-shm", "-journal"):
        regular_file(path + side, "side", "fix")
store.close_job("digits/x", job, "done")
"""


def test_processes_making_one_new_ledger_at_once_all_succeed(tmp_path):
    """Four real processes open one new ledger at the same instant, reserve and close a job
    while looking at its side files: each exits 0, every job is in the file."""
    import sqlite3
    for attempt in range(1):       # the race is narrow: the tests above make it happen
        path = tmp_path / f"ledger-{attempt}.sqlite"
        start = time.time() + 2.0   # after the four have imported
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), f"job-{i}",
                                   str(start)], cwd=REPO, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": REPO})
                 for i in range(4)]
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
        with sqlite3.connect(path) as con:
            jobs = {r[0] for r in con.execute("SELECT job_id FROM releases")}
        assert jobs == {f"job-{i}" for i in range(4)}


def test_an_empty_ledger_whose_wal_goes_while_it_is_checked_is_one_line(tmp_path, monkeypatch):
    """A 0-byte ledger is refused as empty even when its WAL vanishes between the looks
    (was a bare FileNotFoundError from the size of a WAL that had just gone)."""
    path = tmp_path / "ledger.sqlite"
    path.write_bytes(b"")
    wal = tmp_path / "ledger.sqlite-wal"
    real = os.path.getsize

    def getsize(p):
        if os.fspath(p) == str(wal):
            raise FileNotFoundError(2, "No such file or directory", str(p))
        return real(p)
    monkeypatch.setattr(ledger_file.os.path, "getsize", getsize)
    wal.write_bytes(b"x")
    from rknn_ray.accounting.budget_store import REQUIRED, SCHEMA_VERSION, TABLES
    book = object.__new__(ledger_file.LedgerFile)
    book.path, book.tables, book.required = str(path), TABLES, REQUIRED
    book.schema_version, book.timeout = SCHEMA_VERSION, 1.0
    with pytest.raises(LedgerError, match="the file is empty"):
        book.check()

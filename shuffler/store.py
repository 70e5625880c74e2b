"""The shuffler service's store: one SQLite file, committed before any upload is answered.

Why SQLite: a report id is a primary key, so a retried or replayed report can never be
counted twice, and WAL mode with ``synchronous=FULL`` makes a committed request survive a
``kill -9`` or a power cut. What it holds: each accepted report's *inner* record (sealed to
the next hop or the server: never a plaintext, never a key), keyed by a random 128-bit sort
key drawn from the OS CSPRNG at acceptance; how many reports each holder key sent (for the
allowance and the floor of distinct holders), in a table that does not say which reports;
and the count of every answer code. Reports are stored in sort-key order (a ``WITHOUT
ROWID`` table) and released in that order, so neither the file nor the batch keeps
arrival order, and the release streams through the index in bounded memory.
"""
from __future__ import annotations

import secrets
import sqlite3
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sealing.upload_wire import CODES

FILE_NAME = "shuffler.sqlite"
SORT_KEY_LEN = 16
LOOKUP_CHUNK = 500          # report ids per prefetch statement (under SQLite's 999 variables)

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS reports (sort_key BLOB PRIMARY KEY, report_id BLOB NOT NULL UNIQUE,
                                    record BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS holders (key_id BLOB PRIMARY KEY, sent INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS answers (code TEXT PRIMARY KEY, n INTEGER NOT NULL) WITHOUT ROWID;
"""


class StoreError(ValueError):
    """A store folder that cannot be used for this specification (one line, with the fix)."""


def _connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")     # a COMMIT is on disk before it returns
    return db


class _Pending:
    """One open transaction's writes, kept until its commit (then executemany: a few
    statements per group instead of four per report)."""

    def __init__(self):
        self.ids: set = set()
        self.looked_up: set = set()          # ids whose presence in the file is known (prefetch)
        self.in_file: set = set()            # of those, the ones the file holds
        self.rows: list = []                 # (report_id, record)
        self.sent: Counter = Counter()       # key_id -> reports accepted in this transaction
        self.answers: Counter = Counter()


class ReportStore:
    """Accepted reports of one round specification (one store folder per specification).

    The file is the truth; the per-holder counts, the number accepted, the answer counts
    and the early close are mirrored in memory (read from the file at open, updated only
    after a COMMIT returned), so judging a report costs one indexed lookup (is its id
    kept?) and ``/status`` reads no table while the writer thread holds the connection."""

    def __init__(self, folder: str | Path, spec_hash: bytes):
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / FILE_NAME
        self.db = _connect(self.path)
        self.db.executescript(SCHEMA)
        row = self.db.execute("SELECT value FROM meta WHERE name = 'spec_hash'").fetchone()
        if row is None:
            self.db.execute("INSERT INTO meta VALUES ('spec_hash', ?)", (bytes(spec_hash),))
        elif bytes(row[0]) != bytes(spec_hash):
            raise StoreError(f"store {self.path} belongs to specification {bytes(row[0]).hex()[:16]}..., "
                             f"not {bytes(spec_hash).hex()[:16]}...: give each specification "
                             "its own --store folder")
        self._sent = {bytes(k): n for k, n in self.db.execute(
            "SELECT key_id, sent FROM holders WHERE sent > 0")}
        self._accepted = self.db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]
        self._answers = Counter(dict(self.db.execute("SELECT code, n FROM answers")))
        row = self.db.execute("SELECT value FROM meta WHERE name = 'closed_at'").fetchone()
        self._closed = None if row is None else float(bytes(row[0]).decode())
        self._pending: _Pending | None = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One group's writes: all committed (on disk) or none."""
        self.db.execute("BEGIN IMMEDIATE")
        self._pending = pending = _Pending()
        try:
            yield
            self._write(pending)
        except BaseException:
            self._pending = None
            self.db.execute("ROLLBACK")
            raise
        self._pending = None
        self.db.execute("COMMIT")
        for key_id, n in pending.sent.items():      # on disk now: mirror it
            self._sent[key_id] = self._sent.get(key_id, 0) + n
        self._accepted += len(pending.rows)
        self._answers = self._answers + pending.answers   # a new one: /status reads the old

    def _write(self, p: _Pending) -> None:
        before = self.db.total_changes
        rows = [(secrets.token_bytes(SORT_KEY_LEN), rid, rec) for rid, rec in p.rows]
        self.db.executemany("INSERT OR IGNORE INTO reports VALUES (?, ?, ?)", rows)
        if self.db.total_changes - before != len(rows):
            for _, rid, rec in rows:      # a sort-key collision (chance ~n^2 / 2^129)
                self._insert_one(rid, rec)
        self.db.executemany("INSERT INTO holders VALUES (?, ?) ON CONFLICT(key_id) DO UPDATE "
                            "SET sent = sent + excluded.sent", list(p.sent.items()))
        self.db.executemany("INSERT INTO answers VALUES (?, ?) ON CONFLICT(code) DO UPDATE "
                            "SET n = n + excluded.n", list(p.answers.items()))

    def _insert_one(self, report_id: bytes, record: bytes) -> None:
        """``record`` under a fresh random sort key unless its id is already in the file."""
        while self.db.execute("SELECT 1 FROM reports WHERE report_id = ?",
                              (report_id,)).fetchone() is None:
            # draw again on a sort-key collision: never break a tie by arrival order
            self.db.execute("INSERT OR IGNORE INTO reports VALUES (?, ?, ?)",
                            (secrets.token_bytes(SORT_KEY_LEN), report_id, record))

    def _open(self) -> _Pending:
        if self._pending is None:
            raise RuntimeError("store writes happen inside store.transaction()")
        return self._pending

    def prefetch(self, report_ids) -> None:
        """Look up which of ``report_ids`` the file already holds, in one statement per
        :data:`LOOKUP_CHUNK` ids, so :meth:`has` answers them from memory for the rest of
        this transaction (which holds the write lock: no other writer can add one)."""
        p = self._open()
        ids = list({bytes(r) for r in report_ids} - p.looked_up)
        for at in range(0, len(ids), LOOKUP_CHUNK):
            chunk = ids[at:at + LOOKUP_CHUNK]
            p.in_file.update(bytes(r[0]) for r in self.db.execute(
                "SELECT report_id FROM reports WHERE report_id IN (%s)"
                % ",".join("?" * len(chunk)), chunk))
            p.looked_up.update(chunk)

    def has(self, report_id: bytes) -> bool:
        p = self._pending
        if p is not None:
            if report_id in p.ids:
                return True
            if report_id in p.looked_up:
                return report_id in p.in_file
        return self.db.execute("SELECT 1 FROM reports WHERE report_id = ?",
                               (report_id,)).fetchone() is not None

    def sent(self, key_id: bytes) -> int:
        extra = self._pending.sent.get(key_id, 0) if self._pending is not None else 0
        return self._sent.get(key_id, 0) + extra

    def add(self, report_id: bytes, record: bytes, key_id: bytes) -> None:
        """Keep ``record`` (under a fresh random sort key at commit); count one for ``key_id``.
        A report id already kept raises (the intake answers ``duplicate`` before this)."""
        p = self._open()
        if self.has(report_id):
            raise sqlite3.IntegrityError("UNIQUE constraint failed: reports.report_id")
        p.ids.add(report_id)
        p.rows.append((report_id, record))
        p.sent[key_id] += 1

    def count_answers(self, answers: Counter) -> None:
        self._open().answers.update(answers)

    def answers(self) -> dict[str, int]:
        out = dict.fromkeys(CODES, 0)
        out.update(self._answers)
        return out

    def accepted(self) -> int:
        return self._accepted

    def distinct_holders(self) -> int:
        return len(self._sent)

    def records(self, chunk: int = 1024) -> Iterator[list[bytes]]:
        """Accepted records in sort-key order, ``chunk`` at a time (own connection: a
        release streams while uploads are still being refused and counted)."""
        db = _connect(self.path)
        try:
            cur = db.execute("SELECT record FROM reports ORDER BY sort_key")
            while rows := cur.fetchmany(chunk):
                yield [bytes(r[0]) for r in rows]
        finally:
            db.close()

    def closed_at(self) -> float | None:
        """When the operator closed the upload window early (unix seconds), or None."""
        return self._closed

    def close_window(self, at: float) -> float:
        """Close the window at ``at`` (committed; a restart keeps it); the first close stands."""
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('closed_at', ?)",
                            (repr(float(at)).encode(),))
        row = self.db.execute("SELECT value FROM meta WHERE name = 'closed_at'").fetchone()
        self._closed = float(bytes(row[0]).decode())
        return self._closed

    def close(self) -> None:
        self.db.close()

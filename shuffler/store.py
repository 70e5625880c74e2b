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


class ReportStore:
    """Accepted reports of one round specification (one store folder per specification)."""

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

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One request's writes: all committed (on disk) or none."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def has(self, report_id: bytes) -> bool:
        return self.db.execute("SELECT 1 FROM reports WHERE report_id = ?",
                               (report_id,)).fetchone() is not None

    def sent(self, key_id: bytes) -> int:
        row = self.db.execute("SELECT sent FROM holders WHERE key_id = ?", (key_id,)).fetchone()
        return row[0] if row else 0

    def add(self, report_id: bytes, record: bytes, key_id: bytes) -> None:
        """Keep ``record`` under a fresh random sort key; count one report for ``key_id``."""
        while True:
            try:
                self.db.execute("INSERT INTO reports VALUES (?, ?, ?)",
                                (secrets.token_bytes(SORT_KEY_LEN), report_id, record))
                break
            except sqlite3.IntegrityError:
                if self.has(report_id):
                    raise
                # a sort-key collision (chance ~n^2 / 2^129): draw again, never break a tie by order
        self.db.execute("INSERT INTO holders VALUES (?, 1) ON CONFLICT(key_id) DO UPDATE "
                        "SET sent = sent + 1", (key_id,))

    def count_answers(self, answers: Counter) -> None:
        for code, n in answers.items():
            self.db.execute("INSERT INTO answers VALUES (?, ?) ON CONFLICT(code) DO UPDATE "
                            "SET n = n + excluded.n", (code, n))

    def answers(self) -> dict[str, int]:
        out = dict.fromkeys(CODES, 0)
        out.update(self.db.execute("SELECT code, n FROM answers").fetchall())
        return out

    def accepted(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM reports").fetchone()[0]

    def distinct_holders(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM holders WHERE sent > 0").fetchone()[0]

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
        row = self.db.execute("SELECT value FROM meta WHERE name = 'closed_at'").fetchone()
        return None if row is None else float(bytes(row[0]).decode())

    def close_window(self, at: float) -> float:
        """Close the window at ``at`` (committed; a restart keeps it); the first close stands."""
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO meta VALUES ('closed_at', ?)",
                            (repr(float(at)).encode(),))
        return self.closed_at()

    def close(self) -> None:
        self.db.close()

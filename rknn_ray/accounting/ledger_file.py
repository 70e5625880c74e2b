"""The privacy ledger's SQLite file at the edges: made whole, checked on open, locks bounded.

A ledger records spend that must never be forgotten, so an existing path is used only if it
is a readable ledger of a known schema (SQLite header, ``PRAGMA integrity_check``, the
required tables); anything else -- an empty file, another format, damaged pages, a newer
schema -- is refused with a LedgerError that names the file and how to inspect or restore
it, and the file is left untouched. The ledger (and the files SQLite keeps beside it, and
its release key) must be regular files: a FIFO, directory, device or socket is refused by
:func:`regular_file` before anything opens it (opening a FIFO waits for a writer forever);
a symbolic link is followed, and its target must be a regular file. A new ledger is built aside and linked into place, so
a concurrent opener never sees a half-made (empty) file. A lock held by another process is
waited on for ``$RKNN_RAY_LEDGER_TIMEOUT`` seconds (default 10), then refused by name.
"""
from __future__ import annotations

import os
import stat
import sys
import sqlite3
import urllib.parse
from contextlib import contextmanager

from rknn_ray.errors import ConfigError, LedgerError

ENV_PATH = "RKNN_RAY_LEDGER"
ENV_TIMEOUT = "RKNN_RAY_LEDGER_TIMEOUT"
LOCK_TIMEOUT_S = 10.0  # default wait for another process's lock before a clear refusal
SQLITE_HEADER = b"SQLite format 3\x00"
RACE_LOOKS = 20      # looks at a file another process keeps making and removing


def lock_timeout() -> float:
    """Seconds to wait for another process's lock: ``$RKNN_RAY_LEDGER_TIMEOUT``, else 10."""
    raw = os.environ.get(ENV_TIMEOUT)
    if raw is None:
        return LOCK_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 3600:
        raise ConfigError(ENV_TIMEOUT, f"{raw!r} is not a number of seconds in [0, 3600]",
                          f"set {ENV_TIMEOUT}=10 (or unset it)")
    return value


_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def regular_file(path: str, what: str, fix: str) -> bool:
    """Whether ``path`` exists, refusing (LedgerError, one line naming ``what`` and ``fix``)
    anything but a regular file, before anything opens it: a FIFO would block its opener
    until a writer came. A symbolic link is followed: its target must be a regular file (a
    link to nothing is refused too, not replaced by a new file through the link).

    Another process may create or remove the file between two looks (SQLite makes and
    deletes ``-wal`` and ``-shm`` as connections come and go): then it is looked at again,
    never taken for a link to nothing (readlink of a regular file that appeared meanwhile
    was a bare OSError, EINVAL, in four concurrent jobs making one new ledger)."""
    for _ in range(RACE_LOOKS):
        try:
            mode = os.stat(path).st_mode
            break
        except FileNotFoundError:
            dangling = _dangling_link(path)
            if dangling is None:
                continue            # it appeared, or its target did, meanwhile: look again
            if dangling is False:
                return False
            raise LedgerError(f"{path}: {what} is a symbolic link to nothing "
                              f"({dangling}). Fix: {fix}") from None
        except OSError as exc:
            raise LedgerError(f"{path}: {what} cannot be looked up ({exc.strerror}). Fix: "
                              f"{fix}") from None
    else:
        raise LedgerError(f"{path}: {what} kept appearing and vanishing while it was looked "
                          f"up ({RACE_LOOKS} times). Fix: stop what is churning it, or {fix}")
    if stat.S_ISREG(mode):
        return True
    kind = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise LedgerError(f"{path}: {what} is {kind}, not a regular file; nothing was opened. "
                      f"Fix: {fix}")


def _dangling_link(path: str):
    """After ``stat(path)`` found nothing: False if nothing is there, the link's target if
    it is a symbolic link to nothing, None if something appeared since (look again)."""
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return None             # a file made between the two looks
        target = os.readlink(path)
    except FileNotFoundError:
        return False
    except OSError:                 # replaced by a file between lstat and readlink
        return None
    return None if os.path.exists(path) else target


def _size(path: str) -> int:
    """Bytes in ``path``, 0 if it is not there (SQLite may remove a WAL between two looks)."""
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


#: the path of a ledger that lives in memory (a PrivacyLedger with no persistent store)
MEMORY = ":memory:"


def owner_only(path: str, what: str) -> None:
    """Make ``path`` readable by its owner only (0600), saying so on stderr when it was wider:
    a ledger holds its fingerprint key. A file this user cannot change is refused."""
    mode = os.stat(path).st_mode & 0o777
    if not mode & 0o077:
        return
    try:
        os.chmod(path, 0o600)
    except OSError as exc:
        raise LedgerError(f"{path}: {what} is readable by others (mode {mode:o}) and its mode "
                          f"cannot be changed ({exc.strerror}). Fix: chmod 600 {path}") from None
    print(f"warning: {path}: {what} was readable by others (mode {mode:o}); now 600 (owner "
          "only): it holds the key its fingerprints are stored under", file=sys.stderr)


class LedgerFile:
    """One ledger file: ``tables`` (CREATE statements) and ``required`` ({table: columns})
    describe the schema ``schema_version`` (``PRAGMA user_version``) this code reads."""

    def __init__(self, path: str, tables: tuple, required: dict, schema_version: int):
        self.tables, self.required, self.schema_version = tables, required, schema_version
        self.timeout = lock_timeout()
        self._memory = None
        if path == MEMORY:                # one run's ledger: one private in-memory database
            self.path = MEMORY
            self._memory = sqlite3.connect(":memory:", isolation_level=None,
                                           check_same_thread=False)
            for stmt in self.tables:
                self._memory.execute(stmt)
            self._memory.execute(f"PRAGMA user_version = {self.schema_version}")
            return
        self.path = os.path.abspath(path)
        fix = (f"point --ledger / ${ENV_PATH} at your ledger file (or at a path that does "
               "not exist yet, where a new ledger is made)")
        exists = regular_file(self.path, "the privacy ledger", fix)
        for side in ("-wal", "-shm", "-journal"):          # SQLite opens these beside it
            regular_file(self.path + side, f"the privacy ledger's SQLite {side[1:]} file",
                         f"remove {self.path + side} (it is not SQLite's), or {fix}")
        if exists:
            self.check()
            owner_only(self.path, "the privacy ledger")
        else:
            self.create()

    def create(self) -> None:
        """A complete new ledger appears at ``path`` at once (built aside, then linked), so a
        concurrent opener never sees a half-made file; an existing file is never replaced."""
        folder = os.path.dirname(self.path)
        tmp = f"{self.path}.new-{os.getpid()}"
        try:
            os.makedirs(folder, exist_ok=True)
            os.close(os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600))
            os.chmod(tmp, 0o600)     # owner only: the ledger holds its fingerprint key
            con = sqlite3.connect(tmp, isolation_level=None)
            try:
                for stmt in self.tables:
                    con.execute(stmt)
                con.execute(f"PRAGMA user_version = {self.schema_version}")
            finally:
                con.close()
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass                           # another process made it first: use theirs
        except (OSError, sqlite3.Error) as exc:
            raise LedgerError(f"cannot create the privacy ledger {self.path} ({exc}). Fix: make "
                              f"{folder} writable, or point --ledger / ${ENV_PATH} at the ledger "
                              "you keep your budgets in") from None
        finally:
            for leftover in (tmp, tmp + "-journal"):
                if os.path.exists(leftover):
                    os.unlink(leftover)
        self.check()

    def damaged(self, problem: str) -> LedgerError:
        return LedgerError(
            f"{self.path} is not a valid rknn-ray privacy ledger: {problem}. It is left untouched, "
            "and no job may run on it: a new ledger in its place would forget the budget already "
            f"spent. Fix: inspect it (sqlite3 {self.path} 'PRAGMA integrity_check'; `.recover` "
            "salvages readable rows), or restore the ledger from a backup to this path; if "
            f"--ledger / ${ENV_PATH} points at the wrong file, point it at your ledger")

    def check(self) -> None:
        """Refuse (LedgerError) a file that is not a readable ledger of a known schema."""
        try:
            size = os.path.getsize(self.path)
            with open(self.path, "rb") as fh:
                header = fh.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise self.damaged(f"it cannot be read ({exc})") from None
        if size == 0 and not _size(self.path + "-wal"):
            raise self.damaged("the file is empty (0 bytes)")
        if size and header != SQLITE_HEADER:
            raise self.damaged("it is not an SQLite database (wrong file header)")
        uri = "file:" + urllib.parse.quote(self.path) + "?mode=rw"
        try:
            con = sqlite3.connect(uri, uri=True, timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.error(exc) from None
        try:
            check = [r[0] for r in con.execute("PRAGMA integrity_check(5)").fetchall()]
            if check != ["ok"]:
                raise self.damaged("SQLite's integrity_check reports " + "; ".join(check[:3]))
            version = con.execute("PRAGMA user_version").fetchone()[0]
            if version > self.schema_version:
                raise LedgerError(f"{self.path} was written by a newer rknn-ray (ledger schema "
                                  f"{version}, this version reads up to {self.schema_version}). Fix: "
                                  "use the rknn-ray version that wrote it (upgrade this one)")
            for table, columns in self.required.items():
                have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
                if not columns <= have:
                    raise self.damaged(f"it has no {table} table with the columns "
                                        f"{sorted(columns)}" if not have else
                                        f"its {table} table lacks {sorted(columns - have)}")
        except sqlite3.Error as exc:
            raise self.error(exc) from None
        finally:
            con.close()

    def error(self, exc: sqlite3.Error) -> LedgerError:
        """An SQLite error as a LedgerError: a lock held too long, or a damaged file."""
        text = str(exc)
        if "locked" in text or "busy" in text:
            return LedgerError(
                f"the privacy ledger {self.path} is locked by another process; waited "
                f"{self.timeout:g} s (${ENV_TIMEOUT}) and changed nothing. Fix: let the other job "
                f"or `rknn-ray budget` command finish and run this again (`fuser {self.path}` "
                f"names the holder), or wait longer: {ENV_TIMEOUT}=60")
        if "too big" in text or "disk is full" in text:
            # not damage: a value above SQLite's limits, or no room on the disk
            return LedgerError(
                f"the privacy ledger {self.path} could not take this job's entry (SQLite says "
                f"{text!r}); the transaction was rolled back and the ledger is unchanged. Fix: "
                "free space on the ledger's disk; a value too big for SQLite is a bug in "
                "rknn-ray: report it with the job's record count")
        return self.damaged(f"SQLite says {text!r}")

    @contextmanager
    def connect(self):
        if self._memory is not None:      # kept open: the database lives as long as the object
            try:
                self._memory.execute("PRAGMA foreign_keys=ON")
                yield self._memory
            except sqlite3.Error as exc:
                raise self.error(exc) from None
            return
        try:
            con = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise self.error(exc) from None
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            yield con
        except sqlite3.Error as exc:
            raise self.error(exc) from None
        finally:
            con.close()

    @contextmanager
    def transaction(self):
        with self.connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                raise

"""A privacy budget that lasts across jobs: a SQLite ledger keyed by the private records' source.

This is the project's one ledger: a job's :class:`~rknn_ray.accounting.ledger.PrivacyLedger`
is a view over its own rows (identity, job id) of the persistent store at a file, each
release written there once; a ledger with no persistent store (compare, grid, baselines,
benchmarks) views a store that lives in memory (path ``:memory:``), gone when the run
ends. Every release row holds its event and the accountant's choices for it
(``accounting``), and is written only when its (eps, delta) is the accountant's cost of
that event; the (eps, delta) it stores is a cache for readers of the file: what is spent
and listed is that cost again, recomputed from the event. A release whose event cannot be
rebuilt is an error. A budget belongs to the
private records themselves (record-level DP composes per record): a *source* is a pool of records known by their
per-record fingerprints (rknn_ray/accounting/source_identity.py), and any job whose
records overlap a source's draws from that source's one budget -- whatever split, seed,
partition or client count it uses, and in full when it uses only a subset. A job that
touches two sources merges them (their releases compose on the shared budget, which
takes the smaller eps budget). Each budget is set once (the first job's
``privacy.budget_eps``, else its ``privacy.eps``; delta: ``privacy.budget_delta``, else
the larger of the job's delta and 1/(10 n)) and changed only by ``rknn-ray budget set``.

The delta spent on a source never reaches 1/n (n: the fewest private records any job on
it used): past that an (eps, delta) guarantee may expose a whole record outright.

A job *reserves* its whole planned spend in one transaction before any client
randomizes, and *commits* each round's release (with its event, through the job's
ledger, once release.npz is on disk) after it. A crash
leaves the reservation counted: a release that may have happened is never forgotten.
What is spent is composed by the job's accountant (``basic`` sums, or ``pld``; against a
pure budget, delta = 0, pure events compose exactly by their sum) from the stored events.

SQLite in WAL mode (stdlib ``sqlite3``), ``BEGIN IMMEDIATE`` for every check-and-write,
so two jobs started at once cannot both squeeze under the budget. The file itself (made
whole, refused untouched when it is not a valid ledger, locks waited on for a bounded
time) is rknn_ray/accounting/ledger_file.py.

Ledgers written before the record-pool identity (schema version 0/1) are migrated
explicitly: their identities are listed as *legacy*, and the first job on a dataset of
the same name moves their releases (and budget) onto its source (see ``aliases``).
Schema 2 stored bare fingerprints: opening it keys them in place under the ledger's
fingerprint key (kept in ``meta``, so whoever reads the file holds it too).

A reservation is *started* (its ``started`` column) before its first client may
randomize; ``settle`` counts a started reservation as spent and returns only one that
never started.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass

import numpy as np

from rknn_ray.accounting.ledger_file import ENV_PATH, LedgerFile, owner_only, regular_file
from rknn_ray.accounting.source_identity import (FINGERPRINT_DTYPE, keyed_fingerprints,
                                                 sorted_unique)
from rknn_ray.accounting.units import MAX_BUDGET_EPS
from rknn_ray.errors import ConfigError, LedgerError, PrivacyBudgetError

RESERVED_NOTE = "reserved before any client randomized"
SLACK = 1e-9           # relative: float sums of fractions of eps must not refuse an exact fit
SCHEMA_VERSION = 4     # 4: large pools in chunks; 3: keyed fingerprints; 2: record-pool sources;
                       # 0/1: manifest identities
#: fingerprints a source keeps in its own row per kind; beyond it, the rest in source_chunks
#: rows of this many each (64 MB: SQLite refuses a row above 1e9 bytes, and 1e8 records'
#: two kinds are 1.6 GB)
CHUNK = 1 << 23
DEFAULT_DELTA_SHARE = 0.1   # a new source's default delta budget: 1/(10 n)
#: ``meta`` key of a check value of the ledger's release key (``<ledger>.key``): a ledger that
#: has one had a key, and never gets a new one silently (BudgetStore.side_key)
KEY_CHECK = "release_key_check"

TABLES = (
    """CREATE TABLE IF NOT EXISTS datasets (
    identity TEXT PRIMARY KEY, description TEXT NOT NULL,
    budget_eps REAL NOT NULL, budget_delta REAL NOT NULL, created REAL NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, identity TEXT NOT NULL REFERENCES datasets(identity),
    job_id TEXT NOT NULL, round INTEGER, status TEXT NOT NULL CHECK (status IN
        ('reserved', 'released', 'unused')),
    eps REAL NOT NULL, delta REAL NOT NULL, event TEXT, note TEXT,
    created REAL NOT NULL, updated REAL NOT NULL, accounting TEXT, meta TEXT,
    started REAL, driver TEXT)""",
    "CREATE INDEX IF NOT EXISTS releases_by_identity ON releases(identity)",
    # v2: a source's record pool (fingerprints: sorted unique little-endian uint64; v3: under
    # the ledger's fingerprint key, and ``near``: the pool's near fingerprints, keyed too)
    """CREATE TABLE IF NOT EXISTS sources (
    identity TEXT PRIMARY KEY, dataset TEXT NOT NULL, records INTEGER NOT NULL,
    min_private INTEGER, fingerprints BLOB NOT NULL, near BLOB)""",
    # v4: a pool beyond CHUNK fingerprints: its first CHUNK stay in the source's row, the
    # rest here in order (seq 1, 2, ...), per kind ('exact' = sources.fingerprints, 'near')
    """CREATE TABLE IF NOT EXISTS source_chunks (
    identity TEXT NOT NULL, kind TEXT NOT NULL CHECK (kind IN ('exact', 'near')),
    seq INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (identity, kind, seq))""",
    # v2: an identity that no longer exists, and the source its releases moved to
    """CREATE TABLE IF NOT EXISTS aliases (
    old TEXT PRIMARY KEY, new TEXT NOT NULL, reason TEXT NOT NULL, created REAL NOT NULL)""",
    # v2: identities from before the record-pool identity, not yet migrated
    "CREATE TABLE IF NOT EXISTS legacy (identity TEXT PRIMARY KEY, description TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
)
REQUIRED = {"datasets": {"identity", "description", "budget_eps", "budget_delta", "created"},
            "releases": {"identity", "job_id", "round", "status", "eps", "delta", "event"}}


def default_path() -> str:
    """``$RKNN_RAY_LEDGER``, else the user's data directory (XDG), ``rknn-ray/ledger.sqlite``."""
    if os.environ.get(ENV_PATH):
        return os.environ[ENV_PATH]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "rknn-ray", "ledger.sqlite")


def default_delta_budget(delta: float, records: int) -> float:
    """A new source's delta budget when none is configured: the job's delta, but at least
    1/(10 n), so a pure first job (delta 0) does not lock every later shuffle job out."""
    return max(float(delta), DEFAULT_DELTA_SHARE / max(1, int(records)))


def job_default_budget(privacy, records: int) -> tuple[float, float]:
    """The budget a job's config gives a source it is the first job on: ``budget_eps``
    else its eps; ``budget_delta`` else :func:`default_delta_budget`."""
    return (privacy.budget_eps or privacy.eps,
            privacy.budget_delta if privacy.budget_delta is not None
            else default_delta_budget(privacy.delta, records))


def _up(x: float) -> str:
    """``x`` printed with 6 significant digits, never below ``x`` (a budget to type in)."""
    s = f"{x:.6g}"
    return s if float(s) >= x else f"{x * (1 + 1e-6):.6g}"


def _plain(value):
    """JSON for what a run's ledger shows beside a release: numpy scalars as numbers."""
    return value.item() if hasattr(value, "item") else str(value)


_keyed = keyed_fingerprints


def _pool(con, identity: str, kind: str, blob) -> np.ndarray:
    """A source's stored fingerprints of ``kind``: its row's ``blob``, then its chunks."""
    head = np.frombuffer(blob or b"", dtype=FINGERPRINT_DTYPE)
    rest = [np.frombuffer(data, dtype=FINGERPRINT_DTYPE) for (data,) in con.execute(
        "SELECT data FROM source_chunks WHERE identity = ? AND kind = ? ORDER BY seq",
        (identity, kind))]
    return np.concatenate([head] + rest) if rest else head


def _store_chunks(con, identity: str, kind: str, pool: np.ndarray) -> None:
    """``pool`` past its first CHUNK values as source_chunks rows (none: a small pool)."""
    con.execute("DELETE FROM source_chunks WHERE identity = ? AND kind = ?", (identity, kind))
    for seq, at in enumerate(range(CHUNK, len(pool), CHUNK), start=1):
        con.execute("INSERT INTO source_chunks VALUES (?, ?, ?, ?)",
                    (identity, kind, seq, memoryview(pool[at:at + CHUNK])))


def _union(arrays: list) -> np.ndarray:
    """Sorted distinct values of ``arrays`` (None: none) as FINGERPRINT_DTYPE, contiguous; one
    array that is sorted distinct already is used as it is (a 1e8-record source's fingerprints
    are 0.8 GB a kind: every needless copy is one more of those in the driver, issue 46)."""
    parts = [np.asarray(a, FINGERPRINT_DTYPE).ravel() for a in arrays
             if a is not None and np.size(a)]
    if not parts:
        return np.zeros(0, FINGERPRINT_DTYPE)
    if len(parts) == 1 and bool(np.all(parts[0][1:] > parts[0][:-1])):
        return np.ascontiguousarray(parts[0])
    return np.ascontiguousarray(sorted_unique(np.concatenate(parts)), FINGERPRINT_DTYPE)


@dataclass
class Spend:
    eps: float
    delta: float
    releases: int
    reserved: int


class BudgetStore:
    """The persistent ledger (see module docstring). One connection per use; safe across processes.

    ``purpose="experiment"`` marks an isolated experiment ledger (jobs.grid, jobs.compare):
    every cell is recorded, but each is admitted as an independent hypothetical release
    (neither the eps nor the delta budget nor the 1/n delta cap is enforced there).
    """

    def __init__(self, path: str | None = None, purpose: str | None = None):
        self.file = LedgerFile(path or default_path(), TABLES, REQUIRED, SCHEMA_VERSION)
        self.path, self.timeout = self.file.path, self.file.timeout
        self._connect, self._transaction = self.file.connect, self.file.transaction
        with self._transaction() as con:
            self._upgrade(con)
            row = con.execute("SELECT value FROM meta WHERE key = 'purpose'").fetchone()
            current = row[0] if row else "budget"
            if purpose and purpose != current:
                if con.execute("SELECT COUNT(*) FROM releases").fetchone()[0]:
                    raise LedgerError(f"{self.path} is a {current} ledger with recorded releases; "
                                      f"it cannot become an {purpose} ledger (its delta cap would "
                                      f"be lifted). Fix: give the {purpose} a folder of its own "
                                      "(a fresh --out)")
                con.execute("INSERT OR REPLACE INTO meta VALUES ('purpose', ?)", (purpose,))
                current = purpose
        self.purpose = current

    def _upgrade(self, con) -> None:
        """Create missing tables; an older ledger's identities become legacy (to migrate)."""
        version = con.execute("PRAGMA user_version").fetchone()[0]
        for stmt in TABLES:
            con.execute(stmt)
        # the accountant's choices beside each release's event (Costing; NULL: the defaults),
        # and what a run's ledger shows of it (the guarantee's unit, note, ...; JSON)
        have = {r[1] for r in con.execute("PRAGMA table_info(releases)")}
        for column in ("accounting", "meta", "driver"):
            if column not in have:
                con.execute(f"ALTER TABLE releases ADD COLUMN {column} TEXT")
        if "started" not in have:
            # when a reservation's clients could first randomize (mark_started): a state,
            # never read from the note. An older ledger's open reservation whose note is
            # no longer the one it was made with may have started: it counts as started
            con.execute("ALTER TABLE releases ADD COLUMN started REAL")
            con.execute("UPDATE releases SET started = updated WHERE status = 'reserved' AND "
                        "COALESCE(note, '') != ?", (RESERVED_NOTE,))
        if "near" not in {r[1] for r in con.execute("PRAGMA table_info(sources)")}:
            con.execute("ALTER TABLE sources ADD COLUMN near BLOB")
        if version < 2:
            # compare's per-method baseline lines ("<digest>/<method>") are not record budgets
            con.execute("INSERT OR IGNORE INTO legacy SELECT identity, description FROM datasets "
                        "WHERE instr(identity, '/') = 0 AND identity NOT IN "
                        "(SELECT identity FROM sources)")
        if version < 3:
            # v2 stored bare fingerprints (anyone reading the file could test a record's
            # membership): key them in place; the same records still find their source
            con.execute("PRAGMA secure_delete = ON")     # the bare blobs' pages are zeroed
            key = self._fingerprint_key(con)
            for ident, blob in con.execute("SELECT identity, fingerprints FROM sources").fetchall():
                keyed = _keyed(key, np.frombuffer(blob, dtype=FINGERPRINT_DTYPE))
                con.execute("UPDATE sources SET fingerprints = ? WHERE identity = ?",
                            (keyed.tobytes(), ident))
            # v2 descriptions counted the pool's distinct records (a function of the private ones)
            con.execute("UPDATE datasets SET description = (SELECT s.dataset || ': record pool' "
                        "FROM sources s WHERE s.identity = datasets.identity) WHERE identity IN "
                        "(SELECT identity FROM sources)")
        if version < SCHEMA_VERSION:
            con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @staticmethod
    def _fingerprint_key(con) -> bytes:
        """The ledger's secret fingerprint key (made once, from the OS CSPRNG, kept in the
        ledger: whoever holds the file holds the key)."""
        row = con.execute("SELECT value FROM meta WHERE key = 'fingerprint_key'").fetchone()
        if row is None:
            row = (secrets.token_hex(32),)
            con.execute("INSERT INTO meta VALUES ('fingerprint_key', ?)", row)
        return bytes.fromhex(row[0])

    def fingerprint_key(self) -> bytes:
        """The ledger's fingerprint key, for the private-part scan to key its records'
        fingerprints where it reads them (rknn_ray.data.table_scan): no unkeyed fingerprint
        of a private record reaches the driver."""
        with self._transaction() as con:
            return self._fingerprint_key(con)

    def keyed_fingerprints(self, fingerprints: np.ndarray) -> np.ndarray:
        """``fingerprints`` (record_fingerprints / near_fingerprints) as this ledger stores and
        matches them: each under its fingerprint key (keyed BLAKE2b-64), sorted unique."""
        with self._transaction() as con:
            key = self._fingerprint_key(con)
        return _keyed(key, fingerprints)

    def keyed_name(self, digest: str) -> str:
        """``digest`` (of private data) under this ledger's own secret key (HMAC-SHA256).

        Run folders name their release this way (``release.npz``): resume against the same
        ledger recognizes it, while the folder itself holds nothing a reader could test a
        guessed record against. The key is made once, from the OS CSPRNG, inside the ledger."""
        with self._transaction() as con:
            row = con.execute("SELECT value FROM meta WHERE key = 'name_key'").fetchone()
            if row is None:
                row = (secrets.token_hex(32),)
                con.execute("INSERT INTO meta VALUES ('name_key', ?)", row)
        return "hmac-" + hmac.new(bytes.fromhex(row[0]), digest.encode(),
                                  hashlib.sha256).hexdigest()[:32]

    def purpose_key(self, purpose: str) -> bytes:
        """A 32-byte key for one use (``purpose``, e.g. "release.npz"), derived from the
        ledger's secret ``name_key`` (made on first use): HMAC-SHA256 over a label that no
        hex digest given to :meth:`keyed_name` can equal, so the uses never share a key."""
        self.keyed_name("")                   # makes the ledger's key if it has none yet
        with self._connect() as con:
            (key,) = con.execute("SELECT value FROM meta WHERE key = 'name_key'").fetchone()
        return hmac.new(bytes.fromhex(key), f"rknn-ray purpose: {purpose}".encode(),
                        hashlib.sha256).digest()

    def side_key(self, purpose: str) -> bytes:
        """A 32-byte key for ``purpose`` that reading the ledger does not give: derived from a
        secret in a file of its own beside the ledger (``<ledger>.key``, owner only, made from
        the OS CSPRNG), which release.npz is tagged under: a reader of the ledger (a backup,
        a shared copy) cannot re-tag an edited release. An in-memory ledger uses
        :meth:`purpose_key` (nothing outlives its process).

        The key is made only for a ledger that never had one: no check of a key in its
        ``meta`` and no release recorded. A ledger that had one (copied without it) is
        refused naming the missing file, never given a new key silently: its saved releases
        could then never be resumed, and a new one would be tagged under a key the owner's
        copy lacks. The ledger keeps a check of its key (``release_key_check``), so another
        ledger's key beside it is refused too."""
        if self.path == ":memory:":
            return self.purpose_key(purpose)
        path = self.path + ".key"
        exists = regular_file(path, "the ledger's release key",
                              f"copy the key made with this ledger to {path} (a regular file, "
                              "mode 600)")
        with self._transaction() as con:
            row = con.execute("SELECT value FROM meta WHERE key = ?", (KEY_CHECK,)).fetchone()
            if not exists:
                released = con.execute(
                    "SELECT 1 FROM releases WHERE status = 'released' LIMIT 1").fetchone()
                if row is not None or released:
                    why = "had one" if row is not None else "has recorded releases"
                    raise LedgerError(
                        f"the ledger's release key {path} is missing: copy it beside the ledger. "
                        f"Fix: copy {os.path.basename(path)} from where "
                        f"{os.path.basename(self.path)} came from (or a backup) to {path}; "
                        f"this ledger {why}, so no new key is made in its place (its saved "
                        "releases could never be resumed under it)")
                try:
                    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
                except FileExistsError:
                    pass                             # another process made it first: use it
                else:
                    with os.fdopen(fd, "w") as fh:
                        fh.write(secrets.token_hex(32))
                        fh.flush()
                        os.fsync(fh.fileno())
            owner_only(path, "the ledger's release key")
            with open(path, encoding="ascii", errors="replace") as fh:
                text = fh.read(65).strip()
            if not re.fullmatch(r"[0-9a-f]{64}", text):
                raise LedgerError(f"{path} is not the ledger's release key (64 hex digits). Fix: "
                                  "restore it from a backup; without it no saved release of "
                                  "this ledger can be resumed")
            secret = bytes.fromhex(text)
            check = hmac.new(secret, b"rknn-ray release key check", hashlib.sha256).hexdigest()[:32]
            if row is None:
                con.execute("INSERT INTO meta VALUES (?, ?)", (KEY_CHECK, check))
            elif not hmac.compare_digest(row[0], check):
                raise LedgerError(f"{path} is not the release key of the ledger {self.path} (it "
                                  "belongs to another ledger). Fix: copy the key made with this "
                                  f"ledger to {path}")
        return hmac.new(secret, f"rknn-ray side key: {purpose}".encode(),
                        hashlib.sha256).digest()

    # ------------------------------------------------------------------ sources
    def source_identity(self, dataset: str, fingerprints: np.ndarray,
                        legacy: str | None = None,
                        near: np.ndarray | None = None, keyed: np.ndarray | None = None,
                        keyed_near: np.ndarray | None = None) -> tuple[str, str]:
        """(identity, description) of the source that holds these records, registered now.

        ``fingerprints``: the records' bare fingerprints (record_fingerprints), ``near``:
        their near fingerprints (near_fingerprints; None: none); both are stored and matched
        only under the ledger's key. Sources that share a fingerprint of either kind are
        merged into the oldest of them (its identity stays); with no overlap, a new source
        with a random name. The description holds nothing computed from the records (only
        the dataset's declared name). Legacy identities (ledgers from before the
        record-pool identity) are migrated here: ``legacy`` (the job's
        :func:`~rknn_ray.accounting.source_identity.private_data_digest`, the identity the
        old code gave it) and every legacy identity of a dataset named ``dataset``.
        ``keyed`` / ``keyed_near``: more fingerprints, already keyed under this ledger's key
        where their rows were read (a table's private part).
        """
        with self._transaction() as con:
            key = self._fingerprint_key(con)
            # sorted_unique: np.union1d / np.unique hash 64-bit values slowly (numpy >= 2.3)
            fp = _union([_keyed(key, fingerprints), keyed])
            nf = _union([_keyed(key, np.zeros(0) if near is None else near), keyed_near])
            overlapping = []
            for ident, blob, near_blob, created in con.execute(
                    "SELECT s.identity, s.fingerprints, s.near, COALESCE(d.created, 0) FROM "
                    "sources s LEFT JOIN datasets d ON d.identity = s.identity"):
                known = _pool(con, ident, "exact", blob)
                known_near = _pool(con, ident, "near", near_blob)
                if (np.isin(fp, known, assume_unique=True).any()
                        or np.isin(nf, known_near, assume_unique=True).any()):
                    overlapping.append((created, ident, known, known_near))
            overlapping.sort(key=lambda t: (t[0], t[1]))
            # a new source's name is random: report.json publishes it, and a digest of the
            # records would let anyone who knows all but one of them test guesses for it
            survivor = overlapping[0][1] if overlapping else "pool-" + secrets.token_hex(14)
            pool = _union([fp] + [t[2] for t in overlapping])
            pool_near = _union([nf] + [t[3] for t in overlapping])
            del fp, nf
            for _, ident, *_ in overlapping[1:]:
                self._merge(con, ident, survivor, f"a job on {dataset} touched records of both "
                            "sources: their releases compose on one budget")
            prefix = dataset.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + " (%"
            for (old,) in con.execute("SELECT identity FROM legacy WHERE identity = ? OR "
                                      "description LIKE ? ESCAPE '\\'", (legacy or "", prefix)).fetchall():
                self._merge(con, old, survivor, f"migrated: ledger identity from before the "
                            f"record-pool identity, a {dataset} job's")
            # published (report.json, console, `rknn-ray budget`): never a count of the pool,
            # whose distinct records depend on the private ones
            description = f"{dataset}: record pool"
            con.execute("INSERT INTO sources (identity, dataset, records, min_private, fingerprints, "
                        "near) VALUES (?, ?, ?, NULL, ?, ?) ON CONFLICT(identity) DO UPDATE SET "
                        "records = excluded.records, fingerprints = excluded.fingerprints, "
                        "near = excluded.near",
                        (survivor, dataset, len(pool), memoryview(pool[:CHUNK]),
                         memoryview(pool_near[:CHUNK])))
            _store_chunks(con, survivor, "exact", pool)
            _store_chunks(con, survivor, "near", pool_near)
            con.execute("UPDATE datasets SET description = ? WHERE identity = ?",
                        (description, survivor))
        return survivor, description

    def _merge(self, con, old: str, new: str, reason: str) -> None:
        """Move ``old``'s releases (and budget) onto ``new``; ``old`` becomes an alias.

        The merged budget is the smaller eps budget, and the smaller positive delta budget
        (a delta budget of 0 was the old default of a pure first job, not a choice)."""
        row = con.execute("SELECT description, budget_eps, budget_delta, created FROM datasets "
                          "WHERE identity = ?", (old,)).fetchone()
        if row is not None:
            have = con.execute("SELECT budget_eps, budget_delta, created FROM datasets WHERE "
                               "identity = ?", (new,)).fetchone()
            if have is None:
                con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?)", (new, row[0], row[1],
                                                                           row[2], row[3]))
            else:
                deltas = [d for d in (have[1], row[2]) if d > 0]
                con.execute("UPDATE datasets SET budget_eps = ?, budget_delta = ?, created = ? "
                            "WHERE identity = ?", (min(have[0], row[1]), min(deltas, default=0.0),
                                                   min(have[2], row[3]), new))
            con.execute("UPDATE releases SET identity = ? WHERE identity = ?", (new, old))
            con.execute("DELETE FROM datasets WHERE identity = ?", (old,))
        src = con.execute("SELECT min_private FROM sources WHERE identity = ?", (old,)).fetchone()
        if src is not None and src[0] is not None:
            con.execute("UPDATE sources SET min_private = MIN(COALESCE(min_private, ?), ?) "
                        "WHERE identity = ?", (src[0], src[0], new))
        con.execute("DELETE FROM sources WHERE identity = ?", (old,))
        con.execute("DELETE FROM source_chunks WHERE identity = ?", (old,))
        con.execute("DELETE FROM legacy WHERE identity = ?", (old,))
        con.execute("UPDATE aliases SET new = ? WHERE new = ?", (new, old))
        con.execute("INSERT OR REPLACE INTO aliases VALUES (?, ?, ?, ?)", (old, new, reason, time.time()))

    def canonical(self, identity: str) -> tuple[str, str | None]:
        """(the identity a budget now lives under, why it moved or None)."""
        with self._connect() as con:
            row = con.execute("SELECT new, reason FROM aliases WHERE old = ?", (identity,)).fetchone()
        return (identity, None) if row is None else (row[0], row[1])

    def _min_private(self, con, identity: str) -> int | None:
        row = con.execute("SELECT min_private FROM sources WHERE identity = ?", (identity,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    # ------------------------------------------------------------------ reading
    def spent(self, identity: str, con=None) -> Spend:
        """Everything reserved or released on ``identity`` (basic composition: sums; a
        release at the accountant's cost of its event, recomputed here)."""
        def q(c):
            eps = delta = 0.0
            counts = {"released": 0, "reserved": 0}
            for row, cost in self._costs(c, identity):
                eps, delta = eps + cost[0], delta + cost[1]
                counts[row[1]] = counts.get(row[1], 0) + 1
            return Spend(eps, delta, counts["released"], counts["reserved"])
        if con is not None:
            return q(con)
        with self._connect() as c:
            return q(c)

    def budget(self, identity: str) -> tuple[float, float] | None:
        with self._connect() as con:
            row = con.execute("SELECT budget_eps, budget_delta FROM datasets WHERE identity = ?",
                              (identity,)).fetchone()
        return None if row is None else (float(row[0]), float(row[1]))

    def datasets(self) -> list[dict]:
        """One row per dataset identity: its budget, what is spent, its releases, and the
        identities merged into it."""
        with self._connect() as con:
            rows = con.execute("SELECT identity, description, budget_eps, budget_delta, created "
                               "FROM datasets ORDER BY created").fetchall()
            legacy = {r[0] for r in con.execute("SELECT identity FROM legacy")}
            out = []
            for identity, desc, b_eps, b_delta, created in rows:
                spend = self.spent(identity, con)
                src = con.execute("SELECT records, min_private FROM sources WHERE identity = ?",
                                  (identity,)).fetchone()
                cost = {row[0]: c for row, c in self._costs(con, identity)}
                rel = con.execute("SELECT id, job_id, round, status, eps, delta, event, note, "
                                  "updated, meta FROM releases WHERE identity = ? ORDER BY id",
                                  (identity,))
                out.append({"identity": identity, "description": desc,
                            "budget": {"eps": b_eps, "delta": b_delta},
                            "spent": {"eps": spend.eps, "delta": spend.delta},
                            "released": spend.releases, "reserved": spend.reserved,
                            "kind": ("source" if src else "legacy" if identity in legacy
                                     else "other"),
                            "min_private": src[1] if src else None,
                            "merged": [{"identity": o, "reason": why} for o, why in con.execute(
                                "SELECT old, reason FROM aliases WHERE new = ? ORDER BY created",
                                (identity,))],
                            "releases": [{"job_id": j, "round": r, "status": st,
                                          "eps": cost.get(i, (e, dl))[0],
                                          "delta": cost.get(i, (e, dl))[1],
                                          "event": json.loads(ev) if ev else None,
                                          "note": n, "updated": u,
                                          "extra": (json.loads(m) if m else {}).get("extra")}
                                         for i, j, r, st, e, dl, ev, n, u, m in rel.fetchall()]})
        return out

    # ------------------------------------------------------------------ writing
    def set_budget(self, identity: str, eps: float, delta: float, description: str = "",
                   allow_lower: bool = False) -> None:
        """Create or change a dataset's budget (``rknn-ray budget set``; lowering needs allow_lower).

        A delta budget at or above 1/n (n: the fewest private records a job on the source
        used) is refused outside experiment ledgers."""
        if not (eps > 0 and math.isfinite(eps)) or not 0 <= delta < 1:
            raise ConfigError("budget", f"eps={eps} must be finite and > 0, and delta={delta} in "
                              "[0, 1)", "pass a finite positive eps and a delta in [0, 1)")
        with self._transaction() as con:
            n = self._min_private(con, identity)
            if n and self.purpose != "experiment" and delta >= 1.0 / n:
                raise ConfigError("--delta", f"a delta budget of {delta:g} is not below 1/n = "
                                  f"{1.0 / n:.3g} (n = {n}, the fewest private records a job on "
                                  f"{identity} used): an (eps, delta) guarantee with delta >= 1/n "
                                  "may expose a whole record outright",
                                  f"pass --delta below {1.0 / n:.3g}, e.g. 1/(10 n) = {0.1 / n:.2g}")
            row = con.execute("SELECT budget_eps, budget_delta FROM datasets WHERE identity = ?",
                              (identity,)).fetchone()
            if row is None:
                con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?)",
                            (identity, description or identity, eps, delta, time.time()))
            else:
                over_cap = bool(n) and row[1] >= 1.0 / n     # lowering it to the cap: allowed
                if (eps < row[0] or (delta < row[1] and not over_cap)) and not allow_lower:
                    raise PrivacyBudgetError(f"the budget of {identity} is eps={row[0]:g}, "
                                             f"delta={row[1]:g}; lowering it needs --allow-lower")
                con.execute("UPDATE datasets SET budget_eps = ?, budget_delta = ? WHERE identity = ?",
                            (eps, delta, identity))

    def _rows(self, con, identity: str) -> list:
        """Every counted row as (row, item): a release's own event with the accountant's
        choices, a reservation's stated cost (None: a row that costs nothing). A release whose
        event this version cannot rebuild is an error (LedgerError naming the type and the
        fix), never costed as a generic event."""
        from rknn_ray.accounting.accountants import Costing  # defers dp_accounting
        # defers dp_accounting
        from rknn_ray.accounting.events import ApproxDpEvent, UnrebuildableEventError, costed_from_dict
        out = []
        for row in con.execute("SELECT id, status, eps, delta, event, accounting FROM releases "
                               "WHERE identity = ? AND status != 'unused'", (identity,)):
            rid, status, eps, delta, event, accounting = row
            parsed = json.loads(event) if event else None
            if status == "released" and parsed:
                try:
                    ev, legacy = costed_from_dict(parsed)
                except UnrebuildableEventError as exc:
                    raise LedgerError(f"{self.path}: release {rid} on {identity}: {exc}") from None
                choices = {**legacy, **(json.loads(accounting) if accounting else {})}
                out.append((row, (ev, Costing.from_dict(choices))))
            elif eps > 0 or delta > 0:       # a reservation, or a release settled by hand
                out.append((row, ApproxDpEvent(float(eps), float(delta))))
            else:
                out.append((row, None))
        return out

    def _events(self, con, identity: str) -> list:
        """Every counted row's event (see :meth:`_rows`)."""
        return [item for _, item in self._rows(con, identity) if item is not None]

    def _costs(self, con, identity: str) -> list:
        """Every counted row with its (eps, delta): a release's is the accountant's cost of
        its event, whatever the row stores beside it (a cache for readers of the file)."""
        from rknn_ray.accounting.accountants import as_costed, event_cost  # defers dp_accounting
        return [(row, (0.0, 0.0) if item is None else event_cost(*as_costed(item)))
                for row, item in self._rows(con, identity)]

    def composed(self, identity: str, accountant: str = "basic", extra=None,
                 target_delta: float | None = None, con=None) -> tuple[float, float]:
        """(eps, delta) of everything counted on ``identity`` (+ ``extra`` events), composed
        by the named accountant -- the same accountants a run uses.

        Against a pure budget (delta 0) every accountant composes by the sum: exact for pure
        events, and a PLD answers only at a positive delta (it would report 1e-12 > 0 and
        refuse every job). Events with delta > 0 then show delta > 0: refused by name."""
        from rknn_ray.accounting.accountants import get_accountant  # defers dp_accounting

        def q(c):
            events = self._events(c, identity) + list(extra or [])
            if target_delta is None:
                row = c.execute("SELECT budget_delta FROM datasets WHERE identity = ?",
                                (identity,)).fetchone()
                delta = float(row[0]) if row else 0.0
            else:
                delta = target_delta
            if delta <= 0:
                return get_accountant("basic").compose(events)
            return get_accountant(accountant).compose(events, delta)
        if con is not None:
            return q(con)
        with self._connect() as c:
            return q(c)

    def named(self, identity: str, dataset: str, name: str) -> str:
        """The source's description with the user's own name for it (``data.name``: given by
        the user, never derived from the records), written where the datasets list shows it."""
        description = f"{dataset}: {name}"
        with self._transaction() as con:
            con.execute("UPDATE datasets SET description = ? WHERE identity = ?",
                        (description, identity))
        return description

    def reserve(self, identity: str, description: str, job_id: str, eps: float, delta: float,
                default_budget: tuple[float, float], accountant: str = "basic",
                records: int | None = None) -> tuple[float, float]:
        """Reserve a job's whole planned spend, or refuse it; returns the dataset's budget.

        The first job on a dataset sets its budget to ``default_budget``; later jobs find
        it. ``records``: this job's private records n; the source's delta (budget and
        spend) must stay below 1/n for the fewest n any job on it used. Refused
        (PrivacyBudgetError or ConfigError, nothing written) when spent + reserved + this
        job would exceed the budget or that cap.
        """
        from rknn_ray.accounting.events import ApproxDpEvent  # defers dp_accounting
        with self._transaction() as con:
            experiment = self.purpose == "experiment"
            if records:
                con.execute("UPDATE sources SET min_private = MIN(COALESCE(min_private, ?), ?) "
                            "WHERE identity = ?", (int(records), int(records), identity))
            n = self._min_private(con, identity) or (int(records) if records else None)
            cap = None if experiment or not n else 1.0 / n
            row = con.execute("SELECT budget_eps, budget_delta FROM datasets WHERE identity = ?",
                              (identity,)).fetchone()
            if row is None:
                row = default_budget
                if cap is not None and row[1] >= cap:
                    raise ConfigError("privacy.budget_delta", f"the dataset's delta budget "
                                      f"{row[1]:g} is not below 1/n = {cap:.3g} for n = {n} private "
                                      "records: summed over jobs, an (eps, delta) guarantee with "
                                      "delta >= 1/n may expose a whole record outright",
                                      f"set privacy.budget_delta below {cap:.3g}, e.g. 1/(10 n) = "
                                      f"{0.1 * cap:.2g}")
                con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?)",
                            (identity, description, row[0], row[1], time.time()))
            b_eps, b_delta = float(row[0]), float(row[1])
            spend = self.spent(identity, con)
            # a PLD answers at its target delta: the budget's, kept below the 1/n cap
            target = b_delta if cap is None else min(b_delta, cap * (1 - 1e-6))
            total_eps, total_delta = self.composed(identity, accountant, [ApproxDpEvent(eps, delta)],
                                                   target, con)
            over_eps = not experiment and total_eps > b_eps * (1 + SLACK)
            over_delta = not experiment and total_delta > b_delta * (1 + SLACK) + 1e-300
            over_cap = cap is not None and total_delta >= cap
            if over_eps or over_delta or over_cap:
                raise PrivacyBudgetError(self._refusal(
                    identity, description, (b_eps, b_delta), spend, (eps, delta),
                    (total_eps, total_delta), accountant, over_eps, over_delta, cap, n))
            con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                        "note, created, updated) VALUES (?, ?, NULL, 'reserved', ?, ?, NULL, ?, ?, ?)",
                        (identity, job_id, eps, delta, RESERVED_NOTE, time.time(), time.time()))
        return b_eps, b_delta

    def _refusal(self, identity, description, budget, spend, job, total, accountant,
                 over_eps, over_delta, cap, n) -> str:
        """The refusal: which quantity is the limit, and the exact fix."""
        (b_eps, b_delta), (eps, delta), (t_eps, t_delta) = budget, job, total
        limits = ([f"eps ({t_eps:.6g} > budget {b_eps:g})"] if over_eps else []) + \
                 ([f"delta ({t_delta:.3g} > budget {b_delta:g})"] if over_delta else [])
        head = (f"refused before any work: {description} has a privacy budget of eps={b_eps:g}, "
                f"delta={b_delta:g}; eps={spend.eps:.6g}, delta={spend.delta:.3g} is already spent or "
                f"reserved ({spend.releases} releases, {spend.reserved} open reservations), and "
                f"this job needs eps={eps:g}, delta={delta:g}: {accountant} composition gives "
                f"eps={t_eps:.6g}, delta={t_delta:.3g}. ")
        if cap is not None and t_delta >= cap:
            room = max(0.0, cap - spend.delta)
            return head + (
                f"The limit is delta: the total would reach 1/n = {cap:.3g} (n = {n} private "
                "records), which no budget may allow (an (eps, delta) guarantee with delta >= "
                f"1/n may expose a whole record outright). Fix: lower privacy.delta well below "
                f"the {room:.2g} left (lowering eps does not help), or use a pure-DP model "
                f"(central or local, delta = 0) (ledger: {self.path})")
        command = (f"rknn-ray budget set {identity} --eps {_up(max(b_eps, t_eps))} "
                   f"--delta {_up(max(b_delta, t_delta))}")
        if over_eps and float(_up(t_eps)) > MAX_BUDGET_EPS:   # no `budget set` admits it
            fix = (f"lower privacy.eps{' and privacy.delta' if over_delta else ''}: the total "
                   f"eps={t_eps:.6g} is above {MAX_BUDGET_EPS:g}, the largest budget `rknn-ray "
                   "budget set` takes")
        elif over_eps and not over_delta:
            fix = f"lower privacy.eps, or raise the budget explicitly: {command}"
        elif over_delta and not over_eps:
            fix = (f"raise the delta budget explicitly: {command} (lowering eps does not help), "
                   "or lower privacy.delta")
        else:
            fix = f"raise the budget explicitly: {command}, or lower privacy.eps and privacy.delta"
        return head + f"The limit is {' and '.join(limits)}. Fix: {fix} (ledger: {self.path})"

    def _checked(self, what: str, eps: float, delta: float, event: dict | None, accounting):
        """The accountant's choices for a release about to be written, after checking that
        its event rebuilds and costs exactly (eps, delta) under them (else LedgerError)."""
        from rknn_ray.accounting.accountants import Costing, event_cost  # defers dp_accounting
        # defers dp_accounting
        from rknn_ray.accounting.events import UnrebuildableEventError, costed_from_dict
        costing = accounting if isinstance(accounting, Costing) else Costing.from_dict(accounting)
        if event is None:
            return None
        try:
            ev, legacy = costed_from_dict(event)
        except UnrebuildableEventError as exc:
            raise LedgerError(f"refused to record {what}: {exc}") from None
        if legacy and accounting is None:      # an event written with its bound inside
            costing = Costing.from_dict(legacy)
        cost = event_cost(ev, costing)
        if not (abs(cost[0] - eps) <= 1e-9 * max(1.0, abs(eps))
                and abs(cost[1] - delta) <= 1e-9 * abs(delta) + 1e-300):
            raise LedgerError(f"refused to record {what}: its {ev.__class__.__name__} costs "
                              f"eps={cost[0]:.9g}, delta={cost[1]:.3g} under {costing}, not the "
                              f"eps={eps:.9g}, delta={delta:.3g} given. Fix: commit the "
                              "accountant's cost of the event, with the Costing it was computed "
                              "under")
        return costing

    @staticmethod
    def _insert_release(con, identity, job_id, round_id, eps, delta, event, note, costing,
                        meta=None) -> None:
        con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                    "note, created, updated, accounting, meta) VALUES (?, ?, ?, 'released', ?, ?, "
                    "?, ?, ?, ?, ?, ?)",
                    (identity, job_id, round_id, eps, delta, json.dumps(event, default=str),
                     None if note is None else plain_note(note),
                     time.time(), time.time(),
                     None if costing is None else json.dumps(costing.to_dict()),
                     None if meta is None else json.dumps(meta, default=_plain)))

    def commit_round(self, identity: str, job_id: str, round_id: int, eps: float, delta: float,
                     event: dict | None, note: str = "released", accounting=None,
                     meta: dict | None = None, left: tuple | None = None) -> None:
        """Move one round's spend from the job's reservation to a release with its event.

        ``left``: the (eps, delta) the reservation keeps for the job's later rounds, where
        the rounds' own costs do not add up to the job's (rounds calibrated together under
        the pld accountant: rknn_ray.mechanisms.composed_rounds); None: the reservation
        less this release.

        ``note`` marks the release (a seeded simulation says NOT PRIVATE here).
        ``accounting``: the accountant's choices the release was costed with (a Costing or
        its dict; None: the defaults). ``meta``: what the job's ledger shows of it (its
        guarantee's unit, note, ...; rknn_ray.accounting.ledger.PrivacyLedger writes it).
        The event must rebuild and cost exactly the (eps, delta) committed: the store keeps
        one source of privacy numbers.
        """
        costing = self._checked(f"round {round_id} of job {job_id}", eps, delta, event, accounting)
        with self._transaction() as con:
            res = con.execute("SELECT id, eps, delta FROM releases WHERE identity = ? AND job_id = ? "
                              "AND status = 'reserved'", (identity, job_id)).fetchone()
            if res is None:
                raise PrivacyBudgetError(f"job {job_id} holds no reservation on {identity}; a "
                                         "release must be reserved before clients randomize")
            rid, r_eps, r_delta = res
            keep = (max(0.0, r_eps - eps), max(0.0, r_delta - delta)) if left is None else left
            con.execute("UPDATE releases SET eps = ?, delta = ?, updated = ? WHERE id = ?",
                        (float(keep[0]), float(keep[1]), time.time(), rid))
            self._insert_release(con, identity, job_id, round_id, eps, delta, event, note, costing,
                                 meta)

    def append_release(self, identity: str, job_id: str, round_id: int, eps: float, delta: float,
                       event: dict | None, accounting=None, meta: dict | None = None,
                       note: str = "released") -> None:
        """Record a release with no reservation (a run's own ledger, which checks its budget
        itself: rknn_ray.accounting.ledger.PrivacyLedger). Same checks as commit_round."""
        costing = self._checked(f"round {round_id} of {job_id}", eps, delta, event, accounting)
        with self._transaction() as con:
            con.execute("INSERT OR IGNORE INTO datasets VALUES (?, ?, ?, ?, ?)",
                        (identity, identity, float("inf"), 1.0, time.time()))
            self._insert_release(con, identity, job_id, round_id, eps, delta, event, note, costing,
                                 meta)

    def release_rows(self, identity: str, job_id: str, after: int = 0) -> list[dict]:
        """The released rows of one job on ``identity`` in order, those past row ``after``
        only (a ledger view reads each row once): id, round, eps, delta, event, accounting,
        meta."""
        with self._connect() as con:
            rows = con.execute("SELECT id, round, eps, delta, event, accounting, meta FROM releases "
                               "WHERE identity = ? AND job_id = ? AND status = 'released' AND "
                               "id > ? ORDER BY id", (identity, job_id, int(after))).fetchall()
        return [{"id": i, "round": r, "eps": e, "delta": d, "event": json.loads(ev) if ev else None,
                 "accounting": json.loads(a) if a else None, "meta": json.loads(m) if m else {}}
                for i, r, e, d, ev, a, m in rows]

    def close_job(self, identity: str, job_id: str, note: str) -> None:
        """The job ended normally: what it reserved and did not release is given back."""
        note = plain_note(note)
        with self._transaction() as con:
            con.execute("UPDATE releases SET status = 'unused', note = ?, updated = ? WHERE "
                        "identity = ? AND job_id = ? AND status = 'reserved'",
                        (note, time.time(), identity, job_id))

    def mark_failed(self, identity: str, job_id: str, note: str) -> None:
        """The job died where a release may have happened: its reservation stays counted."""
        note = plain_note(note)
        with self._transaction() as con:
            con.execute("UPDATE releases SET note = ?, updated = ? WHERE identity = ? AND "
                        "job_id = ? AND status = 'reserved'", (note, time.time(), identity, job_id))

    def spend_job(self, identity: str, job_id: str, note: str) -> None:
        """The job ended itself where a release may have happened: what it reserved and did
        not commit is counted as spent now (as ``settle`` would), so nothing stays open."""
        note = plain_note(note)
        with self._transaction() as con:
            con.execute("UPDATE releases SET status = 'released', note = ?, updated = ? WHERE "
                        "identity = ? AND job_id = ? AND status = 'reserved'",
                        (note, time.time(), identity, job_id))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_RAY_HANDLE = re.compile(r"\bActor(?:Handle)?\((\w+), [0-9a-f]{8,}\)")


def plain_note(text: str, limit: int = 500) -> str:
    """A ledger note as ``rknn-ray budget`` shows it: one line of words, without terminal
    colour codes or Ray's actor handles (Ray's error texts carry both; issue 57)."""
    text = _RAY_HANDLE.sub(r"the \1 actor", _ANSI.sub("", str(text)))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ---------------------------------------------------------------------- open reservations
#: the note a reservation gets when its clients may randomize (mark_started); words only:
#: whether a reservation started is its ``started`` column
STARTED_NOTE = "clients may randomize"
_DRIVER = re.compile(r"driver pid (\d+) on (\S+?)[;)]")


def _driver_alive(driver: str | None, note: str | None) -> bool | None:
    """Whether the job's driver process still runs: None when unknown (another host, no pid).
    ``driver``: the reservation's "pid on host"; older ledgers kept it in the note."""
    m = re.fullmatch(r"(\d+) on (\S+)", driver or "") or _DRIVER.search(note or "")
    if not m or m.group(2) != socket.gethostname():
        return None
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _this_driver() -> str:
    return f"{os.getpid()} on {socket.gethostname()}"


def mark_driver(store: "BudgetStore", identity: str, job_id: str) -> None:
    """Record which driver process holds the job's reservation (settle refuses while it runs),
    from the moment it is made: a job still preparing is not settled from under it."""
    with store._transaction() as con:
        con.execute("UPDATE releases SET driver = ? WHERE identity = ? AND job_id = ? AND "
                    "status = 'reserved'", (_this_driver(), identity, job_id))


def mark_started(store: "BudgetStore", identity: str, job_id: str) -> None:
    """Record on the job's reservation that its clients may randomize from now on (the
    ``started`` state, and which driver process holds it): before this, the job provably
    released nothing. Refused (PrivacyBudgetError) when the reservation is no longer open
    (settled by hand while the job prepared): no client may randomize without one."""
    now, driver = time.time(), _this_driver()
    note = (f"{STARTED_NOTE} since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(now))} "
            f"(driver pid {driver}); a release may happen")
    with store._transaction() as con:
        done = con.execute("UPDATE releases SET started = COALESCE(started, ?), driver = ?, "
                           "note = ?, updated = ? WHERE identity = ? AND job_id = ? AND "
                           "status = 'reserved'", (now, driver, note, now, identity, job_id))
        if done.rowcount == 0:
            raise PrivacyBudgetError(f"job {job_id} holds no open reservation on {identity} (was it "
                                     "settled by hand?): no client may randomize. Fix: re-run the "
                                     "job (it reserves its budget again)")


def open_reservations(store: "BudgetStore", now: float | None = None) -> list[dict]:
    """Every reservation still open (a running job, or one killed without closing it), with
    its age, whether its clients may have randomized (``started``: the ledger's state, or a
    round already committed), and whether its driver still runs."""
    now = time.time() if now is None else now
    with store._connect() as con:
        rows = con.execute(
            "SELECT r.job_id, r.identity, d.description, r.eps, r.delta, r.note, r.created, "
            "r.started, r.driver, "
            "(SELECT COUNT(*) FROM releases x WHERE x.job_id = r.job_id AND x.status = 'released') "
            "FROM releases r JOIN datasets d ON d.identity = r.identity "
            "WHERE r.status = 'reserved' ORDER BY r.created").fetchall()
    return [{"job_id": j, "identity": i, "description": desc, "eps": e, "delta": dl,
             "note": n, "created": c, "age_s": max(0.0, now - c),
             "started": started is not None or bool(released), "started_at": started,
             "driver_alive": _driver_alive(driver, n)}
            for j, i, desc, e, dl, n, c, started, driver, released in rows]


def _when(t: float | None) -> str:
    return "" if t is None else " at " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def settle_fate(row: dict) -> str:
    """What settling an open reservation does, and why (the list's words and settle's note)."""
    if row["started"]:
        return (f"counted as spent: the ledger records that its clients could randomize"
                f"{_when(row.get('started_at'))} (started), so every report opened since is a "
                "release, whoever died")
    return ("returned: the ledger records that no client could randomize (the job died before "
            "its private round started), so nothing was released")


def settle(store: "BudgetStore", job_id: str) -> list[dict]:
    """Close a dead job's open reservation: counted as spent (status ``released``, no round)
    once it started (its ``started`` state, set before the first client randomizes), or
    returned (``unused``) only when it never started: then the job provably released
    nothing. Refuses while the job's driver still runs on this host."""
    rows = [r for r in open_reservations(store) if r["job_id"] == job_id]
    if not rows:
        raise PrivacyBudgetError(f"job {job_id} has no open reservation in {store.path}. Fix: copy "
                                 "a job id from the open reservations `rknn-ray budget` lists")
    for r in rows:
        if r["driver_alive"]:
            raise PrivacyBudgetError(f"job {job_id} is still running (its driver process is alive). "
                                     "Fix: let it finish, or stop it, then settle")
    done = []
    with store._transaction() as con:
        for r in rows:
            status = "released" if r["started"] else "unused"
            note = "settled by hand: " + settle_fate(r)
            # a job that starts meanwhile is not returned (mark_started and this are exclusive)
            changed = con.execute("UPDATE releases SET status = ?, note = ?, updated = ? WHERE "
                                  "identity = ? AND job_id = ? AND status = 'reserved'"
                                  + ("" if r["started"] else " AND started IS NULL"),
                                  (status, note, time.time(), r["identity"], job_id)).rowcount
            if not changed:
                raise PrivacyBudgetError(f"job {job_id} started its private round while being "
                                         "settled; nothing was changed. Fix: run settle again")
            done.append({**r, "status": status, "note": note})
    return done

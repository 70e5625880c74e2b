"""A privacy budget that lasts across jobs: a SQLite ledger keyed by the private data's identity.

The in-run :class:`~rknn_ray.accounting.ledger.PrivacyLedger` forgets everything when
the job ends; this store does not. Every dataset identity (a digest of the private
data's manifest: dataset, split rule, seed, partition, and the bytes of the private
records themselves) has one budget, set once (the first job's ``privacy.budget_eps``,
else its ``privacy.eps``) and raised only by ``rknn-ray budget set``.

A job *reserves* its whole planned spend in one transaction before any client
randomizes, and *commits* each round's release (with its event) after it. A crash
leaves the reservation counted: a release that may have happened is never forgotten.
A job that would go over the budget is refused before Ray starts. What is spent is
composed by the job's accountant (``basic`` sums, or ``pld``) from the stored events,
an open reservation counting at its stated (eps, delta).

SQLite in WAL mode (stdlib ``sqlite3``), ``BEGIN IMMEDIATE`` for every check-and-write,
so two jobs started at once cannot both squeeze under the budget.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from rknn_ray.errors import ConfigError, PrivacyBudgetError

ENV_PATH = "RKNN_RAY_LEDGER"
SLACK = 1e-9          # relative: float sums of fractions of eps must not refuse an exact fit

SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    identity TEXT PRIMARY KEY, description TEXT NOT NULL,
    budget_eps REAL NOT NULL, budget_delta REAL NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, identity TEXT NOT NULL REFERENCES datasets(identity),
    job_id TEXT NOT NULL, round INTEGER, status TEXT NOT NULL CHECK (status IN
        ('reserved', 'released', 'unused')),
    eps REAL NOT NULL, delta REAL NOT NULL, event TEXT, note TEXT,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS releases_by_identity ON releases(identity);
"""


def default_path() -> str:
    """``$RKNN_RAY_LEDGER``, else the user's data directory (XDG), ``rknn-ray/ledger.sqlite``."""
    if os.environ.get(ENV_PATH):
        return os.environ[ENV_PATH]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "rknn-ray", "ledger.sqlite")


def dataset_identity(cfg, private_x: np.ndarray, private_y: np.ndarray,
                     client_ids: np.ndarray) -> tuple[str, str]:
    """(digest, description) of the private data a job touches.

    The digest covers the manifest (dataset, root, split rule, seed, partition) and the
    private records' bytes, so the same data reached another way is still the same data.
    """
    d = cfg.data
    manifest = {"dataset": d.dataset, "data_root": d.data_root, "split": d.split,
                "seed": cfg.run.seed, "partition": d.partition, "clients": d.clients,
                "alpha": d.alpha, "synthetic": d.synthetic}
    h = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode())
    for arr in (private_x, private_y, client_ids):
        a = np.ascontiguousarray(arr)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(memoryview(a).cast("B"))
    description = (f"{d.dataset} (split {d.split}, seed {cfg.run.seed}, {d.partition} partition, "
                   f"{len(private_y)} private records)")
    return h.hexdigest()[:32], description


@dataclass
class Spend:
    eps: float
    delta: float
    releases: int
    reserved: int


class BudgetStore:
    """The persistent ledger (see module docstring). One connection per use; safe across processes."""

    def __init__(self, path: str | None = None):
        self.path = os.path.abspath(path or default_path())
        folder = os.path.dirname(self.path)
        try:
            os.makedirs(folder, exist_ok=True)
            with self._connect() as con:
                con.executescript(SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise ConfigError("--ledger", f"cannot open the privacy ledger {self.path} ({exc})",
                              f"pass --ledger PATH to a writable file, or set {ENV_PATH}") from None

    @contextmanager
    def _connect(self):
        con = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA foreign_keys=ON")
            yield con
        finally:
            con.close()

    @contextmanager
    def _transaction(self):
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    # ------------------------------------------------------------------ reading
    def spent(self, identity: str, con=None) -> Spend:
        """Everything reserved or released on ``identity`` (basic composition: sums)."""
        def q(c):
            row = c.execute("SELECT COALESCE(SUM(eps), 0), COALESCE(SUM(delta), 0), "
                            "SUM(status = 'released'), SUM(status = 'reserved') FROM releases "
                            "WHERE identity = ? AND status != 'unused'", (identity,)).fetchone()
            return Spend(float(row[0]), float(row[1]), int(row[2] or 0), int(row[3] or 0))
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
        """One row per dataset identity: its budget, what is spent, and its releases."""
        with self._connect() as con:
            rows = con.execute("SELECT identity, description, budget_eps, budget_delta, created "
                               "FROM datasets ORDER BY created").fetchall()
            out = []
            for identity, desc, b_eps, b_delta, created in rows:
                spend = self.spent(identity, con)
                rel = con.execute("SELECT job_id, round, status, eps, delta, event, note, updated "
                                  "FROM releases WHERE identity = ? ORDER BY id", (identity,))
                out.append({"identity": identity, "description": desc,
                            "budget": {"eps": b_eps, "delta": b_delta},
                            "spent": {"eps": spend.eps, "delta": spend.delta},
                            "released": spend.releases, "reserved": spend.reserved,
                            "releases": [{"job_id": j, "round": r, "status": st, "eps": e,
                                          "delta": dl, "event": json.loads(ev) if ev else None,
                                          "note": n, "updated": u}
                                         for j, r, st, e, dl, ev, n, u in rel.fetchall()]})
        return out

    # ------------------------------------------------------------------ writing
    def set_budget(self, identity: str, eps: float, delta: float, description: str = "",
                   allow_lower: bool = False) -> None:
        """Create or change a dataset's budget (``rknn-ray budget set``; lowering needs allow_lower)."""
        if not eps > 0 or not 0 <= delta < 1:
            raise ConfigError("budget", f"eps={eps} must be > 0 and delta={delta} in [0, 1)",
                              "pass a positive eps and a delta in [0, 1)")
        with self._transaction() as con:
            row = con.execute("SELECT budget_eps FROM datasets WHERE identity = ?",
                              (identity,)).fetchone()
            if row is None:
                con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?)",
                            (identity, description or identity, eps, delta, time.time()))
            else:
                if eps < row[0] and not allow_lower:
                    raise PrivacyBudgetError(f"the budget of {identity} is eps={row[0]}; lowering "
                                             "it needs --allow-lower")
                con.execute("UPDATE datasets SET budget_eps = ?, budget_delta = ? WHERE identity = ?",
                            (eps, delta, identity))

    def _events(self, con, identity: str) -> list:
        """Every counted row as an event: a release's own event, a reservation's stated cost."""
        from rknn_ray.accounting.events import ApproxDpEvent, event_from_dict
        events = []
        for status, eps, delta, event in con.execute(
                "SELECT status, eps, delta, event FROM releases WHERE identity = ? AND "
                "status != 'unused'", (identity,)):
            parsed = json.loads(event) if event else None
            if status == "released" and parsed:
                try:
                    events.append(event_from_dict(parsed))
                    continue
                except (ValueError, TypeError):
                    pass                     # an event this version cannot rebuild: its cost
            if eps > 0 or delta > 0:
                events.append(ApproxDpEvent(float(eps), float(delta)))
        return events

    def composed(self, identity: str, accountant: str = "basic", extra=None,
                 target_delta: float | None = None, con=None) -> tuple[float, float]:
        """(eps, delta) of everything counted on ``identity`` (+ ``extra`` events), composed
        by the named accountant -- the same accountants a run uses."""
        from rknn_ray.accounting.accountants import get_accountant

        def q(c):
            events = self._events(c, identity) + list(extra or [])
            if target_delta is None:
                row = c.execute("SELECT budget_delta FROM datasets WHERE identity = ?",
                                (identity,)).fetchone()
                delta = float(row[0]) if row else 0.0
            else:
                delta = target_delta
            return get_accountant(accountant).compose(events, max(delta, 1e-12))
        if con is not None:
            return q(con)
        with self._connect() as c:
            return q(c)

    def reserve(self, identity: str, description: str, job_id: str, eps: float, delta: float,
                default_budget: tuple[float, float], accountant: str = "basic") -> tuple[float, float]:
        """Reserve a job's whole planned spend, or refuse it; returns the dataset's budget.

        The first job on a dataset sets its budget to ``default_budget``; later jobs find
        it. Refused (PrivacyBudgetError, nothing written) when spent + reserved + this job
        would exceed the budget.
        """
        with self._transaction() as con:
            row = con.execute("SELECT budget_eps, budget_delta FROM datasets WHERE identity = ?",
                              (identity,)).fetchone()
            if row is None:
                row = default_budget
                con.execute("INSERT INTO datasets VALUES (?, ?, ?, ?, ?)",
                            (identity, description, row[0], row[1], time.time()))
            b_eps, b_delta = float(row[0]), float(row[1])
            from rknn_ray.accounting.events import ApproxDpEvent
            spend = self.spent(identity, con)
            total_eps, total_delta = self.composed(identity, accountant, [ApproxDpEvent(eps, delta)],
                                                   b_delta, con)
            over_eps = total_eps > b_eps * (1 + SLACK)
            over_delta = total_delta > b_delta * (1 + SLACK) + 1e-300
            if over_eps or over_delta:
                raise PrivacyBudgetError(
                    f"refused before any work: {description} has a privacy budget of eps={b_eps:g}, "
                    f"delta={b_delta:g}; {spend.eps:.6g} / {spend.delta:.3g} is already spent or "
                    f"reserved ({spend.releases} releases, {spend.reserved} open reservations), and "
                    f"this job needs eps={eps:g}, delta={delta:g}: {accountant} composition gives "
                    f"eps={total_eps:.6g}, delta={total_delta:.3g}. Fix: lower privacy.eps, or raise "
                    f"the budget explicitly: rknn-ray budget set {identity} --eps <new total> "
                    f"(ledger: {self.path})")
            con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                        "note, created, updated) VALUES (?, ?, NULL, 'reserved', ?, ?, NULL, ?, ?, ?)",
                        (identity, job_id, eps, delta, "reserved before any client randomized",
                         time.time(), time.time()))
        return b_eps, b_delta

    def commit_round(self, identity: str, job_id: str, round_id: int, eps: float, delta: float,
                     event: dict | None, note: str = "released") -> None:
        """Move one round's spend from the job's reservation to a release with its event.

        ``note`` marks the release (a seeded simulation says NOT PRIVATE here).
        """
        with self._transaction() as con:
            res = con.execute("SELECT id, eps, delta FROM releases WHERE identity = ? AND job_id = ? "
                              "AND status = 'reserved'", (identity, job_id)).fetchone()
            if res is None:
                raise PrivacyBudgetError(f"job {job_id} holds no reservation on {identity}; a "
                                         "release must be reserved before clients randomize")
            rid, r_eps, r_delta = res
            con.execute("UPDATE releases SET eps = ?, delta = ?, updated = ? WHERE id = ?",
                        (max(0.0, r_eps - eps), max(0.0, r_delta - delta), time.time(), rid))
            con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                        "note, created, updated) VALUES (?, ?, ?, 'released', ?, ?, ?, ?, ?, ?)",
                        (identity, job_id, round_id, eps, delta, json.dumps(event, default=str),
                         note, time.time(), time.time()))

    def close_job(self, identity: str, job_id: str, note: str) -> None:
        """The job ended normally: what it reserved and did not release is given back."""
        with self._transaction() as con:
            con.execute("UPDATE releases SET status = 'unused', note = ?, updated = ? WHERE "
                        "identity = ? AND job_id = ? AND status = 'reserved'",
                        (note, time.time(), identity, job_id))

    def mark_failed(self, identity: str, job_id: str, note: str) -> None:
        """The job died where a release may have happened: its reservation stays counted."""
        with self._transaction() as con:
            con.execute("UPDATE releases SET note = ?, updated = ? WHERE identity = ? AND "
                        "job_id = ? AND status = 'reserved'", (note, time.time(), identity, job_id))


# ---------------------------------------------------------------------- open reservations
#: the note a reservation gets just before the job's clients may randomize (mark_started)
STARTED_NOTE = "clients may randomize"
_DRIVER = re.compile(r"driver pid (\d+) on (\S+?)[;)]")


def _driver_alive(note: str | None) -> bool | None:
    """Whether the job's driver process still runs: None when unknown (another host, no pid)."""
    m = _DRIVER.search(note or "")
    if not m or m.group(2) != socket.gethostname():
        return None
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def mark_started(store: "BudgetStore", identity: str, job_id: str) -> None:
    """Note on the job's reservation that its clients may randomize from now on (and which
    driver process holds it): before this, the job provably released nothing."""
    note = (f"{STARTED_NOTE} since {time.strftime('%Y-%m-%d %H:%M:%S')} (driver pid "
            f"{os.getpid()} on {socket.gethostname()}); a release may happen")
    with store._transaction() as con:
        con.execute("UPDATE releases SET note = ?, updated = ? WHERE identity = ? AND job_id = ? "
                    "AND status = 'reserved'", (note, time.time(), identity, job_id))


def open_reservations(store: "BudgetStore", now: float | None = None) -> list[dict]:
    """Every reservation still open (a running job, or one killed without closing it), with
    its age, whether its clients may have randomized, and whether its driver still runs."""
    now = time.time() if now is None else now
    with store._connect() as con:
        rows = con.execute(
            "SELECT r.job_id, r.identity, d.description, r.eps, r.delta, r.note, r.created, "
            "(SELECT COUNT(*) FROM releases x WHERE x.job_id = r.job_id AND x.status = 'released') "
            "FROM releases r JOIN datasets d ON d.identity = r.identity "
            "WHERE r.status = 'reserved' ORDER BY r.created").fetchall()
    return [{"job_id": j, "identity": i, "description": desc, "eps": e, "delta": dl,
             "note": n, "created": c, "age_s": max(0.0, now - c),
             "started": bool(released) or STARTED_NOTE in (n or ""),
             "driver_alive": _driver_alive(n)}
            for j, i, desc, e, dl, n, c, released in rows]


def settle(store: "BudgetStore", job_id: str) -> list[dict]:
    """Close a dead job's open reservation: counted as spent (status ``released``, no round),
    or returned (``unused``) only when the job provably released nothing (it died before any
    client could randomize). Refuses while the job's driver still runs on this host."""
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
            if r["started"]:
                status = "released"
                note = ("settled by hand: the job ended without closing its reservation after its "
                        "clients could randomize, so a release may have happened; counted as spent")
            else:
                status = "unused"
                note = ("settled by hand: the job ended before any client randomized; nothing "
                        "was released, the reservation is returned")
            con.execute("UPDATE releases SET status = ?, note = ?, updated = ? WHERE identity = ? "
                        "AND job_id = ? AND status = 'reserved'",
                        (status, note, time.time(), r["identity"], job_id))
            done.append({**r, "status": status, "note": note})
    return done

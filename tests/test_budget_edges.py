"""Edge probes (issue 34, items 1-5): a budget no interrupted round hands back, no published
number derived from the private records, keyed fingerprints, near-duplicate sources.

Items 1 and 2 interrupt real rounds: a real SIGTERM to a real ``python -m jobs.distill``
after the server has opened reports, and a Server actor killed by SIGKILL mid-round.
"""
import functools
import json
import re
import signal

import numpy as np
import pytest

from jobs.budget import main as budget_main
from rknn_ray.accounting.budget_store import BudgetStore, open_reservations
from tests.test_edge_probes import Job, _address, _args, _error_lines


def _settled_as_spent(ledger, capsys, eps: float) -> None:
    """The job settled its own reservation as spent (issue 55): nothing is left open for
    `rknn-ray budget settle`, which is for a driver killed from outside."""
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "released" and "counted as spent" in row["note"], row
    assert "settled by the job" in row["note"] and dataset["reserved"] == 0
    assert dataset["spent"]["eps"] == pytest.approx(eps)
    assert open_reservations(BudgetStore(str(ledger))) == []
    capsys.readouterr()
    assert budget_main(["settle", row["job_id"], "--ledger", str(ledger)]) == 2
    assert "has no open reservation" in capsys.readouterr().err


# ---------------------------------------------------------------------- 1. started is a state

def test_sigterm_after_the_server_opened_reports_is_settled_as_spent(ray_session, tmp_path,
                                                                     capsys):
    """digits_local, one client per batch: the signal comes once the server has opened
    reports (its progress line), while the round runs. The interrupted job settles its
    reservation itself, as spent (its reports reached the server)."""
    out, ledger = tmp_path / "term", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_local.yaml", out, "cluster.batch_clients=1"), ledger,
              _address(ray_session))
    code, text = job.signal_after("reports opened:", 0.0, signal.SIGTERM)
    assert code == 143, text
    (line,) = _error_lines(text)
    assert "interrupted by SIGTERM during private round 1" in line, text
    assert "its eps is counted in the ledger" in line and "nothing was released" not in line
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is False and "stays counted" in marker["next_step"]
    _settled_as_spent(ledger, capsys, 4.0)


# ---------------------------------------------------------------------- 2. a dead server

def test_a_server_killed_mid_round_spends_the_whole_reservation(
        ray_session, tmp_path, monkeypatch, capsys, isolated_privacy_ledger):
    """kill -9 of the Server after it opened 11 reports (local model): no counts came out,
    but each opened report is a local-DP release to the server: nothing is returned, and the
    job counts the reservation as spent itself (none left open for settle)."""
    import jobs.distill as distill
    from jobs.distill import main
    from rknn_ray.job.session import Parties
    from tests.faulty_parties import ServerKilledWhileOpening, configured
    server = configured(ServerKilledWhileOpening, after=11)
    monkeypatch.setattr(distill, "run", functools.partial(distill.run, parties=Parties(server=server)))
    out = tmp_path / "killed"
    code = main(_args("digits_local.yaml", out, "cluster.batch_clients=1"))
    err = capsys.readouterr().err
    assert code == 2 and "the server died" in err and "Traceback" not in err, err
    assert "nothing was released" not in err and "eps is counted in the ledger" in err, err
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = dataset["releases"]
    assert "returned" not in row["note"], row
    _settled_as_spent(isolated_privacy_ledger, capsys, 4.0)


# ---------------------------------------------------------------------- 3. no count of the pool

DIGITS = "jobs/configs/digits_central.yaml"


def _with(data, **parts):
    """``data`` with some of its split's parts replaced (copies: a Splits is read-only)."""
    import dataclasses
    return dataclasses.replace(data, splits=dataclasses.replace(data.splits, **parts))


def _published(ledger, cfg, data, capsys) -> dict:
    """Everything a job publishes about its budget source, through the job's own functions:
    the description (report.json privacy.budget.description, report.html, the console), the
    budget it reserves against, and `rknn-ray budget` (text and --json), with the source's
    random name, job id and times left out."""
    from rknn_ray.accounting.budget_store import job_default_budget
    from rknn_ray.accounting.source_identity import job_source
    store = BudgetStore(str(ledger))
    identity, described, _ = job_source(store, cfg, data)
    n = len(data.splits.private_y)
    budget = store.reserve(identity, described, "job", cfg.privacy.eps, cfg.privacy.delta,
                           job_default_budget(cfg.privacy, n), records=n)
    capsys.readouterr()
    assert budget_main(["--ledger", str(ledger), "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)
    assert budget_main(["--ledger", str(ledger)]) == 0
    text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d", "WHEN", capsys.readouterr().out
                  .replace(identity, "ID").replace(str(ledger), "LEDGER"))
    for r in listed["releases"]:
        r.pop("updated")
    listed.pop("identity")
    return {"description": described, "budget": budget, "spent": store.spent(identity).eps,
            "listed": listed, "text": "\n".join(line for line in text.splitlines()
                                                if "age " not in line)}


def test_replacing_a_private_record_by_a_public_one_changes_no_published_field(tmp_path, capsys):
    """Neighbouring datasets (private record 0 replaced by a copy of public record 0) must
    publish the same budget fields: the old description counted the pool's distinct records
    (1797 against 1796)."""
    from rknn_ray.config import load_config
    from rknn_ray.data.prepared import prepare_data
    cfg = load_config(DIGITS, [])
    data = prepare_data(cfg)
    private_x = data.splits.private_x.copy()
    private_x[0] = data.splits.public_x[0]
    neighbour = _with(data, private_x=private_x)
    one = _published(tmp_path / "a.sqlite", cfg, data, capsys)
    other = _published(tmp_path / "b.sqlite", cfg, neighbour, capsys)
    assert one == other
    assert one["description"] == "digits: record pool"
    assert "1797" not in json.dumps(one) and "1796" not in json.dumps(other)


# ---------------------------------------------------------------------- 4. keyed fingerprints

#: the sources table as schema version 2 wrote it (bare fingerprints; verbatim)
V2_SOURCES = """CREATE TABLE IF NOT EXISTS sources (
    identity TEXT PRIMARY KEY, dataset TEXT NOT NULL, records INTEGER NOT NULL,
    min_private INTEGER, fingerprints BLOB NOT NULL)"""


#: the releases table as schema version 2 wrote it (no started / driver columns; verbatim)
V2_RELEASES = """CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT, identity TEXT NOT NULL REFERENCES datasets(identity),
    job_id TEXT NOT NULL, round INTEGER, status TEXT NOT NULL CHECK (status IN
        ('reserved', 'released', 'unused')),
    eps REAL NOT NULL, delta REAL NOT NULL, event TEXT, note TEXT,
    created REAL NOT NULL, updated REAL NOT NULL, accounting TEXT, meta TEXT)"""


def _v2_ledger(path, identity: str, fingerprints) -> None:
    """A ledger as schema version 2 left it: one source of bare fingerprints, one release."""
    import sqlite3
    import time
    from rknn_ray.accounting.budget_store import TABLES
    con = sqlite3.connect(str(path), isolation_level=None)
    for stmt in TABLES:
        con.execute(V2_SOURCES if "TABLE IF NOT EXISTS sources" in stmt else
                    V2_RELEASES if "TABLE IF NOT EXISTS releases" in stmt else stmt)
    con.execute("PRAGMA user_version = 2")
    now = time.time()
    con.execute("INSERT INTO datasets VALUES (?, ?, 3.0, 1e-5, ?)",
                (identity, f"digits: record pool of {len(fingerprints)} records", now))
    con.execute("INSERT INTO sources VALUES (?, 'digits', ?, 1079, ?)",
                (identity, len(fingerprints), fingerprints.tobytes()))
    con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, note, "
                "created, updated) VALUES (?, 'old-job', NULL, 'released', 1.0, 0, NULL, "
                "'settled by hand', ?, ?)", (identity, now, now))
    con.close()


def _stored(path) -> bytes:
    import sqlite3
    con = sqlite3.connect(str(path))
    try:
        return b"".join(b for (b,) in con.execute("SELECT fingerprints FROM sources"))
    finally:
        con.close()


def test_an_old_ledger_is_keyed_in_place_and_still_finds_its_source(tmp_path):
    """A v2 ledger held every record's bare BLAKE2b-64: anyone reading the file could test a
    candidate record. After the migration the file holds only keyed fingerprints (no bare
    one of any record), the same records still meet their source, and two ledgers key the
    same records differently."""
    from rknn_ray.accounting.source_identity import job_source, pool_fingerprints, \
        record_fingerprints
    from rknn_ray.config import load_config
    from rknn_ray.data.prepared import prepare_data
    cfg = load_config(DIGITS, [])
    data = prepare_data(cfg)
    bare = pool_fingerprints(data.splits)
    old = tmp_path / "old.sqlite"
    _v2_ledger(old, "pool-old", bare)
    store = BudgetStore(str(old))                       # migrates
    blob = np.frombuffer(_stored(old), dtype="<u8")
    assert len(blob) == len(bare) and not np.isin(bare, blob).any()
    candidate = record_fingerprints(data.splits.private_x[:1])   # a membership test, file alone
    assert not np.isin(candidate, blob).any()
    assert np.isin(store.keyed_fingerprints(candidate), blob).all()   # with the key: it works
    identity, described, _ = job_source(store, cfg, data)
    assert identity == "pool-old" and described == "digits: record pool"
    (row,) = store.datasets()
    assert row["description"] == "digits: record pool" and row["spent"]["eps"] == 1.0
    fresh = BudgetStore(str(tmp_path / "new.sqlite"))
    job_source(fresh, cfg, data)
    assert not np.isin(np.frombuffer(_stored(tmp_path / "new.sqlite"), dtype="<u8"), blob).any()


# ---------------------------------------------------------------------- 5. near-duplicates

def _everywhere(data, change):
    """``data`` with ``change`` applied to every record of every part."""
    sp = data.splits
    return _with(data, **{k: change(np.asarray(getattr(sp, k), dtype=np.float32).copy())
                          for k in ("private_x", "public_x", "eval_x")})


def _zero_pixel_plus(x):
    flat = x.reshape(len(x), -1)
    flat[:, 0] += 1 / 16                 # digits' pixel 0 is 0 in every record
    return x


TRANSFORMS = {
    "zero pixel +1/16": _zero_pixel_plus,
    "x255/256": lambda x: x * np.float32(255 / 256),
    "one float32 ulp": lambda x: np.nextafter(x, np.float32(np.inf)),
}


@pytest.mark.parametrize("transform", sorted(TRANSFORMS))
def test_a_copy_changed_on_every_record_still_meets_its_source(tmp_path, transform):
    from rknn_ray.accounting.source_identity import job_source
    from rknn_ray.config import load_config
    from rknn_ray.data.prepared import prepare_data
    cfg = load_config(DIGITS, [])
    data = prepare_data(cfg)
    assert not np.asarray(data.splits.private_x).reshape(len(data.splits.private_x), -1)[:, 0].any()
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    identity, _, _ = job_source(store, cfg, data)
    changed = _everywhere(data, TRANSFORMS[transform])
    assert not np.array_equal(changed.splits.private_x, data.splits.private_x)
    assert job_source(store, cfg, changed)[0] == identity
    with store._connect() as con:       # one source: nothing was split off
        assert con.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 1


def test_a_shifted_copy_is_not_recognized_and_unrelated_records_stay_apart(tmp_path):
    """The limits the docs state: a 1-pixel shift is another pool; records of another data
    set with the same shape do not merge into it."""
    from rknn_ray.accounting.source_identity import job_source
    from rknn_ray.config import load_config
    from rknn_ray.data.prepared import prepare_data
    cfg = load_config(DIGITS, [])
    data = prepare_data(cfg)
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    identity, _, _ = job_source(store, cfg, data)
    shifted = _everywhere(data, lambda x: np.roll(x.reshape(len(x), 8, 8), 1, axis=2).reshape(x.shape))
    rng = np.random.default_rng(0)
    unrelated = _everywhere(data, lambda x: rng.integers(0, 17, x.shape).astype(np.float32))
    assert job_source(store, cfg, shifted)[0] != identity
    assert job_source(store, cfg, unrelated)[0] != identity


# ---------------------------------------------------------------------- 1. (the state, migrated)

def test_an_old_ledger_s_overwritten_note_still_counts_as_started(tmp_path):
    """A v2 ledger knew 'started' only from the note, which the failure path overwrote: on
    opening, every open reservation whose note is no longer the reservation's own counts as
    started (and is settled as spent); an untouched one is still returned."""
    from rknn_ray.accounting.budget_store import settle
    _v2_ledger(tmp_path / "old.sqlite", "pool-old", np.arange(10, dtype="<u8"))
    import sqlite3
    con = sqlite3.connect(str(tmp_path / "old.sqlite"), isolation_level=None)
    for job, note in (("failed", "job failed (JobInterrupted: SIGTERM); reservation kept: a "
                                 "release may have happened"),
                      ("early", "reserved before any client randomized")):
        con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                    "note, created, updated) VALUES ('pool-old', ?, NULL, 'reserved', 1.0, 0, "
                    "NULL, ?, 0, 0)", (job, note))
    con.close()
    store = BudgetStore(str(tmp_path / "old.sqlite"))
    assert {r["job_id"]: r["started"] for r in open_reservations(store)} == {"failed": True,
                                                                             "early": False}
    assert [r["status"] for r in settle(store, "failed")] == ["released"]
    assert [r["status"] for r in settle(store, "early")] == ["unused"]


def test_a_reservation_settled_before_its_job_started_stops_the_job(tmp_path):
    """settle may return a reservation whose driver it cannot see (another host, or before
    the job recorded its driver): the job must then refuse to let any client randomize."""
    from rknn_ray.accounting.budget_store import mark_driver, mark_started, settle
    from rknn_ray.errors import PrivacyBudgetError
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("d", "data", "mine", 1.0, 0.0, (10.0, 0.0))
    mark_driver(store, "d", "mine")                # a job (this process) still preparing
    with pytest.raises(PrivacyBudgetError, match="still running"):
        settle(store, "mine")
    store.reserve("d", "data", "job", 1.0, 0.0, (10.0, 0.0))
    assert [r["status"] for r in settle(store, "job")] == ["unused"]
    with pytest.raises(PrivacyBudgetError, match="no open reservation.*no client may randomize"):
        mark_started(store, "d", "job")

"""A budget belongs to the private records (issue 18): any job touching a source's records
draws from its one budget, whatever seed, partition, clients, alpha or subset; old ledgers
migrate onto the record-pool identity."""
import json
import os
import sqlite3
import time

import numpy as np
import pytest

from rknn_ray.accounting.budget_store import BudgetStore, job_default_budget
from rknn_ray.accounting.source_identity import job_source, private_data_digest
from rknn_ray.config import load_config
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.data.prepared import prepare_data
from tests.data_files import write_idx_images, write_idx_labels

DIGITS = "jobs/configs/digits_central.yaml"
FIRST = ["privacy.budget_eps=1.5", "queries.s=10"]


def _charge(store, cfg, job_id):
    """What jobs.distill does before Ray starts: find the source, reserve the job's eps."""
    data = prepare_data(cfg)
    identity, described, release_key = job_source(store, cfg, data)
    n = len(data.splits.private_y)
    store.reserve(identity, described, job_id, cfg.privacy.eps, cfg.privacy.delta,
                  job_default_budget(cfg.privacy, n), records=n)
    return identity, release_key


def _fmnist_files(folder, n_train, n_test):
    """The first n_train / n_test records of one fixed set of IDX files (a subset for smaller n)."""
    rng = np.random.default_rng(7)
    x_tr, y_tr = rng.integers(0, 256, (400, 28, 28)), rng.integers(0, 10, 400)
    x_te, y_te = rng.integers(0, 256, (200, 28, 28)), rng.integers(0, 10, 200)
    os.makedirs(folder, exist_ok=True)
    write_idx_images(os.path.join(folder, "train-images-idx3-ubyte.gz"), x_tr[:n_train])
    write_idx_labels(os.path.join(folder, "train-labels-idx1-ubyte.gz"), y_tr[:n_train])
    write_idx_images(os.path.join(folder, "t10k-images-idx3-ubyte.gz"), x_te[:n_test])
    write_idx_labels(os.path.join(folder, "t10k-labels-idx1-ubyte.gz"), y_te[:n_test])
    return str(folder)


VARIANTS = {
    "seed": ["run.seed=5"],
    "partition": ["data.partition=dirichlet", "data.max_records_per_client=200"],
    "clients": ["data.clients=99"],
    "alpha": ["data.partition=dirichlet", "data.alpha=3.0", "data.max_records_per_client=200"],
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_the_same_records_otherwise_split_draw_from_one_budget(tmp_path, variant):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    base = (["data.partition=dirichlet", "data.alpha=0.5", "data.max_records_per_client=200"]
            if variant == "alpha" else [])
    first = load_config(DIGITS, FIRST + base)
    second = load_config(DIGITS, FIRST + VARIANTS[variant])
    ident_1, key_1 = _charge(store, first, "job-1")
    with pytest.raises(PrivacyBudgetError, match="The limit is eps") as refused:
        _charge(store, second, "job-2")                 # eps 1 + 1 > the first job's 1.5
    assert ident_1 in str(refused.value) and "budget of eps=1.5" in str(refused.value)
    # the old identity (the private part as split) differed: a fresh budget before this fix
    data = prepare_data(second)
    assert private_data_digest(second, data.splits.private_x, data.splits.private_y,
                               data.client_ids)[0] != key_1
    (row,) = store.datasets()
    assert row["identity"] == ident_1 and row["spent"]["eps"] == pytest.approx(1.0)
    assert [r["job_id"] for r in row["releases"]] == ["job-1"]


def test_a_job_on_a_subset_of_the_records_is_charged_to_the_source(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    over = ["data.dataset=fashion_mnist", "queries.s=10", "data.clients=20", "represent.dim=8",
            "privacy.budget_eps=1.5"]
    full = load_config(DIGITS, over + [f"data.data_root={_fmnist_files(tmp_path / 'full', 400, 200)}"])
    part = load_config(DIGITS, over + [f"data.data_root={_fmnist_files(tmp_path / 'part', 150, 60)}"])
    ident, _ = _charge(store, part, "job-subset")       # the subset first: it creates the source
    with pytest.raises(PrivacyBudgetError, match="The limit is eps"):
        _charge(store, full, "job-full")                # the full files touch the same records
    (row,) = store.datasets()
    assert row["identity"] == ident and "records" not in row     # no count of the pool is shown
    store.set_budget(ident, 2.0, row["budget"]["delta"])
    assert _charge(store, full, "job-full")[0] == ident           # now it fits: same budget


def test_two_sources_a_job_touches_merge_onto_one_budget(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 2**63, 50, dtype=np.uint64), rng.integers(0, 2**63, 50, dtype=np.uint64)
    ia, _ = store.source_identity("x", a)
    store.reserve(ia, "a", "job-a", 1.0, 0.0, (3.0, 0.0), records=40)
    ib, _ = store.source_identity("x", b)
    store.reserve(ib, "b", "job-b", 1.0, 0.0, (2.0, 0.0), records=40)
    assert ia != ib
    both, _ = store.source_identity("x", np.concatenate([a[:5], b[:5]]))
    assert both == ia                                   # the older source survives
    (row,) = store.datasets()
    assert row["budget"]["eps"] == 2.0 and row["spent"]["eps"] == pytest.approx(2.0)
    assert [m["identity"] for m in row["merged"]] == [ib]
    assert store.canonical(ib)[0] == ia


# ------------------------------------------------------------------ migration of old ledgers

#: The schema the ledger had before the record-pool identity (verbatim from budget_store.py).
OLD_SCHEMA = """
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


def _old_job(con, identity, description, budget, job_id, eps):
    """One finished job as the old code wrote it: dataset row, reservation, release, close."""
    now = time.time()
    con.execute("INSERT OR IGNORE INTO datasets VALUES (?, ?, ?, ?, ?)", (identity, description,
                                                                       *budget, now))
    con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, note, "
                "created, updated) VALUES (?, ?, NULL, 'unused', 0, 0, NULL, 'job finished', ?, ?)",
                (identity, job_id, now, now))
    event = {"type": "DiscreteLaplaceDpEvent", "noise_parameter": eps / 2, "sensitivity": 2}
    con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, note, "
                "created, updated) VALUES (?, ?, 0, 'released', ?, 0, ?, 'released', ?, ?)",
                (identity, job_id, eps, json.dumps(event), now, now))


def test_an_old_ledger_migrates_its_spend_onto_the_record_pool(tmp_path, capsys):
    path = str(tmp_path / "old.sqlite")
    seed0 = load_config(DIGITS, FIRST)
    seed1 = load_config(DIGITS, FIRST + ["run.seed=1"])
    d0, d1 = prepare_data(seed0), prepare_data(seed1)
    old0, desc0 = private_data_digest(seed0, d0.splits.private_x, d0.splits.private_y, d0.client_ids)
    old1, desc1 = private_data_digest(seed1, d1.splits.private_x, d1.splits.private_y, d1.client_ids)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.executescript(OLD_SCHEMA)
    _old_job(con, old0, desc0, (20.0, 0.0), "old-a", 1.0)           # two old identities of
    _old_job(con, old1, desc1, (20.0, 0.0), "old-b", 1.0)           # the same digits records
    _old_job(con, "f" * 32, "fashion_mnist (split paper, seed 0, iid partition, 60000 private "
             "records)", (5.0, 0.0), "old-f", 1.0)                  # another dataset
    con.close()

    store = BudgetStore(path)                                       # the new code opens it
    assert {r["kind"] for r in store.datasets()} == {"legacy"}
    ident, _ = _charge(store, load_config(DIGITS, FIRST + ["run.seed=7"]), "new-job")
    rows = {r["identity"]: r for r in store.datasets()}
    assert set(rows) == {ident, "f" * 32}                           # fashion_mnist stays apart
    src = rows[ident]
    assert src["kind"] == "source" and src["budget"]["eps"] == 20.0
    assert src["spent"]["eps"] == pytest.approx(3.0)                # 1 + 1 old + 1 reserved now
    assert sorted(m["identity"] for m in src["merged"]) == sorted([old0, old1])
    assert {r["job_id"] for r in src["releases"]} == {"old-a", "old-b", "new-job"}
    assert rows["f" * 32]["kind"] == "legacy" and rows["f" * 32]["spent"]["eps"] == 1.0
    from jobs.budget import main
    assert main(["list", "--ledger", path]) == 0
    out = capsys.readouterr().out
    assert f"merged from {old0}: migrated" in out
    assert main(["set", old1, "--eps", "25", "--ledger", path]) == 0    # an old id still works
    assert f"{old1} was merged into {ident}" in capsys.readouterr().out
    assert store.budget(ident) == (25.0, 0.0)


def test_published_names_are_no_function_of_the_records(tmp_path):
    """report.json publishes the source's name and release.npz the release's: a digest of the
    records there would let a reader who knows every record but one test guesses for it. The
    same records under two ledgers get unrelated names, and a ledger keeps its own."""
    cfg = load_config(DIGITS, FIRST)
    data = prepare_data(cfg)
    a, b = BudgetStore(str(tmp_path / "a.sqlite")), BudgetStore(str(tmp_path / "b.sqlite"))
    ident_a, _, release_a = job_source(a, cfg, data)
    ident_b, _, release_b = job_source(b, cfg, data)
    assert ident_a != ident_b and release_a != release_b
    bare = private_data_digest(cfg, data.splits.private_x, data.splits.private_y,
                               data.client_ids)[0]
    assert bare not in (release_a, release_b) and bare not in release_a
    again = job_source(BudgetStore(str(tmp_path / "a.sqlite")), cfg, data)   # reopened
    assert again[0] == ident_a and again[2] == release_a

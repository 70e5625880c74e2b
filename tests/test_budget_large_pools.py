"""A source's record pool beyond what one SQLite row takes (issue 46: 1e8 records' two
fingerprint kinds are 1.6 GB, and SQLite refuses a row above 1e9 bytes): the pool past CHUNK
fingerprints goes to source_chunks rows and is matched, merged and replaced as a whole; a
schema-3 ledger opens as schema 4 with its sources intact; an SQLite error that is no damage
(a value too big, a full disk) is not reported as a broken ledger."""
import sqlite3

import numpy as np
import pytest

from rknn_ray.accounting import budget_store
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.ledger_file import LedgerFile
from rknn_ray.errors import LedgerError


def _keys(seed: int, n: int) -> np.ndarray:
    return np.unique(np.random.default_rng(seed).integers(0, 2 ** 63, n).astype(np.uint64))


def _chunks(path: str) -> dict:
    with sqlite3.connect(path) as con:
        return dict(con.execute("SELECT identity || '/' || kind, COUNT(*) FROM source_chunks "
                                "GROUP BY identity, kind").fetchall())


def test_a_pool_beyond_one_row_is_stored_in_chunks_and_matched_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(budget_store, "CHUNK", 4)
    path = str(tmp_path / "ledger.sqlite")
    store = BudgetStore(path)
    empty = np.zeros(0, np.uint64)
    big, near = _keys(1, 23), _keys(2, 9)
    first, _ = store.source_identity("t", empty, keyed=big, keyed_near=near)
    assert _chunks(path) == {f"{first}/exact": 5, f"{first}/near": 2}   # 4 + 5 x 4 (last 3)
    # a job whose only shared record is in the last chunk of either kind: the same source
    for kind in ("exact", "near"):
        mine = _keys(10 + len(kind), 6)
        shared = (big if kind == "exact" else near)[-1:]
        got, _ = store.source_identity("t", empty, keyed=np.union1d(mine, shared)
                                       if kind == "exact" else mine,
                                       keyed_near=np.union1d(_keys(7, 3), shared)
                                       if kind == "near" else _keys(8, 3))
        assert got == first
    other, _ = store.source_identity("t", empty, keyed=_keys(30, 5), keyed_near=_keys(31, 2))
    assert other != first
    # a job touching both merges them (onto the older; here neither has a budget row yet, so
    # the order is by name); the merged-away source leaves no chunk behind
    both, _ = store.source_identity("t", empty, keyed=np.union1d(big[:1], _keys(30, 5)[:1]))
    assert both in (first, other)
    gone = other if both == first else first
    assert not any(key.startswith(gone + "/") for key in _chunks(path))
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT COUNT(*) FROM sources").fetchone()[0] == 1
        (blob,) = con.execute("SELECT fingerprints FROM sources WHERE identity = ?",
                              (both,)).fetchone()
        pool = budget_store._pool(con, both, "exact", blob)
    assert np.all(pool[1:] > pool[:-1]) and set(big.tolist()) <= set(pool.tolist())
    assert set(_keys(30, 5).tolist()) <= set(pool.tolist())


def test_a_schema_3_ledger_opens_as_schema_4(tmp_path):
    path = str(tmp_path / "ledger.sqlite")
    store = BudgetStore(path)
    ident, _ = store.source_identity("t", np.zeros(0, np.uint64), keyed=_keys(1, 50))
    with sqlite3.connect(path) as con:
        con.execute("DROP TABLE source_chunks")
        con.execute("PRAGMA user_version = 3")
    again = BudgetStore(path)
    assert again.source_identity("t", np.zeros(0, np.uint64), keyed=_keys(1, 50)[:3])[0] == ident
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA user_version").fetchone()[0] == 4


@pytest.mark.parametrize("text", ["string or blob too big", "database or disk is full"])
def test_limits_and_a_full_disk_are_not_called_damage(tmp_path, text):
    ledger = LedgerFile(str(tmp_path / "l.sqlite"), (), {}, 4)
    err = ledger.error(sqlite3.OperationalError(text))
    assert isinstance(err, LedgerError)
    assert "not a valid" not in str(err) and "unchanged" in str(err) and "Fix:" in str(err)

"""The number of holders is declared (data.private.holders), never published from the data.

Under replace-one a record's holder id is part of the record, so the number of distinct
holders in a private table can move by one between neighbouring data sets: calibration and
every published count use the declared number (issue 35, item 3). Each job here runs on a
table whose actual holder count differs from the declared one, through the job's own
command line, and searches what it published (report.json, release.npz's metadata, the
console, the ledger) for the actual count.
"""
import json
import re

import numpy as np
import pytest
import yaml

from rknn_ray.accounting.budget_store import BudgetStore
from tests.table_files import digits_parts, table_config, write_parts

HOLDERS = 173           # digits_parts draws each record's holder from this many


def _values(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _values(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _values(v)
    else:
        yield obj


def _shows(obj, count: int) -> list:
    """Where ``obj`` (JSON-like) holds ``count``: as an integer, or a word in a string."""
    word = re.compile(rf"(?<![\d.]){count}(?![\d.])")
    return [v for v in _values(obj) if (isinstance(v, int) and not isinstance(v, bool)
                                        and v == count) or (isinstance(v, str) and word.search(v))]


def _run(tmp_path, capsys, declared: int, privacy: dict, **more):
    from jobs.distill import main
    priv, _, _ = write_parts(str(tmp_path), parts=digits_parts(holders=HOLDERS))
    actual = len(set(priv.column("holder").to_pylist()))
    assert actual not in (declared, priv.num_rows)
    cfg = table_config(str(tmp_path), private={"holders": declared})
    cfg["privacy"] = privacy
    cfg["run"] = {"progress": True}
    cfg["student"]["epochs"] = 1        # what is published, not what the student learns
    cfg.update(more)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ledger = tmp_path / "ledger.sqlite"
    capsys.readouterr()
    rc = main(["--config", str(path), "--out", str(tmp_path / "run"), "--ledger", str(ledger)])
    out = capsys.readouterr()
    return rc, out.out + out.err, BudgetStore(str(ledger)).datasets(), actual


def _published(tmp_path) -> dict:
    from rknn_ray.job.release_file import RELEASE_FILE
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    meta = json.loads(str(np.load(tmp_path / "run" / RELEASE_FILE)["meta"]))
    ledger = json.loads((tmp_path / "run" / "ledger.json").read_text())
    return {"report": report, "release": meta, "ledger.json": ledger}


@pytest.mark.parametrize("privacy", [
    {"model": "central", "mechanism": "laplace", "eps": 2.0},
    {"model": "local", "mechanism": "rr", "eps": 4.0},
    # more holders than declared: the round is costed at the floor of the declared 120 (more
    # senders only add cover), so its guarantee does not show the actual count either
    {"model": "shuffle", "mechanism": "collision", "eps": 4.0, "delta": 1e-6,
     "budget_delta": 1e-4}], ids=["central", "local", "shuffle"])
def test_the_actual_holder_count_is_never_published(privacy, tmp_path, capsys):
    declared = 120 if privacy["model"] == "shuffle" else 300
    rc, console, sources, actual = _run(tmp_path, capsys, declared, privacy)
    assert rc == 0, console[-3000:]
    published = _published(tmp_path)
    assert published["report"]["counts"]["clients"] == declared
    assert "withheld" in published["report"]["counts"]
    for name, obj in {**published, "ledger": sources}.items():
        assert _shows(obj, actual) == [], (name, _shows(obj, actual))
    assert not re.search(rf"(?<![\d.]){actual}(?![\d.])", console), console
    assert f"in {declared} clients" in console
    if privacy["model"] == "shuffle":     # sound: the guarantee is the declared n's, at target
        (g,) = published["report"]["privacy"]["rounds"]
        assert g["n"] <= declared and g["eps"] <= privacy["eps"] * (1 + 1e-9)


def test_fewer_holders_than_declared_in_the_shuffle_model_is_refused_at_its_true_cost(
        tmp_path, capsys):
    """Calibrated for 400 holders, about 170 send: the shuffler's floor (the senders the
    calibration needs) is not met, so it releases nothing to the server. The clients have
    randomized, so the job's whole reservation stays counted (its true cost, at most); no
    labels, and the refusal does not name the actual count either."""
    privacy = {"model": "shuffle", "mechanism": "collision", "eps": 4.0, "delta": 1e-6,
               "budget_delta": 1e-4}
    rc, console, sources, actual = _run(tmp_path, capsys, 400, privacy)
    assert rc != 0 and not (tmp_path / "run" / "labels.parquet").exists(), console[-3000:]
    assert "refused by the shuffler: fewer distinct senders than the 400 holders" in console
    assert not re.search(rf"(?<![\d.]){actual}(?![\d.])", console), console
    (source,) = sources
    assert source["spent"]["eps"] == pytest.approx(privacy["eps"])      # counted, not returned
    (job,) = source["releases"]
    assert "refused by the shuffler" in job["note"] and _shows(source, actual) == []


def test_fewer_holders_than_declared_but_enough_for_the_floor_costs_the_public_floor(
        tmp_path, capsys):
    """Multi-message, declared 200 with an expected dropout of 0.2 (noise split over 160
    senders), about 170 send: released, with the guarantee of the 160 the calibration needs
    (the shuffler checked at least that many sent), never of the senders it saw."""
    privacy = {"model": "shuffle", "mechanism": "multi", "eps": 4.0, "delta": 1e-6,
               "budget_delta": 1e-4, "options": {"expected_dropout": 0.2}}
    # 20 queries: the messages (and the round's time) grow with s, the floor does not
    rc, console, sources, actual = _run(tmp_path, capsys, 200, privacy, queries={"s": 20})
    assert rc == 0, console[-3000:]
    published = _published(tmp_path)
    (g,) = published["report"]["privacy"]["rounds"]
    assert g["n"] == 160 and g["eps"] <= privacy["eps"] * (1 + 1e-9)
    for name, obj in {**published, "ledger": sources}.items():
        assert _shows(obj, actual) == [], (name, _shows(obj, actual))
    assert not re.search(rf"(?<![\d.]){actual}(?![\d.])", console), console

"""Issue 35 on real Ray: a table job end to end, data given in memory from Python, and the
driver-memory canary (the driver never materializes a private row).

Real files, real subprocesses, real shards; the memory scan reads /proc/PID/mem as
tests/test_secret_memory.py does (ptrace rights: root, or being the driver's ancestor).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rknn_ray
from rknn_ray.accounting.budget_store import BudgetStore
from tests.procmem import find_bytes
from tests.table_files import digits_parts, table_config, write_parts

ROOT = Path(__file__).resolve().parents[1]


def test_a_table_with_holders_and_string_ids_runs_end_to_end(tmp_path, monkeypatch):
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(ledger))
    priv, pub, ev = write_parts(str(tmp_path))
    result = rknn_ray.run(table_config(str(tmp_path)), out_dir=str(tmp_path / "run"))
    counts = result.report["counts"]
    assert counts["records"] == priv.num_rows and counts["public"] == pub.num_rows
    assert counts["clients"] == len(set(priv.column("holder").to_pylist()))   # found: public
    assert counts["holders"]["holders"] == counts["clients"]
    assert result.report["privacy"]["relation"].startswith("replace-one record")
    assert counts["max_records_per_client"] == 10 and counts["evaluation"] == ev.num_rows
    assert result.report["split"]["dataset"] == "table" and len(result.labels) == pub.num_rows
    assert result.report["student"]["test_accuracy"] > 0.7      # digits, eps 2, 60 queries
    # the budget is the records' source's: the ledger holds one source with this job
    (source,) = BudgetStore(str(ledger)).datasets()
    assert source["spent"]["eps"] == pytest.approx(2.0) and source["reserved"] == 0


def test_run_from_python_with_data_in_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(tmp_path / "ledger.sqlite"))
    priv, pub, ev = digits_parts(n_private=900, n_public=400)
    cfg = table_config(str(tmp_path))
    for part in ("private", "public", "evaluation"):
        cfg["data"][part].pop("path")
    cfg["data"]["private"].pop("client")            # one record per client
    cfg["data"]["max_records_per_client"] = None
    ev_arrays = {"pixels": ev.select([f"p{i}" for i in range(64)]).to_pandas().to_numpy(),
                 "label": ev.column("label").to_numpy()}
    cfg["data"]["evaluation"]["features"] = "pixels"
    private = priv.drop(["holder"]).to_pandas()
    result = rknn_ray.run(cfg, private=private, public=pub.to_pandas(), evaluation=ev_arrays,
                          out_dir=str(tmp_path / "run"), queries={"s": 50})
    counts = result.report["counts"]
    assert counts["records"] == counts["clients"] == 900 and counts["queries"] == 50
    assert counts["evaluation"] == ev.num_rows and result.report["student"]["test_accuracy"] > 0.6
    assert isinstance(private, pd.DataFrame) and len(private) == 900   # the caller's own, untouched


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc/PID/mem")
def test_the_driver_never_holds_a_private_row(tmp_path):
    rng = np.random.default_rng(7)
    secret = os.urandom(16).hex()
    canary = rng.random(16) * 0.5 + 0.25            # one private record's 16 features
    centres = np.eye(3, 16) * 2

    def rows(n, labels):
        return [(centres[c] + rng.normal(0, 0.3, 16)).tolist() for c in labels]
    labels = rng.integers(0, 3, 300)
    features = rows(300, labels)
    features[123] = canary.tolist()
    holders = [f"h{i % 90}" for i in range(300)]
    holders[123] = f"holder-{secret}"
    pq.write_table(pa.table({"pixels": features, "label": labels, "holder": holders}),
                   str(tmp_path / "private.parquet"))
    public_id = f"public-{os.urandom(16).hex()}"
    ids = [f"r{i}" for i in range(120)]
    ids[5] = public_id
    pq.write_table(pa.table({"pixels": rows(120, rng.integers(0, 3, 120)), "row_id": ids}),
                   str(tmp_path / "public.parquet"))
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": str(ROOT),
           "RKNN_RAY_LEDGER": str(tmp_path / "ledger.sqlite")}
    log = tmp_path / "driver.log"
    driver = subprocess.Popen([sys.executable, "-m", "tests.table_canary_driver", str(tmp_path)],
                              cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=log.open("w"), text=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the driver ended before its job finished:\n{log.read_text()[-3000:]}"
        info = json.loads(line)
        assert info["records"] == 300 and info["clients"] == 91 and info["labelled"] == 120
        needles = [canary.astype("<f8").tobytes(), canary.astype("<f4").tobytes(),
                   f"holder-{secret}".encode(), public_id.encode()]
        hits, scanned = find_bytes(driver.pid, *needles)
        assert scanned > 50 * 2**20                    # the whole driver was read
        # control: a public row the driver does read is found, so the scan sees rows
        assert hits[3], "the public canary was not found: the scan does not see the driver's rows"
        assert [len(h) for h in hits[:3]] == [0, 0, 0], "a private record in the driver's memory"
        driver.stdin.write("\n")
        driver.stdin.flush()
        assert driver.wait(timeout=120) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def test_rows_that_differ_from_the_scans_fail_in_the_shards_with_the_reservation_returned(
        tmp_path, monkeypatch):
    """The budget is charged for the rows read: each shard checks the keyed digest of the
    rows it was handed against the scan's (here the scan's digest for shard 0 is altered after
    the reservation, as if its rows had changed on the way), so the job stops before any
    client randomizes, the reservation returned, and nothing was charged for rows no job read.
    The private file itself may change after the scan: the shards never open it."""
    import dataclasses
    from rknn_ray.errors import DataError
    from rknn_ray.job import runner
    ledger = tmp_path / "ledger.sqlite"
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(ledger))
    priv, _, _ = write_parts(str(tmp_path))
    real = runner.complete_scan

    def scan_then_alter(*args):
        data = real(*args)              # scanned where the shards run; the file goes away
        os.remove(tmp_path / "private.parquet")
        make = data.shard_sources

        def altered(*a):
            sources = make(*a)
            n, digest = sources[0].expect
            bad = f"{(int(digest, 16) + 1) % 2 ** 64:016x}"
            return [dataclasses.replace(sources[0], expect=(n, bad))] + sources[1:]
        return dataclasses.replace(data, shard_sources=altered)
    monkeypatch.setattr(runner, "complete_scan", scan_then_alter)
    with pytest.raises(DataError, match="read other rows than the job's scan"):
        rknn_ray.run(table_config(str(tmp_path)), out_dir=str(tmp_path / "run"))
    (source,) = BudgetStore(str(ledger)).datasets()
    assert source["spent"]["eps"] == 0 and source["reserved"] == 0     # returned: nothing ran
    (job,) = source["releases"]
    assert "reservation returned" in job["note"], job
    assert not (tmp_path / "run" / "release.npz").exists()

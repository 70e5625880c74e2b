"""privacy.multi_record=each (issue 47): every record a holder keeps sends its own report.

Under the relation (one record's value replaced; holders and their record counts public) one
record changes one report, so each report is eps-LDP at record level and, in the shuffle
model, amplified over every report opened. The data layer deals each kept record to a
virtual client of its own; these tests check the dealing (built-in data and a user's table
through the real scan and shard reads), the refusals, and one real shuffle job.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rknn_ray.config import Config, load_config
from rknn_ray.data.prepared import prepare_data
from rknn_ray.data.sources import dataset_sources
from rknn_ray.errors import ConfigError
from tests.table_files import digits_parts, prepared_table, table_config, write_parts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_built_in_data_deals_every_kept_record_to_a_client_of_its_own():
    base = ["privacy.model=local", "privacy.mechanism=rr", "data.partition=iid",
            "data.clients=300", "data.max_records_per_client=4"]
    sample = prepare_data(load_config("jobs/configs/digits_central.yaml", base))
    each = prepare_data(load_config("jobs/configs/digits_central.yaml",
                                    base + ["privacy.multi_record=each"]))
    kept = sample.held_rows()
    assert each.num_clients == kept.size and each.max_records_per_client == 1
    assert np.array_equal(each.held_rows(), kept)               # the same records report
    ids = each.client_ids[kept]
    assert sorted(ids.tolist()) == list(range(kept.size))         # one client per record
    cfg = load_config("jobs/configs/digits_central.yaml", base + ["privacy.multi_record=each",
                                                                  "cluster.shards=3"])
    got = [src.open() for src in dataset_sources(cfg, each)]
    assert sum(r.num_clients for r in got) == kept.size
    assert all(r.max_records_per_client == 1 for r in got)


def test_a_table_deals_each_holders_kept_records_to_clients_of_their_own(tmp_path):
    priv, _, _ = write_parts(str(tmp_path), parts=digits_parts(holders=60))
    common = table_config(str(tmp_path), max_records_per_client=5)
    sample_cfg = Config.from_dict({**common, "privacy": {"model": "local", "mechanism": "rr",
                                                         "eps": 2.0}})
    each_cfg = sample_cfg.with_overrides(["privacy.multi_record=each"])
    sample, each = prepared_table(sample_cfg), prepared_table(each_cfg)
    holders, counts = np.unique(priv.column("holder").to_pylist(), return_counts=True)
    kept = int(np.minimum(counts, 5).sum())
    assert sample.num_clients == holders.size and each.num_clients == kept
    assert each.holders["holders"] == holders.size and each.max_records_per_client == 1
    # one secret per shard for both: the shard picks the kept records from it
    a = [s.open(order_key=bytes([s.shard] * 32)) for s in dataset_sources(sample_cfg, sample)]
    b = [s.open(order_key=bytes([s.shard] * 32)) for s in dataset_sources(each_cfg, each)]
    assert sum(r.num_clients for r in b) == kept and all(r.max_records_per_client == 1 for r in b)

    def records(rs):
        return sorted(map(tuple, np.concatenate([np.c_[r.features, r.labels] for r in rs])))
    assert records(a) == records(b)               # the same kept records, each a client now


@pytest.mark.parametrize("model,mechanism", [("central", "laplace"), ("shuffle", "multi")])
def test_each_is_refused_where_every_record_is_counted_already(model, mechanism):
    with pytest.raises(ConfigError, match="multi_record"):
        load_config("jobs/configs/digits_central.yaml", [
            f"privacy.model={model}", f"privacy.mechanism={mechanism}",
            "privacy.multi_record=each"] + (["privacy.delta=1e-6"] if model == "shuffle" else []))


def test_a_shuffle_job_with_each_opens_a_report_per_kept_record(tmp_path, ray_session):
    """The shipped table (342 records of 74 holders, at most 8 each): 342 reports opened, the
    amplification's n is 342, the report says what it means at holder level. The job joins the
    session's Ray (as under ``ray job submit``)."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.distill", "--config", "jobs/configs/table_shuffle.yaml",
         "--out", str(out), "--ledger", str(tmp_path / "ledger.sqlite"), "--quiet",
         "--set", "privacy.multi_record=each", "--set", "student.trainer=local",
         "--set", "student.epochs=1"], cwd=ROOT, capture_output=True, text=True, timeout=400,
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": ROOT,
             "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address})
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    counts, (g,) = report["counts"], report["privacy"]["rounds"]
    assert counts["messages"] == counts["clients"] == 342 and counts["holders"]["holders"] == 74
    assert g["n"] == 342 and g["eps"] <= 4.0 * (1 + 1e-9)
    assert "m*eps" in report["privacy"]["details"][0]["multi_record_accounting"]
    # the holder-level cost where the operator reads the budget (issue 57)
    listed = subprocess.run([sys.executable, "-m", "jobs.cli", "budget", "--ledger",
                             str(tmp_path / "ledger.sqlite")], cwd=ROOT, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PYTHONPATH": ROOT})
    assert f"(per record; a holder of m kept records at m x eps, at most 8 x {g['eps']:.4g}" \
        in listed.stdout, listed.stdout + listed.stderr


def test_the_console_states_the_holder_level_cost_and_suggests_each_from_public_counts(
        tmp_path):
    """Issue 57: under each the console said "1000 records in 1000 clients" and nothing of a
    holder's cost; under sample nothing suggested each. Both lines read public counts only."""
    from rknn_ray.job.runner import multi_record_lines
    write_parts(str(tmp_path), parts=digits_parts(holders=60))
    common = table_config(str(tmp_path), max_records_per_client=5)
    local = Config.from_dict({**common, "privacy": {"model": "local", "mechanism": "rr",
                                                    "eps": 2.0}})
    sample = prepared_table(local)
    kept = sample.holders["kept"]
    (line,) = multi_record_lines(local, sample)
    assert f"each of the 60 holders reports one of its records ({kept} kept)" in line
    assert f"privacy.multi_record=each would send {kept} reports" in line
    each_cfg = local.with_overrides(["privacy.multi_record=each"])
    (line,) = multi_record_lines(each_cfg, prepared_table(each_cfg))
    assert f"each of the {kept} kept records is a client of its own (60 holders)" in line
    assert "at most 5 x 2 = 10" in line
    central = Config.from_dict({**common, "privacy": {"model": "central",
                                                      "mechanism": "laplace"}})
    assert multi_record_lines(central, prepared_table(central)) == []

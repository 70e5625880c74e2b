"""jobs.experiments: one report-row schema every producer uses, one runner (cells as Ray
Tune trials; skip what is done, a failure is a row, outputs after every cell)."""
import argparse
import dataclasses
import json
import sys
import math
import os
import sqlite3

import pytest

from jobs.experiments import (ROW_FIELDS, ROW_SCHEMA, Job, Runner, cell_bundles, cell_row,
                              concurrency, markdown_table, report_row, rows_to_csv)
from rknn_ray.errors import ConfigError
from tests.run_folders import write_run

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jobs",
                      "configs", "digits_central.yaml")
FAST = ["run.progress=false", "student.num_workers=1", "student.trainer=local",
        "queries.restarts=1", "student.epochs=1", "privacy.budget_eps=100"]


def _same(a, b) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) \
        or a == b


def _report(tmp_path):
    """A run folder as jobs.distill leaves it (central/laplace on digits), with the config
    sections the grid reads, a two-round ledger and an adaptive selection."""
    folder = write_run(str(tmp_path / "run"), "central", "laplace", eps=1.0)
    path = os.path.join(folder, "report.json")
    with open(path) as fh:
        report = json.load(fh)
    report["config"]["rknn"] = {"k": 3}
    report["privacy"]["ledger"] = {"entries": [{"eps": 0.5}, {"eps": 0.5}]}
    report["privacy"]["details"] = [{"message_bytes": 40}]
    report["timings_s"]["select_1"] = 0.5
    report["selection"] = [{"round": 0}, {"round": 1, "uncertainty_chosen": 0.7,
                                          "uncertainty_all": 0.2,
                                          "interim_agreement_released": 0.9}]
    with open(path, "w") as fh:
        json.dump(report, fh)
    return folder, report


def test_report_row_reads_every_field_once(tmp_path):
    _, report = _report(tmp_path)
    row = report_row(report)
    assert (row.model, row.mechanism, row.dataset, row.unit) == ("central", "laplace", "digits",
                                                                 "record")
    assert (row.eps, row.delta, row.accuracy, row.label_accuracy) == (1.0, 0.0, 0.9331, 0.9164)
    assert (row.queries, row.k_used, row.clients, row.messages) == (10, 3, 1079, 1077)
    assert row.ledger_events == 2 and row.round_eps == (1.0,) and row.rounds == 1
    assert row.bytes_per_client == pytest.approx(1077 * 40 / 1079)
    # the stage total counts the stages, each round and each selection, not a round's parts
    assert row.stage_s == pytest.approx(0.1 + 1.5 + 4.2 + 2.3 + 0.0 + 31.0 + 0.5)
    assert tuple(row.to_dict()) == ROW_FIELDS
    empty = report_row(None).to_dict()
    assert math.isnan(empty["eps"]) and empty["unit"] == "" and tuple(empty) == ROW_FIELDS
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.eps = 2.0                                  # frozen: a row is what the report said


def test_every_producer_yields_the_schema_with_the_same_values(tmp_path):
    """compare, grid, adaptive rounds and `rknn-ray report` turn one report.json into rows
    holding every ReportRow field, with equal values."""
    from benchmarks import adaptive_rounds
    from jobs import compare, grid
    from jobs.report import load_run, run_row
    folder, report = _report(tmp_path)
    expected = report_row(report).to_dict()
    _, planned, _ = grid.plan(grid.GridSpec(CONFIG, tuple(FAST), k=[3], eps=[1.0]))
    (cell, cfg), = planned
    args = argparse.Namespace(config=CONFIG, overrides=FAST)
    rows = {
        "compare": cell_row(compare.rknn_job("digits", "central", 1.0, 1e-5), report, 1.0, folder),
        "grid": cell_row(grid.cell_job(cell, cfg), report, 1.0, folder),
        "adaptive": cell_row(adaptive_rounds.cell_job(
            {"seed": 0, "target_eps": 1.0, "T": 2, "selection": "uncertain"}, args),
            report, 1.0, folder),
        "report": run_row(load_run(folder)),
    }
    for who, row in rows.items():
        missing = set(ROW_FIELDS) - set(row)
        assert not missing, (who, missing)
        diff = {f: (row[f], expected[f]) for f in ROW_FIELDS if not _same(row[f], expected[f])}
        assert not diff, (who, diff)
    assert rows["grid"]["s_used"] == 10 and rows["grid"]["k_used"] == 3
    assert rows["adaptive"]["uncertainty_chosen"] == [0.7]
    assert rows["compare"]["method"] == "rknn_central" and rows["compare"]["target_eps"] == 1.0
    # grid.csv and compare.csv keep their columns
    assert rows_to_csv([rows["compare"]], compare.COLUMNS).splitlines()[0] == ",".join(compare.COLUMNS)


def test_write_tables_writes_what_it_is_given(tmp_path):
    """jobs.writers.write_tables: the JSON always, CSV / markdown / meta / extra / PNG only when
    given, the CSV with exactly the columns asked for."""
    from jobs.writers import write_tables
    rows = [{"method": "a", "eps": 1.0, "other": 3}]
    write_tables(str(tmp_path / "one"), "x", rows, json_name="results.json")
    assert sorted(os.listdir(tmp_path / "one")) == ["results.json"]
    drawn = []
    write_tables(str(tmp_path / "all"), "x", {"rows": rows}, table=rows, columns=("method", "eps"),
                 markdown="| a |\n", meta={"complete": True}, extra={"ledgers.json": {"k": 1}},
                 plot=drawn.append)
    got = tmp_path / "all"
    assert sorted(os.listdir(got)) == ["ledgers.json", "meta.json", "x.csv", "x.json", "x.md"]
    assert (got / "x.csv").read_text().splitlines() == ["method,eps", "a,1.0"]
    assert json.loads((got / "x.json").read_text()) == {"rows": rows}
    assert drawn == [str(got / "x.png")]


def test_labels_only_rows_hold_the_schema(tmp_path):
    """benchmarks.adaptive_rounds --labels-only (in process, no Ray) goes through the runner
    and its rows carry the same fields."""
    from benchmarks import adaptive_rounds
    out = tmp_path / "ar"
    assert adaptive_rounds.main(["--labels-only", "--config", CONFIG, "--eps", "1", "--rounds",
                                 "1", "--seeds", "0", "--out", str(out), "--set",
                                 "queries.restarts=1"]) == 0
    doc = json.loads((out / "results.json").read_text())
    (row,) = doc["runs"]
    assert set(ROW_FIELDS) <= set(row) and not row["error"], row.get("error")
    assert row["eps"] == pytest.approx(1.0) and row["target_eps"] == 1.0 and row["private"] is False
    assert doc["meta"]["complete"] and (out / "adaptive_rounds.md").read_text().startswith("| eps")


def test_runner_skips_done_cells_and_keeps_failures_as_rows(tmp_path, ray_session):
    """A real digits jobs.distill cell and a failing cell: the failure is a row with its
    error; run again, the finished cell is read back (nothing released twice) and the
    failed one runs again; a changed spec is not 'done'."""
    from rknn_ray.config import load_config
    out = tmp_path / "exp"
    cfg = load_config(CONFIG, FAST)
    writes, logged = [], []
    calls = tmp_path / "calls.txt"          # boom runs in its trial's process, not here

    def boom():
        with open(calls, "a") as fh:
            fh.write("1\n")
        raise ValueError("bad cell\nsecond line")

    def jobs():
        return [Job("ok", {"method": "rknn_central", "target_eps": 1.0}, cfg=cfg),
                Job("bad", {"method": "broken", "target_eps": 1.0, "dataset": "digits",
                            "model": "central"}, call=boom)]

    def runner(**kw):
        return Runner(str(out), write=lambda rows, meta: writes.append(
            (len(rows), meta["complete"])), log=lambda i, n, job, row, skipped: logged.append(
            (job.name, skipped)), **kw)

    first = runner(tensorboard=True)
    rows = first.run(jobs())
    ok, bad = rows
    assert set(ROW_FIELDS) <= set(ok) and set(ROW_FIELDS) <= set(bad)
    assert not ok["error"] and ok["eps"] == pytest.approx(1.0) and ok["method"] == "rknn_central"
    assert bad["error"] == "ValueError: bad cell" and math.isnan(bad["eps"])
    assert (bad["dataset"], bad["model"]) == ("digits", "central")    # its names survive the failure
    assert writes == [(1, False), (2, False), (2, True)]          # outputs after every cell
    saved = json.loads((out / "runs" / "ok" / Runner.CELL_FILE).read_text())
    assert saved["schema"] == ROW_SCHEMA and saved["row"]["accuracy"] == ok["accuracy"]
    report_mtime = os.path.getmtime(out / "runs" / "ok" / "report.json")
    # each cell was a Tune trial: the student's epochs, then the cell's result, went to Tune
    # (and, asked for, to TensorBoard event files); the rows come back as a DataFrame
    frame = first.frame()
    assert list(frame["method"]) == ["rknn_central", "broken"]
    assert frame["accuracy"][0] == ok["accuracy"]
    tuned = {r.config["cell"]: r for r in first.results}
    assert tuned["ok"].metrics["accuracy"] == ok["accuracy"]
    assert tuned["ok"].metrics["n_opened"] == ok["messages"] > 0
    assert tuned["ok"].metrics["eps"] == pytest.approx(1.0) and tuned["bad"].metrics["error"]
    curve = tuned["ok"].metrics_dataframe
    assert curve["student_loss"].notna().sum() == 1 and curve["epoch"].max() == 1   # FAST: 1 epoch
    events = [f for f in (out / "tune").rglob("events.out.tfevents*")]
    assert len(events) == 2 and all(f.stat().st_size > 0 for f in events)

    logged.clear()
    again = runner().run(jobs())
    assert logged == [("ok", True), ("bad", False)] and calls.read_text() == "1\n1\n"
    assert json.loads(json.dumps(again[0])) == json.loads(json.dumps(ok))
    assert os.path.getmtime(out / "runs" / "ok" / "report.json") == report_mtime
    with sqlite3.connect(out / "ledger.sqlite") as con:      # released once, in the experiment's
        assert con.execute("SELECT COUNT(*) FROM releases WHERE status = 'released'"
                           ).fetchone()[0] == 1
    only_done = runner()
    assert only_done.run(jobs()[:1])[0]["accuracy"] == ok["accuracy"]
    assert only_done._ray_started is None          # all done: Ray was not even asked for
    changed = Job("ok", {"method": "rknn_central", "target_eps": 1.0},
                  cfg=load_config(CONFIG, FAST + ["rknn.k=2"]))
    assert runner().load_done(changed) is None and runner().load_done(jobs()[0]) is not None


def _leftovers() -> tuple[set, set]:
    """(alive actors, created placement groups) of the session's Ray, by id."""
    import ray
    # Ray's private API: the public State API needs the dashboard, which tests run without
    from ray._private.state import actors
    alive = {a for a, info in actors().items() if info["State"] == "ALIVE"}
    groups = {g for g, info in ray.util.placement_group_table().items()
              if info["state"] == "CREATED"}
    return alive, groups


def _probe() -> dict:
    """A cell that says what lives in the session's Ray while it runs, and who it is."""
    import ray
    alive, groups = _leftovers()
    me = ray.get_runtime_context()
    return {"_side": {"actors": sorted(alive), "groups": sorted(groups), "me": me.get_actor_id(),
                      "my_group": ray.util.get_current_placement_group().id.hex()}}


def test_cells_share_a_trial_process_and_give_the_rows_of_fresh_ones(tmp_path, ray_session):
    """Tune reuses one trial process for cell after cell: two seeded jobs.distill cells give,
    run second in a used process, exactly the rows they give run first in a fresh one; a
    cell after them in the same process finds none of their actors or placement groups, and
    the finished experiment leaves none of its own."""
    from rknn_ray.config import load_config
    before_actors, before_groups = _leftovers()

    def cell(eps):
        cfg = load_config(CONFIG, FAST + ["run.rng=seeded", f"privacy.eps={eps}",
                                          "cluster.shards=1", "cluster.shard_cpus=0.25"])
        return Job(f"eps{eps}", {"target_eps": eps}, cfg=cfg)

    a, b = cell(1.0), cell(2.0)
    probe = Job("probe", {"target_eps": 0.0}, call=_probe, bundles=cell_bundles(a.cfg))
    first = Runner(str(tmp_path / "ab"), concurrent=1)
    ab = dict(zip(("a", "b", "probe"), first.run([a, b, probe])))
    second = Runner(str(tmp_path / "ba"), concurrent=1)
    ba = dict(zip(("b", "a"), second.run([b, a])))
    for runner in (first, second):                       # one process ran every cell
        assert len({r.metrics["pid"] for r in runner.results}) == 1
    timing = {"run", "wall_s", "stage_s"}
    for name in ("a", "b"):
        assert not ab[name]["error"] and not ba[name]["error"], (ab[name], ba[name])
        diff = {f: (ab[name][f], ba[name][f]) for f in ab[name]
                if f not in timing and not _same(ab[name][f], ba[name][f])}
        assert not diff, (name, diff)
    seen = first.side["probe"]                           # what the two cells left while it ran
    assert set(seen["actors"]) - before_actors == {seen["me"]}
    assert set(seen["groups"]) - before_groups == {seen["my_group"]}
    import time
    end = time.monotonic() + 30                          # Tune ends its trial actor at once,
    while _leftovers() != (before_actors, before_groups) and time.monotonic() < end:
        time.sleep(0.5)                                  # Ray frees it a moment later
    after_actors, after_groups = _leftovers()
    assert after_actors <= before_actors and after_groups <= before_groups


def test_concurrency_fits_the_cells_and_refuses_a_deadlock():
    """Default: the cells whose placement groups and Ray Train students all fit the CPUs at
    once; more, asked for, only while one student still fits beside every held group."""
    from rknn_ray.config import load_config
    cfg = load_config(CONFIG, FAST[:1] + ["student.trainer=ray", "student.num_workers=1",
                                          "cluster.shards=1", "cluster.shard_cpus=0.25"])
    assert cell_bundles(cfg) == [{}, {"CPU": 0.25}]    # the driver, the server (shards SPREAD)
    jobs = [Job(str(i), {}, cfg=cfg) for i in range(12)]
    assert concurrency(jobs, 2.0) == 1                  # 0.5 held + 1 student each
    assert concurrency(jobs, 8.0) == 5
    assert concurrency(jobs, 2.0, 2) == 2               # 2 x 0.5 held + 1 student = 2 CPUs
    with pytest.raises(ConfigError, match="--concurrent.*wait on each other forever"):
        concurrency(jobs, 2.0, 3)
    assert concurrency(jobs[:2], 8.0, 5) == 2           # never more than the cells
    shuffle = load_config(CONFIG, FAST[:1] + ["privacy.model=shuffle", "privacy.mechanism=collision",
                                              "privacy.delta=1e-5"])
    assert cell_bundles(shuffle) == [{}, {"CPU": 0.5}]  # the server and a shuffler hop
    placed = load_config(CONFIG, FAST[:1] + ["cluster.placement={server: {resources: {vault: 1}}}",
                                             "privacy.model=shuffle", "privacy.mechanism=collision",
                                             "privacy.delta=1e-5"])
    assert cell_bundles(placed) == [{}, {"CPU": 0.25, "vault": 1}, {"CPU": 0.25}]


def test_concurrent_cells_ending_together_lose_and_double_no_release(tmp_path, ray_session):
    """Four cells as Tune trials at once, each reserving, releasing and settling in the
    experiment's ledger at the same moment (a barrier): every release is there once, none is
    left open, and the totals equal the same cells run one after another."""
    import time

    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.accounting.budget_store import BudgetStore, mark_started
    from rknn_ray.accounting.events import ApproxDpEvent
    from rknn_ray.accounting.guarantee import Guarantee
    eps_list = (0.25, 0.5, 1.0, 2.0)

    def cells(out, together):
        def cell(eps):
            def call():
                os.makedirs(out / "arrived", exist_ok=True)
                (out / "arrived" / f"{eps}").touch()
                end = time.monotonic() + 60
                while together and len(os.listdir(out / "arrived")) < together:
                    assert time.monotonic() < end, "the cells did not run at once"
                    time.sleep(0.01)
                store, job = BudgetStore(str(out / "ledger.sqlite")), f"job-{eps}"
                store.reserve("digits/x", "digits", job, eps, 0.0, (1e9, 1.0))
                mark_started(store, "digits/x", job)
                PrivacyLedger(store=store, identity="digits/x", job_id=job).record(
                    Guarantee(ApproxDpEvent(eps, 0.0), "central", "laplace"), 0)
                store.close_job("digits/x", job, "done")
                return {"eps": eps, "delta": 0.0}
            return call
        return [Job(f"c{eps}", {"target_eps": eps}, call=cell(eps), bundles=[{"CPU": 0.25}])
                for eps in eps_list]

    def released(out):
        with sqlite3.connect(out / "ledger.sqlite") as con:
            return (con.execute("SELECT job_id, status, eps FROM releases WHERE status != 'unused' "
                                "ORDER BY job_id").fetchall())

    together, alone = tmp_path / "together", tmp_path / "alone"
    runner = Runner(str(together), concurrent=4)
    rows = runner.run(cells(together, 4))
    assert runner.meta["concurrent"] == 4 and not any(r["error"] for r in rows), \
        [r["error"] for r in rows]
    Runner(str(alone), ray=False).run(cells(alone, 0))       # one after another, here
    got = released(together)
    assert got == released(alone) == sorted((f"job-{e}", "released", e) for e in eps_list)
    assert sum(e for _, _, e in got) == pytest.approx(sum(eps_list))


def test_a_cell_whose_process_dies_is_a_row_with_its_error(tmp_path, ray_session):
    """A trial's process that dies (not a Python error the cell catches) is still a row."""
    def dies():
        os._exit(3)

    rows = Runner(str(tmp_path / "x")).run([Job("dies", {"method": "m"}, call=dies,
                                                bundles=[{"CPU": 0.25}])])
    (row,) = rows
    assert row["method"] == "m" and row["error"] and math.isnan(row["eps"]), row["error"]


def test_markdown_table_and_csv_writers():
    lines = markdown_table(("a", "b"), [[1, "x"], [2, "y"]], ["", " error: e"])
    assert lines == ["| a | b |", "|---|---|", "| 1 | x |", "| 2 | y | error: e"]
    assert rows_to_csv([{"a": 1, "b": 2, "c": 3}], ("a", "b")) == "a,b\r\n1,2\r\n"


def test_mlflow_without_mlflow_installed_is_said_before_anything_runs(tmp_path, monkeypatch):
    """--mlflow where mlflow is not installed: a ConfigError naming the extra, no cell run.
    (A None in sys.modules makes ``import mlflow`` fail as it does where it is missing.)"""
    pytest.importorskip("ray")
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError, match=r"--mlflow.*rknn-ray\[mlflow\]"):
        Runner(str(tmp_path / "x"), mlflow=str(tmp_path / "mlruns"))
    assert not (tmp_path / "x").exists()


def test_mlflow_gets_one_run_per_cell_with_its_metrics(tmp_path, ray_session, monkeypatch):
    """--mlflow URI: every trial is an MLflow run (a local file store here) holding the
    cell's name and the metrics Tune got."""
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")    # MLflow 3 asks for it (docs)
    uri = (tmp_path / "mlruns").as_uri()
    jobs = [Job(f"c{i}", {"target_eps": float(i)}, bundles=[{"CPU": 0.25}],
                call=(lambda i=i: {"eps": float(i), "accuracy": i / 10})) for i in (1, 2)]
    rows = Runner(str(tmp_path / "exp"), mlflow=uri).run(jobs)
    assert [r["accuracy"] for r in rows] == [0.1, 0.2]
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("exp")
    runs = client.search_runs([experiment.experiment_id])
    got = {r.data.params["cell"]: r.data.metrics for r in runs}
    assert sorted(got) == ["c1", "c2"]
    assert got["c1"]["accuracy"] == 0.1 and got["c2"]["eps"] == 2.0
    assert all(r.info.status == "FINISHED" for r in runs)

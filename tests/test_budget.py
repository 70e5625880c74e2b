"""A budget that lasts across jobs: the SQLite ledger keyed by the private data's identity."""
import json
import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.errors import PrivacyBudgetError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_reserve_commit_close_and_refuse(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    budget = store.reserve("ds1", "digits", "job-a", 1.0, 0.0, (1.5, 0.0))
    assert budget == (1.5, 0.0) and store.spent("ds1").eps == pytest.approx(1.0)
    store.commit_round("ds1", "job-a", 0, 0.5, 0.0, {"type": "DiscreteLaplaceDpEvent",
                                                      "noise_parameter": 0.25, "sensitivity": 2})
    assert store.spent("ds1").eps == pytest.approx(1.0)          # moved, not added
    store.close_job("ds1", "job-a", "finished after one round")    # the unused 0.5 comes back
    assert store.spent("ds1").eps == pytest.approx(0.5)
    store.reserve("ds1", "digits", "job-b", 1.0, 0.0, (99.0, 0.0))  # budget was set once: 1.5
    with pytest.raises(PrivacyBudgetError, match="budget set ds1"):
        store.reserve("ds1", "digits", "job-c", 0.1, 0.0, (99.0, 0.0))
    store.mark_failed("ds1", "job-b", "server died mid-round")     # a crash keeps it counted
    assert store.spent("ds1").eps == pytest.approx(1.5)
    with pytest.raises(PrivacyBudgetError, match="allow-lower"):
        store.set_budget("ds1", 1.0, 0.0)
    store.set_budget("ds1", 3.0, 0.0)
    store.reserve("ds1", "digits", "job-d", 1.5, 0.0, (1.0, 0.0))
    rows = store.datasets()
    assert rows[0]["budget"]["eps"] == 3.0 and rows[0]["spent"]["eps"] == pytest.approx(3.0)
    kinds = [r["status"] for r in rows[0]["releases"]]
    assert kinds.count("released") == 1 and kinds.count("reserved") == 2


def _racer(path, name, results):
    try:
        BudgetStore(path).reserve("ds", "race", name, 1.0, 0.0, (1.0, 0.0))
        results.put("ok")
    except PrivacyBudgetError:
        results.put("refused")


def test_two_jobs_at_once_cannot_both_fit_under_the_budget(tmp_path):
    path = str(tmp_path / "race.sqlite")
    BudgetStore(path).set_budget("ds", 1.0, 0.0, "race")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, f"job-{i}", results)) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    outcomes = sorted(results.get(timeout=5) for _ in procs)
    assert outcomes == ["ok", "refused", "refused", "refused"]


def test_second_job_over_the_budget_exits_2_before_ray_starts(digits_runs, tmp_path,
                                                              isolated_privacy_ledger):
    """The first job is the session's digits central run (budget_eps=1.5, conftest); its
    ledger is copied, so the second job is refused against what the first really spent."""
    import shutil
    common = ["--config", "jobs/configs/digits_central.yaml", "--quiet",
              "--set", "privacy.budget_eps=1.5", "--set", "student.epochs=1",
              "--set", "queries.restarts=1"]
    shutil.copyfile(digits_runs / "digits_central.ledger.sqlite", isolated_privacy_ledger)
    # with its release key: a ledger with releases copied without it is refused (issue 55)
    shutil.copyfile(digits_runs / "digits_central.ledger.sqlite.key",
                    str(isolated_privacy_ledger) + ".key")
    report = json.loads((digits_runs / "digits_central" / "report.json").read_text())
    assert "eps" not in report["privacy"]["budget"]       # the source's history: the ledger's
    # the same records split, partitioned and dealt otherwise: the same budget (issue 18)
    other_split = ["--set", "run.seed=1", "--set", "data.partition=dirichlet",
                   "--set", "data.max_records_per_client=200",
                   "--set", "data.clients=99", "--set", "data.alpha=2.0"]
    second = subprocess.run([sys.executable, "-m", "jobs.distill", *common, *other_split,
                             "--out", str(tmp_path / "second")], cwd=ROOT, capture_output=True,
                            text=True, timeout=120,
                            env={**os.environ, "RKNN_RAY_LEDGER": str(isolated_privacy_ledger)})
    assert second.returncode == 2, second.stderr[-2000:]
    assert "privacy budget of eps=1.5" in second.stderr and "rknn-ray budget set" in second.stderr
    assert "The limit is eps" in second.stderr
    assert "Started a local Ray instance" not in second.stderr       # refused before Ray starts
    assert not (tmp_path / "second").exists()                          # and no empty folder
    listed = subprocess.run([sys.executable, "-m", "jobs.cli", "budget", "list", "--json"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={**os.environ, "RKNN_RAY_LEDGER": str(isolated_privacy_ledger)})
    (dataset,) = json.loads(listed.stdout)
    assert dataset["budget"]["eps"] == 1.5 and dataset["spent"]["eps"] == pytest.approx(1.0)
    assert [r["status"] for r in dataset["releases"]] == ["unused", "released"]
    assert dataset["releases"][1]["event"]["type"] == "DiscreteLaplaceDpEvent"


def test_the_store_composes_with_the_runs_accountant(tmp_path):
    """Forty small Laplace releases: the PLD accountant admits a job the plain sum refuses."""
    from dp_accounting import dp_event

    from rknn_ray.accounting.events import event_to_dict
    store = BudgetStore(str(tmp_path / "pld.sqlite"))
    store.set_budget("ds", 3.5, 1e-6, "many releases")
    release = event_to_dict(dp_event.LaplaceDpEvent(noise_multiplier=10.0))     # eps 0.1 each
    for i in range(30):
        store.reserve("ds", "d", f"job-{i}", 0.1, 0.0, (3.5, 1e-6))
        store.commit_round("ds", f"job-{i}", 0, 0.1, 0.0, release)
        store.close_job("ds", f"job-{i}", "done")
    assert store.composed("ds", "basic")[0] == pytest.approx(3.0)
    pld_eps, pld_delta = store.composed("ds", "pld")
    assert pld_eps < 3.0 and pld_delta <= 1e-6
    with pytest.raises(PrivacyBudgetError, match="basic composition"):
        store.reserve("ds", "d", "job-basic", 1.0, 0.0, (3.5, 1e-6), accountant="basic")
    store.reserve("ds", "d", "job-pld", 1.0, 0.0, (3.5, 1e-6), accountant="pld")


def test_a_failure_before_any_client_randomizes_returns_the_reservation(tmp_path):
    """The run folder cannot be written after the budget was reserved (a real OS error):
    nothing was released, so nothing stays counted."""
    from jobs.distill import run
    from rknn_ray.config import load_config
    ledger = str(tmp_path / "l.sqlite")
    not_a_folder = tmp_path / "run"
    not_a_folder.write_text("a file where the run folder should be")
    cfg = load_config("jobs/configs/digits_central.yaml", ["run.progress=false"])
    with pytest.raises(OSError):
        run(cfg, str(not_a_folder), ledger_path=ledger)
    (dataset,) = BudgetStore(ledger).datasets()
    assert dataset["spent"]["eps"] == 0.0 and dataset["reserved"] == 0
    (row,) = dataset["releases"]
    assert row["status"] == "unused" and "before any client randomized" in row["note"]

"""The orchestration layer (rknn_ray/job/): a whole job without the CLI, the mechanism built
in one place, one per-round query selection, and party code injected instead of fault
parameters in production code."""
import dataclasses
import inspect
import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from rknn_ray.config import load_config

FAST = ["student.epochs=2", "queries.restarts=1", "run.rng=seeded",
        "student.trainer=local"]   # Ray Train: tests/test_student_ray.py, the demo console test


def test_run_config_returns_a_run_result_without_the_cli(ray_session, tmp_path,
                                                         isolated_privacy_ledger):
    """A library user runs a whole job: the RunResult carries what the run folder holds."""
    from rknn_ray.job import RunResult, run
    from rknn_ray.runio import prepare_run_dir
    cfg = load_config("jobs/configs/digits_central.yaml", FAST)
    out = prepare_run_dir(str(tmp_path / "lib"), overwrite=False)
    result = run(cfg, out, ledger_path=str(isolated_privacy_ledger))
    assert isinstance(result, RunResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.report = {}
    assert result.report == json.loads((tmp_path / "lib" / "report.json").read_text())
    labels = pq.read_table(result.paths["labels"]).column("label").to_numpy()
    np.testing.assert_array_equal(result.labels, labels)
    assert (result.guarantee.model, result.guarantee.unit) == ("central", "record")
    assert result.guarantee.eps == pytest.approx(result.report["privacy"]["eps"])
    assert result.ledger == result.report["privacy"]["ledger"]
    for name in ("config", "release", "ledger", "labels", "summary", "report"):
        assert (tmp_path / "lib" / result.paths[name].rsplit("/", 1)[1]).stat().st_size > 0


def test_a_finished_run_reads_back_from_its_folder_and_logs_its_stages(
        ray_session, tmp_path, isolated_privacy_ledger, caplog):
    """A library user gets the stage lines through ``logging`` (the ``rknn_ray`` logger), and a
    notebook reads the run back from its folder: the same labels, the labels as a DataFrame,
    the student as a torch module, every file of the folder in ``paths``; the report gives the
    job's wall time."""
    import logging

    import torch
    from rknn_ray.job import RunResult, run
    from rknn_ray.runio import prepare_run_dir
    cfg = load_config("jobs/configs/digits_central.yaml", FAST)
    out = prepare_run_dir(str(tmp_path / "nb"), overwrite=False)
    with caplog.at_level(logging.INFO, logger="rknn_ray"):
        result = run(cfg, out, ledger_path=str(isolated_privacy_ledger))
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("rknn_ray")]
    assert any(line.startswith("loading digits and partitioning ...") for line in lines), lines
    assert any("done in" in line for line in lines)
    assert any(line.startswith("student test accuracy") for line in lines)
    back = RunResult.from_path(out)
    np.testing.assert_array_equal(back.labels, result.labels)
    assert back.report == result.report and back.ledger == result.ledger
    assert back.guarantee == result.guarantee
    assert back.paths == result.paths
    assert set(os.listdir(out)) == {os.path.basename(p) for p in result.paths.values()}
    assert {"student", "history"} <= set(result.paths)
    frame = back.labels_frame()
    np.testing.assert_array_equal(frame["label"].to_numpy(), result.labels)
    assert list(frame.columns[:3]) == ["id", "label", "class"]
    student = back.student()
    assert isinstance(student, torch.nn.Module) and not student.training
    # the report shows the job's wall time beside the stages' total (Ray's start-up is in it)
    from jobs.experiments import stage_seconds
    from jobs.report import load_run, run_sections
    timings = result.report["timings_s"]
    assert timings["job"] >= stage_seconds(timings) > 0
    times = dict(dict(run_sections(load_run(out)))["Timings"])
    assert times["job wall time"].startswith(f"{timings['job']:.1f} s")


def test_the_job_validates_the_config_it_is_handed(tmp_path, isolated_privacy_ledger):
    """A Config changed in code (``dataclasses.replace``) is refused before any work: no
    budget reserved, nothing written, Ray not started."""
    import ray
    from rknn_ray.errors import ConfigError
    from rknn_ray.job import run
    cfg = load_config("jobs/configs/digits_central.yaml", FAST)
    bad = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, eps=-1.0))
    out = tmp_path / "bad"
    out.mkdir()
    started = ray.is_initialized()
    with pytest.raises(ConfigError, match="privacy.eps"):
        run(bad, str(out), ledger_path=str(isolated_privacy_ledger))
    bad = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, model="nonsense"))
    with pytest.raises(ConfigError, match="privacy.model"):
        run(bad, str(out), ledger_path=str(isolated_privacy_ledger))
    assert not os.listdir(out) and not isolated_privacy_ledger.exists()
    assert ray.is_initialized() == started
    with pytest.raises(TypeError, match="load_config"):
        run(cfg.to_dict(), str(out))


def test_a_run_folder_without_report_json_is_named(tmp_path):
    from rknn_ray.errors import DataError
    from rknn_ray.job import RunResult
    (tmp_path / "incomplete.json").write_text("{}")
    with pytest.raises(DataError, match="did not finish"):
        RunResult.from_path(str(tmp_path))


def _ctx(*overrides):
    from rknn_ray.job.context import JobContext
    from rknn_ray.data.prepared import prepare_data
    cfg = load_config("jobs/configs/digits_central.yaml", ["run.rng=seeded", *overrides])
    return JobContext(cfg, prepare_data(cfg), "", None, None, "", "", "")


@pytest.mark.parametrize("noise", ["discrete", "continuous"])
def test_a_rounds_mechanism_and_its_plotted_bound_come_from_the_config(noise):
    """Round t's mechanism gets the round's share of eps and its s, the config's noise kind;
    the plots' error bound is that mechanism's own (not a rebuild with discrete noise)."""
    from rknn_ray.job.finish import release_error_bound
    from rknn_ray.mechanisms.central import central_error_bound
    ctx = _ctx("rounds.count=2", "privacy.eps=1.0", f"privacy.noise={noise}")
    mech = ctx.round_mechanism(1, 7)
    assert mech.params.eps == pytest.approx(0.5) and mech.params.num_queries == 7
    assert mech.describe()["noise"] == noise
    assert release_error_bound(mech) == mech.error_bound(0.05)
    other = "discrete" if noise == "continuous" else "continuous"
    assert release_error_bound(mech) != central_error_bound(float(mech.scale), 10, 0.05, other)


def test_round_query_selection_is_the_jobs_own(tmp_path):
    """One selection for the job and the adaptive-rounds benchmark: k-means first, then the
    configured rule, never a query already taken."""
    from rknn_ray.job.rounds import select_round_queries
    from rknn_ray.job.stages import fit_queries
    ctx = _ctx("rounds.count=2", "rounds.query_selection=farthest", "queries.s=10")
    _, emb, first = fit_queries(ctx.cfg, ctx.data)
    qs, how = select_round_queries(ctx.cfg, ctx.data, 0, emb, [], [], 10, first)
    assert qs is first and how == {"round": 0, "rule": "kmeans", "queries": 10}
    qs1, how1 = select_round_queries(ctx.cfg, ctx.data, 1, emb, [], [first], 10, first)
    assert how1 == {"round": 1, "rule": "farthest", "queries": 10}
    assert not set(qs1.public_index) & set(first.public_index)
    import benchmarks.adaptive_rounds as bench
    from rknn_ray.job import rounds
    assert "planned_rounds(" in inspect.getsource(bench.label_only_cell)
    assert "planned_rounds(" in inspect.getsource(rounds.private_rounds)


def test_the_rounds_loop_plans_each_round_from_the_config():
    """planned_rounds, the one rounds loop (the job's and the adaptive-rounds benchmark's):
    each round its share of (eps, delta), its new queries (k-means first, then the rule,
    never one taken) and a mechanism calibrated for both; the caller appends each released
    round before the next is planned."""
    from rknn_ray.job.rounds import planned_rounds
    from rknn_ray.labeling.stage import round_budgets
    from rknn_ray.job.stages import fit_queries
    ctx = _ctx("rounds.count=3", "rounds.query_selection=farthest", "queries.s=12",
               "rounds.split_queries=true", "rounds.budget_split=[0.2, 0.3, 0.5]")
    _, emb, first = fit_queries(ctx.cfg, ctx.data)
    released, query_sets, plans = [], [], []
    for plan in planned_rounds(ctx.cfg, ctx.data, emb, first, released, query_sets):
        plans.append(plan)
        released.append(plan.t)
        query_sets.append(plan.queries)
    assert [p.t for p in plans] == [0, 1, 2] and plans[0].queries is first
    assert [(p.eps, p.delta) for p in plans] == round_budgets(1.0, 0.0, 3, (0.2, 0.3, 0.5))
    assert [p.queries.size for p in plans] == [4, 4, 4]
    assert [p.selection.get("rule") for p in plans] == ["kmeans", "farthest", "farthest"]
    taken = np.concatenate([p.queries.public_index for p in plans])
    assert len(set(taken)) == len(taken) == 12
    assert [(p.mechanism.params.eps, p.mechanism.params.num_queries) for p in plans] == \
        [(p.eps, 4) for p in plans]
    loop = planned_rounds(ctx.cfg, ctx.data, emb, first, [], [])
    next(loop)                                   # round 1 planned, but never appended
    with pytest.raises(RuntimeError, match="append each released round"):
        next(loop)


def test_production_parties_take_no_fault_parameters():
    """Faults are test subclasses (tests/faulty_parties.py), injected through Parties."""
    from actors import client_shard, server, shuffler
    from rknn_ray.job.session import Parties, ProtocolSession
    from tests.faulty_parties import CrashingShard, configured, crashing_shard
    assert "fault" not in inspect.signature(client_shard.ClientShardImpl.__init__).parameters
    params = inspect.signature(ProtocolSession.__init__).parameters
    assert "parties" in params and not {"shard_faults", "party_faults"} & set(params)
    assert not any(hasattr(client_shard.ClientShardImpl, m)
                   for m in ("_flood", "_garbage", "_maybe_crash"))
    default = Parties()
    assert default.shard_actor(0) is client_shard.ClientShard
    assert default.server_actor() is server.Server and default.shuffler_actor() is shuffler.Shuffler
    crash = crashing_shard("/tmp/x", after=3)
    assert issubclass(crash, CrashingShard) and crash.after == 3
    assert Parties(shards={1: crash}).shard_actor(0) is client_shard.ClientShard
    with pytest.raises(TypeError, match="no setting"):
        configured(CrashingShard, afterr=3)


def test_ensure_ray_is_the_one_start_up_for_a_local_instance_or_a_cluster(monkeypatch):
    """The options the benchmarks need (a cluster address, the object store's size, a quiet
    driver) go through the one start-up; a joined cluster is never reported as started."""
    import ray

    from rknn_ray.job import ray_env
    calls = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray_env, "local_ray_env", lambda: None)     # leaves os.environ alone
    assert ray_env.ensure_ray(num_cpus=2, object_store_mb=300, log_to_driver=False) is True
    assert calls[-1]["address"] == "local" and calls[-1]["num_cpus"] == 2
    assert calls[-1]["object_store_memory"] == 300 * 2 ** 20
    assert calls[-1]["log_to_driver"] is False and calls[-1]["include_dashboard"] is False
    # a cluster address is joined once the address check passes (its probes, a real Ray and
    # listeners that are not Ray, are tests/test_edge_probes_inputs.py's)
    address = "127.0.0.1:6379"
    monkeypatch.setattr(ray_env, "check_ray_address", lambda a, *args, **kw: a)
    assert ray_env.ensure_ray(address=address) is False
    assert calls[-1] == {"address": address, "log_to_driver": True}
    assert ray_env.ensure_ray() is True and "object_store_memory" not in calls[-1]


def test_the_student_stages_leave_the_label_info_alone(tmp_path):
    """No dict is written and popped across modules: the label info is read only, the
    student's inputs describe themselves, and the report's utility is composed once."""
    from rknn_ray.job.stages import finish_labels, fit_queries
    from rknn_ray.student.stage import student_description, student_inputs
    from rknn_ray.labeling.stage import exact_answers
    ctx = _ctx("queries.s=10", "student.input=features")
    enc, emb, qs = fit_queries(ctx.cfg, ctx.data)
    counts = exact_answers(enc, ctx.data, qs, 1).counts().astype(float)
    lab, info = finish_labels(ctx.cfg, ctx.data, counts, qs, emb, rounds=[], noise_std=0.0)
    before = dict(info)
    inputs = student_inputs(ctx.cfg, ctx.data, enc, lab, qs, emb, info, str(tmp_path))
    assert info.keys() == before.keys() and "confidence" in info
    assert student_description(ctx.cfg, ctx.data, enc, inputs) == {
        "input": "features", "encoder": ctx.cfg.represent.encoder, "dim": inputs.train_x.shape[1]}
    semi = _ctx("queries.s=10", "student.method=semi")
    described = student_description(semi.cfg, semi.data, enc, inputs)
    assert described["method"] == "semi" and described["init"] == "scratch"
    assert student_description(_ctx("queries.s=10").cfg, ctx.data, enc,
                               student_inputs(_ctx("queries.s=10").cfg, ctx.data, enc, lab, qs,
                                              emb, info, None)) is None


def test_a_big_round_gets_one_opener_per_cpu_of_the_cluster(ray_session):
    from rknn_ray.job.session import OPEN_IN_SERVER_BELOW, opener_processes
    cpus = int(ray_session.cluster_resources()["CPU"])
    assert opener_processes(None, OPEN_IN_SERVER_BELOW) == max(1, min(16, cpus))
    assert opener_processes(None) == max(1, min(16, cpus))      # size unknown: the pool

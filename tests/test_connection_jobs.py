"""rknn.connection=balanced_harmonic end to end: a digits job in each trust model (issue 37).

The server plans the connection from public data and ships it with the queries to the client
shards, so the released counts are the plan's counts: checked exactly in the central model at
an eps so large that the discrete Laplace noise is zero, against reverse k-NN's.
"""
import json

import numpy as np
import pytest

from jobs.distill import main
from tests.job_args import distill_args

FAST = ["student.trainer=local", "rknn.connection=balanced_harmonic"]


def _exact_counts(out, rule):
    """The exact counts of the run's round-0 queries under ``rule`` (recomputed: public
    encoder and queries from the run's config and release.npz)."""
    from rknn_ray.config import load_config
    from rknn_ray.labeling.rknn import build_answers
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.labeling.stage import connection_plan
    from rknn_ray.representation.stage import encoder_from_config
    cfg = load_config(str(out / "config.yaml"))
    data = prepare_data(cfg)
    encoder = encoder_from_config(cfg).fit(data.splits.public_x)
    release = np.load(out / "release.npz")
    queries = release["query_features_0"]
    plan = connection_plan(cfg, encoder.transform(data.splits.public_x), queries, rule)
    rows = data.held_rows()
    rows = rows[np.argsort(data.client_ids[rows], kind="stable")]
    answers = build_answers(encoder.transform(data.splits.private_x[rows]),
                            data.splits.private_y[rows], data.client_ids[rows], queries,
                            cfg.rknn.k, data.num_classes, plan)
    return answers.counts(), release["counts_0"], plan


@pytest.mark.parametrize("config", ["digits_central", "digits_local", "digits_shuffle"])
def test_balanced_harmonic_digits_job_in_each_trust_model(ray_session, tmp_path, config):
    out = tmp_path / config
    extra = ["privacy.eps=1000", "privacy.budget_eps=null"]  # budget: eps if config == "digits_central" else []
    assert main(distill_args(f"{config}.yaml", out, *FAST, *extra)) == 0
    report = json.loads((out / "report.json").read_text())
    conn = report["connection"]
    assert conn["configured"] == "balanced_harmonic" and conn["rules"] == ["balanced_harmonic"]
    plan = report["selection"][0]["connection"]
    assert plan["prices_digest"] == conn["prices_digest"][0] != "reverse_knn"
    assert plan["public_objective"] >= plan["public_objective_reverse_knn"]
    assert report["privacy"]["model"] == config.split("_")[1]
    assert 0 <= report["accuracy"]["labels"] <= 1
    from jobs.report import run_sections            # rknn-ray report names the rule
    counts = dict(dict(run_sections({"report": report, "path": str(out),
                                     "incomplete": None}))["Counts"])
    assert counts["connection"] == "balanced_harmonic"
    if config == "digits_central":     # noise of scale 2kr/1000 rounds to 0: counts are exact
        exact, released, planned = _exact_counts(out, "balanced_harmonic")
        assert planned.digest() == plan["prices_digest"]      # the plan is public and repeatable
        assert np.array_equal(released, exact)
        reverse, _, _ = _exact_counts(out, "reverse_knn")
        assert not np.array_equal(released, reverse)          # the clients used the plan


def test_two_rounds_reweighted_by_the_first_release(ray_session, tmp_path):
    """rknn.reweight=released: round 2's plan weights the public samples by round 1's released
    counts; the prices stay in release.npz (report.json: their digest), and the diagnostics'
    exact counts use the saved plans."""
    out = tmp_path / "reweighted"
    assert main(distill_args("digits_central.yaml", out, *FAST, "rounds.count=2",
                             "rknn.reweight=released", "run.diagnostics=true")) == 0
    report = json.loads((out / "report.json").read_text())
    first, second = (sel["connection"] for sel in report["selection"])
    assert (first["reweight"], second["reweight"]) == ("public", "released")
    assert "weighted" in second and "weighted" not in first
    assert "prices" not in first and "prices" not in second
    assert report["connection"]["prices_digest"] == [first["prices_digest"],
                                                     second["prices_digest"]]
    meta = json.loads(str(np.load(out / "release.npz")["meta"]))
    from rknn_ray.labeling.connection import Connection
    saved = [Connection("balanced_harmonic", np.asarray(sel["connection"]["prices"]))
             for sel in meta["selections"]]
    assert [c.digest() for c in saved] == report["connection"]["prices_digest"]
    assert len(report["privacy"]["rounds"]) == 2
    assert 0 <= report["diagnostics"]["nonprivate_labels"] <= 1      # made with the saved plans


def test_auto_connection_records_its_choice(ray_session, tmp_path):
    out = tmp_path / "auto"
    assert main(distill_args("digits_central.yaml", out, "student.trainer=local",
                             "rknn.connection=auto")) == 0
    conn = json.loads((out / "report.json").read_text())["connection"]
    auto = conn["auto"]
    assert conn["configured"] == "auto" and conn["rules"] == [auto["rule"]]
    assert auto["rule"] in ("reverse_knn", "balanced_min", "balanced_harmonic")
    assert "noise std" in auto["reason"] and set(auto["at_risk"]) == {
        "reverse_knn", "balanced_min", "balanced_harmonic"}


def test_a_bad_connection_exits_2_with_one_line(tmp_path, capsys):
    out = tmp_path / "bad"
    assert main(distill_args("digits_central.yaml", out, "rknn.connection=balanced")) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rknn.connection" in err
    assert all(r in err for r in ("reverse_knn", "balanced_min", "balanced_harmonic", "auto"))
    assert not out.exists()

"""The amplification job: CLI JSON shapes, grid outputs, empirical audit."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import published_amplification as pub
from benchmarks.amplification import main, run_grid
from rknn_ray.accounting import BOUNDS
from benchmarks.audit import audit_binary_rr, clopper_pearson

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_cli_json_eps0():
    out = subprocess.run([sys.executable, "-m", "benchmarks.amplification", "--n", "100000",
                          "--eps0", "4", "--delta", "1e-6", "--json"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    rows = json.loads(out)
    by = {r["bound"]: r for r in rows}
    assert {"fmt_closed_form", "clones_numerical", "variation_ratio", "lower_bound"} <= set(by)
    assert all(set(r) >= {"bound", "eps", "seconds"} for r in rows)
    assert by["fmt_closed_form"]["eps"] == pytest.approx(0.5346, abs=1e-4)
    assert 0.1675 <= by["clones_numerical"]["eps"] <= 0.175


def test_cli_json_target(capsys):
    assert main(["--n", "10000", "--target-eps", "1", "--delta", "1e-6", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {r["bound"]: r["eps0"] for r in rows}
    assert by["fmt_closed_form"] < by["clones_numerical"] < by["variation_ratio"] < by["lower_bound"]
    assert BOUNDS["clones_numerical"].central_eps(by["clones_numerical"], 10000, 1e-6) <= 1.0


def test_cli_closed_form_out_of_range_is_reported_not_crashing(capsys):
    assert main(["--n", "1000", "--eps0", "4", "--delta", "1e-6", "--json"]) == 0
    by = {r["bound"]: r for r in json.loads(capsys.readouterr().out)}
    assert by["fmt_closed_form"]["eps"] is None and "Fix" in by["fmt_closed_form"]["error"]


def test_cli_mechanism_lists_its_bounds_and_its_own_lower_bound():
    """--mechanism krr / collision: the randomizer's own lower bound (named pair) and its
    variation-ratio bound beside the generic ones, every upper bound above the lower one;
    without --mechanism the output is the generic list, unchanged."""
    def run(*extra):
        out = subprocess.run([sys.executable, "-m", "benchmarks.amplification", "--n", "1000000",
                              "--eps0", "2", "--delta", "1e-8", "--json", *extra], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return {r["bound"]: r for r in json.loads(out)}
    generic, explicit = run(), run("--mechanism", "generic")
    assert list(generic) == list(explicit) == ["lower_bound", "variation_ratio", "clones_numerical",
                                               "fmt_closed_form", "fmt_closed_form_final"]
    assert "note" not in generic["lower_bound"]
    # the strongest generic lower bound (binary, 3- and 4-RR pairs), as in the gap study:
    # not binary RR's alone (0.00971 here)
    assert generic["lower_bound"]["eps"] == pytest.approx(0.012286, rel=1e-3)
    assert generic["lower_bound"]["eps"] >= BOUNDS["lower_bound"].central_eps(2.0, 10**6, 1e-8)
    for extra, own in ((("--mechanism", "krr", "--k", "10"), "variation_ratio_krr"),
                       (("--mechanism", "collision", "--l", "10"), "variation_ratio_collision")):
        by = run(*extra)
        assert {own, "lower_bound", "variation_ratio", "clones_numerical"} <= set(by)
        assert all(set(r) >= {"bound", "eps", "seconds"} for r in by.values())
        low = by["lower_bound"]
        assert "exact divergence" in low["note"] and "hold" in low["note"]
        assert 0 < low["eps"] <= min(r["eps"] for b, r in by.items() if b != "lower_bound")
    krr = run("--mechanism", "krr", "--k", "10")
    assert krr["lower_bound"]["eps"] == pytest.approx(0.009162, rel=1e-3)


def test_cli_mechanism_without_its_parameter_is_one_line_exit_2(capsys):
    assert main(["--mechanism", "krr", "--n", "1000", "--eps0", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --mechanism krr needs --k (the number of options), e.g. --k 10"]
    assert main(["--mechanism", "collision", "--l", "3", "--c", "5", "--n", "1000", "--eps0", "2"]) == 2
    assert "Collision needs integers 1 <= c < l" in capsys.readouterr().err


def test_cli_collision_without_l_uses_the_l_a_job_picks(capsys):
    """The issue's command with --mechanism collision (and its --k 10) runs: l defaults to
    the job's collision_l(eps0, c), both said on stderr; with --target-eps l is still needed."""
    from rknn_ray.mechanisms.collision import collision_l
    argv = ["--mechanism", "collision", "--k", "10", "--n", "1000000", "--eps0", "2",
            "--delta", "1e-8", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr()
    by = {r["bound"]: r for r in json.loads(out.out)}
    assert f"l = {collision_l(2.0, 1)}," in out.err and "ignores it" in out.err
    assert 0 < by["lower_bound"]["eps"] <= by["tight_collision"]["eps"]
    with_l = ["--mechanism", "collision", "--l", str(collision_l(2.0, 1)), "--n", "1000000",
              "--eps0", "2", "--delta", "1e-8", "--json"]
    assert main(with_l) == 0
    assert {r["bound"]: r["eps"] for r in json.loads(capsys.readouterr().out)} == \
        {b: r["eps"] for b, r in by.items()}
    assert main(["--mechanism", "collision", "--n", "1000", "--target-eps", "1"]) == 2
    assert "needs --l" in capsys.readouterr().err


def test_cli_mechanism_target_eps(capsys):
    assert main(["--mechanism", "krr", "--k", "10", "--n", "10000", "--target-eps", "1",
                 "--delta", "1e-6", "--json"]) == 0
    by = {r["bound"]: r["eps0"] for r in json.loads(capsys.readouterr().out)}
    assert by["clones_numerical"] < by["variation_ratio_krr"] < by["lower_bound"]


def _cheap_published_rows():
    """The first row of each (source, status, kind, mechanism) among rows that cost well
    under a second each: current upper bounds (FMT21), a superseded one (BBGN19-initial), the
    unsound ones (WANG24-code) and the computed lower bounds (SCW25-code). What the grid does
    with the comparison, not the comparison itself (every row: test_amplification_published)."""
    keep = {("FMT21", "upper"), ("BBGN19-initial", "upper"), ("WANG24-code", "upper"),
            ("SCW25-code", "lower")}
    picked = {}
    for row in pub.ROWS:
        if (row.source, row.kind) in keep:
            picked.setdefault((row.source, row.status, row.kind, row.mechanism), row)
    return list(picked.values())


def test_small_grid_writes_results_and_plots(tmp_path, monkeypatch):
    rows = _cheap_published_rows()
    full = pub.compare
    monkeypatch.setattr(pub, "compare", lambda: full(rows))
    res = run_grid(str(tmp_path), ns=(1000, 10000), eps0s=(1.0, 4.0), deltas=(1e-6,),
                   targets=(1.0,), audit_trials=20_000, real_audit_scale=0.05,
                   sim_max_n=1000, sim_reports=20_000)
    names = sorted(os.listdir(tmp_path))
    assert {"results.json", "table.txt", "central_eps_delta1e-06.png", "timing.png",
            "granted_eps0.png", "labeling_error.png", "audit.png"} <= set(names)
    assert not [n for n in names if n.startswith(".tmp-")]
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["order_violations"] == [] and data["red_flags"] == []
    assert len(data["central"]) == 4
    # 4 binary-RR reference audits + (shuffle, local) x (rr, collision) real ones
    by_kind = {(a["model"], a["mechanism"]) for a in data["audit"]}
    assert len(data["audit"]) == 8
    assert {("shuffle", "rr"), ("shuffle", "collision"), ("local", "rr"),
            ("local", "collision"), ("local", "binary_rr")} == by_kind
    for a in data["audit"]:
        assert a["eps_lower_empirical"] <= a["eps_pair_exact"]
        ub = [v for k, v in a["claimed_upper"].items() if v is not None]
        assert a["eps_pair_exact"] <= min(ub)
    # labeling: theory and simulation of the real mechanisms at the granted eps0
    small, big = data["inverse"]
    for name in ("rr", "collision"):
        lab = small["labeling"]["clones_numerical"][name]
        assert lab["mechanism"] == name and lab["n"] == 1000 and lab["trials"] == 20
        assert lab["eps0"] == pytest.approx(small["eps0"]["clones_numerical"])
        assert lab["eta_theory"] > 0 and 0 <= lab["label_error_sim"] <= 1
        assert lab["sup_err_q"] < lab["eta_theory"]
        not_sim = big["labeling"]["clones_numerical"][name]       # n > sim_max_n: theory only
        assert not_sim["trials"] == 0 and not_sim["label_error_sim"] is None
        assert not_sim["eta_theory"] > 0
    table = (tmp_path / "table.txt").read_text()
    assert "shuffle collision" in table and "RED FLAG" not in table
    # the tight-bound gap study: every randomizer, n, eps0; tight between lower and the old bounds
    assert "gap.png" in names and "tight / lower" in table
    gap = data["tight_gap"]
    assert {r["mechanism"] for r in gap} == {"krr", "collision", "generic"} and len(gap) == 12
    for r in gap:
        assert r["lower_bound"] <= r["tight"] <= r["clones_numerical"] * (1 + 1e-6)
    # the anchors' published numbers, all consistent (benchmarks/published_amplification.py)
    assert "amplification-published.md" in names and "against the published numbers" in table
    assert data["published"] and all(r["consistent"] for r in data["published"]
                                     if r["status"] == "current")
    assert len(data["published"]) == len(rows) and \
        {r["status"] for r in data["published"]} == {"current", "superseded", "unsound"}
    assert res["total_seconds"] > 0      # its speed is printed by the job, not asserted here


def test_audit_lower_bound_below_claimed_upper_and_positive():
    rng = np.random.default_rng(7)
    ub = BOUNDS["variation_ratio"].central_eps(4.0, 1000, 1e-6)
    a = audit_binary_rr(1000, 4.0, 1e-6, {"variation_ratio": ub}, trials=400_000, rng=rng)
    assert 0.1 < a.eps_lower_empirical <= BOUNDS["lower_bound"].central_eps(4.0, 1000, 1e-6)
    assert a.red_flags == []
    # a false claim is flagged
    bad = audit_binary_rr(1000, 4.0, 1e-6, {"too_small": 0.01}, trials=400_000, rng=rng)
    assert bad.red_flags == ["too_small"]


def test_clopper_pearson_covers():
    lo, hi = clopper_pearson(50, 100, 0.05)
    assert lo < 0.5 < hi and lo == pytest.approx(0.398, abs=2e-3)
    assert clopper_pearson(0, 10, 0.05)[0] == 0.0


@pytest.mark.slow
def test_full_grid_has_no_order_violations_or_red_flags(tmp_path):
    """Every bound at every default grid point, and every audit point. (Its speed is measured
    by the job itself, not asserted here.) The labeling simulation and the plots prove nothing
    asserted here (the small grid above checks both), so they are skipped.

    The audits run at a tenth of the benchmark's trials (100k binary-RR trials, a tenth of
    REAL_AUDIT_REPORTS): what guards the claims at every audit point is the exact eps of the
    audited pair (from its law, no sampling, so no error rate at any trial count), which must
    lie below every claimed upper bound. The sampled lower bound (confidence 0.95, seeded) is
    kept below the exact one and below the claims; at these sizes it can still certify up to
    eps_lb_max >= 4.7 per audit, above every claim audited here (<= 2.9), so a claim that is
    wrong by that much is still flagged. The full-size audits are the benchmark's job."""
    # the tight-bound study: test_accounting_tight; the published numbers (the same for every
    # grid): the small grid above and test_amplification_published
    res = run_grid(str(tmp_path), sim_max_n=0, plots=False, audit_trials=100_000,
                   real_audit_scale=0.1, gap=False, published=False)
    assert res["order_violations"] == [] and res["red_flags"] == []
    assert len(res["audit"]) == 20
    for a in res["audit"]:
        ub = min(v for v in a["claimed_upper"].values() if v is not None)
        assert a["eps_lower_empirical"] <= a["eps_pair_exact"] <= ub, a
        assert a["eps_lb_max"] > ub, a

"""The anchors' published amplification numbers against the project's bounds (issue 39, item 5).

Same math -> same number (within the source's printed rounding / bisection bracket); every
published upper bound at or above our lower bound for the same randomizer; our tight bound at
or below every published upper bound (eps0 at or above every granted eps0); and the check
flags the Balle et al. Bennett numbers printed before their "Fixed typo in Bennett bounds".
"""
from __future__ import annotations

import json

import pytest

from benchmarks import amplification
from benchmarks import published_amplification as pub


@pytest.fixture(scope="module")
def results():
    return pub.compare()


def _current(results):
    return [r for r in results if r["status"] not in (pub.SUPERSEDED, pub.UNSOUND)]


def _upper_one_round(results):
    """Current single-round upper bounds on eps / eps0 (the rows the original checks cover)."""
    return [r for r in _current(results) if r["kind"] == "upper" and r["rounds"] == 1
            and r["quantity"] != "delta"]


def test_rows_are_cited_and_well_formed():
    for row in pub.ROWS:
        assert row.source in pub.SOURCES
        assert (row.eps0 is None) != (row.target_eps is None), row
        assert row.mechanism in ("generic", "krr", "collision", "bitrr")
        assert (row.k is not None) == (row.mechanism == "krr")
        assert (row.l is not None) == (row.mechanism == "collision")
        assert (row.d is not None) == (row.mechanism == "bitrr")
        assert row.value > 0 and (row.value_hi is None or row.value_hi > row.value)
        assert row.kind in ("upper", "lower") and row.origin in ("published", pub.COMPUTED)
        assert (row.status == pub.UNSOUND) == bool(row.witness)
        assert row.eps is None or row.eps0 is not None


def test_same_math_matches_the_published_number(results):
    same = [r for r in results if r["same_as"]]
    assert {r["same_as"] for r in same} == {"clones_numerical", "fmt_closed_form_final"}
    for r in same:
        assert r["same_math_match"], r
        if r["value_hi"] is None:           # a closed form printed to 16 digits
            assert r["ours_same_math"] == pytest.approx(r["value"], rel=1e-12)
        else:                               # inside the source's bisection bracket
            assert r["value"] <= r["ours_same_math"] <= r["value_hi"]


def test_published_upper_bounds_sit_above_our_lower_bound(results):
    assert pub.failures(results) == []
    for r in _upper_one_round(results):
        assert r["consistent"], r
        if r["quantity"] == "eps":
            assert max(r["value"], r["value_hi"] or 0) >= r["lower_bound"]
        else:
            assert r["lower_eps_at_published"] <= r["target_eps"] * (1 + pub.RTOL)
            assert r["value"] <= r["lower_bound"] * (1 + 1e-5)  # no sound bound grants past our lower's edge


def test_tight_bound_is_at_least_as_good_as_every_published_bound(results):
    """(Su et al.'s FFT upper bounds, computed here with their code, round to a grid and then
    clip and renormalise without an error bound: ours, certified, may sit up to 0.1% above:
    RAPPOR at n = 1e3, eps0 = 1 is 0.05% above.)"""
    for r in _upper_one_round(results):
        slack = 1e-3 if r["origin"] == pub.COMPUTED else 0.0
        if r["quantity"] == "eps":
            assert r["tight"] <= (r["value_hi"] or r["value"]) * (1 + slack), r
            assert r["lower_bound"] <= r["tight"]
        else:
            assert r["tight"] >= r["value"], r
            assert r["tight"] <= r["lower_bound"]


def test_check_flags_the_bennett_numbers_before_the_typo_fix(results):
    old = [r for r in results if r["status"] == pub.SUPERSEDED]
    flagged = {(r["label"], r["quantity"]) for r in old if not r["consistent"]}
    # (a stronger lower bound may flag more of them, never fewer)
    assert flagged >= {("Bennett, RR-2", "eps"), ("Bennett, RR-2", "eps0"),
                       ("Bennett, RR-100", "eps0")}
    # the fixed notebook's numbers for the same bounds pass
    fixed = {(r["label"], r["quantity"]): r for r in _current(results) if r["source"] == "BBGN19"}
    assert all(fixed[key]["consistent"] for key in flagged)
    assert all(r not in pub.failures(results) for r in old)


def test_published_mode_writes_the_table(results, tmp_path, capsys, monkeypatch):
    # the rows are the module's (compare() is deterministic; the tests above check them):
    # here the --published mode's files and console, without computing them a second time
    monkeypatch.setattr(pub, "compare", lambda: json.loads(json.dumps(results)))
    assert amplification.main(["--published", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "amplification-published.json").read_text())
    assert len(rows) == len(pub.ROWS)
    md = (tmp_path / "amplification-published.md").read_text()
    assert md.count("\n| ") == len(pub.ROWS) and "**no** (superseded)" in md
    assert "**no** (unsound" in md and "third value" in md
    assert "Bennett, RR-100" in capsys.readouterr().out


def test_speed_mode_times_each_randomizer_and_keeps_tight_above_lower():
    mechs = (("krr", {"k": 10}), ("collision", {"l": 56, "c": 1}))   # the fast ones at n = 1e6
    res = amplification.speed_study(ns=(10**6,), eps0s=(2.0,), repeats=3, mechs=mechs)
    assert [(r["mechanism"], r.get("k", r.get("l"))) for r in res["rows"]] == [("krr", 10),
                                                                             ("collision", 56)]
    for r in res["rows"]:
        assert sorted(r["seconds_all"])[1] == r["seconds"] and len(r["seconds_all"]) == 3
        assert sorted(r["cpu_seconds_all"])[1] == r["cpu_seconds"] >= 0
        assert r["tight"] >= r["lower_bound"] > 0 and r["ratio"] >= 1
        assert r["within_target"]                 # no target below n = 1e8
    assert len(res["load_avg_before"]) == 3 and res["cpus"] >= 1


def test_published_mode_with_an_unusable_out_folder_exits_2_with_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert amplification.main(["--published", "--out", str(blocker / "sub")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "writable folder" in err[0]


def test_the_anchors_rows_issue_50_are_there(results):
    """Koskela et al.'s committed reference values, rows computed with Su et al.'s and Wang et
    al.'s released code: cited, each with our tight and lower bound beside it."""
    by_source = {}
    for r in results:
        by_source.setdefault(r["source"], []).append(r)
    assert {"KHH-fig1", "KHH-fig4", "SCW25-code", "WANG24-code"} <= set(by_source)
    fig4 = [r for r in by_source["KHH-fig4"] if "weak" in r["label"]]
    assert sorted({r["rounds"] for r in fig4}) == [1, 4, 16] and len(fig4) == 15
    assert all("predates" in r["note"] for r in fig4)
    su = by_source["SCW25-code"]
    assert {r["mechanism"] for r in su} == {"krr", "collision", "bitrr"}
    assert all(r["origin"] == pub.COMPUTED for r in su + by_source["WANG24-code"])


def test_every_current_row_is_consistent_and_lower_bounds_sit_below_our_tight(results):
    for r in _current(results):
        assert r["consistent"], r
        if r["kind"] == "lower":                   # Su et al.'s FFT lower bounds
            assert r["value"] <= r["tight"]
        elif r["quantity"] == "delta":             # Koskela et al.'s delta(eps), generic
            assert r["lower_bound"] <= r["value"]
            assert r["tight"] <= r["value"] * 1.01  # the same clone math, composed as PLDs
        elif r["quantity"] == "eps":
            assert r["lower_bound"] <= max(r["value"], r["value_hi"] or 0)


def test_composed_rounds_match_koskela_weak_adversary_values(results):
    """4-RR, eps0 = ln 13, n = 1000: our composed tight bound within 0.1% of Koskela et al.'s
    (pre-fix) weak-adversary values at 1, 4 and 16 rounds, and below their strong-adversary and
    Feldman et al. 2023 values."""
    for r in results:
        if r["source"] != "KHH-fig4":
            continue
        if "weak" in r["label"]:
            assert r["tight"] == pytest.approx(r["value"], rel=1e-3)
        else:
            assert r["tight"] < r["value"]
        assert r["lower_bound"] <= r["tight"]


def test_wang_krr_rows_are_flagged_unsound_with_a_certified_witness(results):
    wang = [r for r in results if r["source"] == "WANG24-code"]
    assert len(wang) == 6
    for r in wang:
        assert r["status"] == pub.UNSOUND and not r["consistent"]
        assert r["lower_bound"] > r["value"]           # an explicit data set needs more
        assert r["witness_delta"] > r["delta"]         # certified (estimate minus error)
        assert r not in pub.failures(results)          # reported, not counted

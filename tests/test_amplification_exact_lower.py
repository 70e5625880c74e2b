"""The exact-lower-bound study of the amplification benchmark (issue 50, item 1)."""
from benchmarks import amplification


def test_exact_lower_study_rows_raise_the_count_pair_bound_below_tight(tmp_path, capsys):
    pts = (("bitrr", {"kr": 1, "d": 20}, 1000, 2.0), ("collision", {"l": None, "c": 1}, 2000, 1.0))
    rows = amplification.exact_lower_study(points=pts)
    assert [r["mechanism"] for r in rows] == ["bitrr", "collision"]
    for r in rows:
        assert r["count_pair_lower"] < r["lower_bound"] <= r["tight"]
        assert r["ratio"] < r["ratio_before"]
    table = amplification.format_exact_lower_table(rows)
    assert "before" in table and len(table.splitlines()) == 2 + len(rows)

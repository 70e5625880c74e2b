"""benchmarks.cost_bounds: the speed bounds moved out of the unit suite still run, print a
table and write JSON (their values are not asserted here: a shared machine makes them noisy)."""
import json

from benchmarks import cost_bounds


def test_quick_run_prints_every_bound_and_writes_json(tmp_path, capsys):
    path = tmp_path / "bounds.json"
    code = cost_bounds.main(["--quick", "--json", str(path)])
    res = json.loads(path.read_text())
    assert res["quick"] is True and code == (0 if res["ok"] else 1)
    names = [r["name"] for r in res["rows"]]
    assert sum(n.startswith("seal ") for n in names) == 2
    assert sum(n.startswith("partition ") for n in names) == 4
    for r in res["rows"]:
        assert r["value"] > 0 and r["bound"] in (cost_bounds.SEAL_BOUND, cost_bounds.PARTITION_BOUND_S)
        assert r["ok"] == (r["value"] <= r["bound"])
    table = capsys.readouterr().out
    assert all(n in table for n in names)

"""The multi-message noise benchmark (issue 20 item 5) reports what the accountant gives:
both laws meet the same (eps, delta) at the same DLap error, NB floods with fewer messages,
and the per-cell count does not depend on n or d while the per-client one goes as d / n."""
import pytest

from benchmarks import multi_message_noise as bench
from rknn_ray.accounting.multi_message import POISSON, protocol_eps

ROW = [(2.0, 1e-4, 1)]        # the cheapest row: a fraction of a second of calibration


def test_benchmark_row_matches_the_exact_accountant():
    (r,) = bench.measure(rows=ROW, n=6_000, s=50)
    p = r["dlap_p"]
    assert protocol_eps(p, r["mu"], 2, 1e-4, r["flood_shape"]) <= 2.0
    assert protocol_eps(p, r["poisson_mu"], 2, 1e-4, POISSON) <= 2.0
    assert r["per_cell"] == pytest.approx(2 * p / (1 - p) + 2 * r["mu"])
    assert r["per_cell"] < r["poisson_per_cell"] and r["ratio"] > 1
    assert r["per_client_after"] == pytest.approx(r["per_cell"] * r["d"] / r["m"])


def test_per_cell_count_is_independent_of_n_and_d():
    (a,) = bench.measure(rows=ROW, n=6_000, s=50)
    (b,) = bench.measure(rows=ROW, n=12_000, s=100)
    assert b["per_cell"] == pytest.approx(a["per_cell"])
    assert b["per_client_after"] == pytest.approx(a["per_client_after"])   # d/m unchanged
    (c,) = bench.measure(rows=ROW, n=12_000, s=50)
    assert c["per_client_after"] == pytest.approx(a["per_client_after"] / 2)


def test_benchmark_cli_prints_a_table(capsys, monkeypatch):
    monkeypatch.setattr(bench, "ROWS", ROW)
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 3 and "| 2 | 0.0001 | 1 |" in out

"""The scale benchmark's floor counts every primitive the protocol cannot skip (issue 20):
sealing and opening *and* the credential HMAC on both sides, each part reported."""
import pytest

from benchmarks import scale
from benchmarks.crypto_floor import PARTS, floor_parts


def test_floor_parts_cover_every_primitive_and_scale_with_messages():
    parts = floor_parts(400, 24, sample=200)
    assert tuple(parts) == PARTS
    assert {"client_mac_tag", "shuffler_mac_tag", "client_seal", "server_open"} <= set(parts)
    assert all(v > 0 for v in parts.values())
    assert floor_parts(0, 24) == {p: 0.0 for p in PARTS}


def test_scale_run_reports_the_floor_parts_it_sums():
    res = scale.run(3000, protocol="inprocess", batch=1000, floor_period=0.05)
    assert set(res["floor_parts"]) == set(PARTS)
    assert abs(res["crypto_floor_s"] - sum(res["floor_parts"].values())) < 1e-9
    assert res["messages"] == 3000 and sum(res["rejected"].values()) == 0
    # the memory sampler's own cost is reported beside the peak it measured
    assert res["peak_rss_mb"] > 0 and res["memory_sample_period_s"] == 5.0
    assert res["round_wall_s"] is None and res["round_ratio_to_floor"] is None   # actors only
    assert res["memory_sampler_cpu_s"] >= 0
    # the floor is the median of samples taken while the round ran (one before it, one at
    # its end, more every floor_period): it lies inside the range those samples spanned
    lo, hi = res["floor_spread_s"]
    assert res["floor_samples"] >= 2 and res["floor_sample_period_s"] == 0.05
    assert lo <= res["crypto_floor_s"] * (1 + 1e-9) and res["crypto_floor_s"] <= hi * (1 + 1e-9)
    assert res["floor_after_round_s"] > 0 and res["floor_sampler_cpu_s"] >= 0
    assert res["benchmark_own_cpu_s"] == pytest.approx(
        res["memory_sampler_cpu_s"] + res["floor_sampler_cpu_s"])


def test_floor_sampler_takes_each_parts_median_per_message():
    probe = scale.FloorSampler(24, probe=10)
    probe.samples = [{"a": 1.0, "b": 0.1}, {"a": 3.0, "b": 0.3}, {"a": 2.0, "b": 0.9}]
    assert probe.parts(1000) == {"a": 200.0, "b": 30.0}        # medians 2.0 and 0.3 per 10
    assert probe.spread(1000) == pytest.approx([110.0, 330.0])  # totals 1.1, 3.3, 2.9 per 10

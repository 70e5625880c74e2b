"""The scale benchmark's floor counts every primitive the protocol cannot skip (issue 20):
sealing and opening *and* the credential HMAC on both sides, each part reported."""
from benchmarks import scale
from benchmarks.crypto_floor import PARTS, floor_parts


def test_floor_parts_cover_every_primitive_and_scale_with_messages():
    parts = floor_parts(400, 24, sample=200)
    assert tuple(parts) == PARTS
    assert {"client_hmac_tag", "shuffler_hmac_tag", "client_seal", "server_open"} <= set(parts)
    assert all(v > 0 for v in parts.values())
    assert floor_parts(0, 24) == {p: 0.0 for p in PARTS}


def test_scale_run_reports_the_floor_parts_it_sums():
    res = scale.run(3000, protocol="inprocess", batch=1000)
    assert set(res["floor_parts"]) == set(PARTS)
    assert abs(res["crypto_floor_s"] - sum(res["floor_parts"].values())) < 1e-9
    assert res["messages"] == 3000 and sum(res["rejected"].values()) == 0
    # the memory sampler's own cost is reported beside the peak it measured
    assert res["peak_rss_mb"] > 0 and res["memory_sample_period_s"] == 2.0
    assert res["memory_sampler_cpu_s"] >= 0

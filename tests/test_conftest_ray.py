"""The test session's Ray start (conftest.start_local_ray) survives a slow raylet start."""
import types

import pytest

from tests.conftest import start_local_ray


def _fake_ray(failures):
    calls, shutdowns = [], []

    def init(**kwargs):
        calls.append(kwargs)
        if failures:
            raise failures.pop(0)
    return types.SimpleNamespace(init=init, shutdown=lambda: shutdowns.append(1)), calls, shutdowns


def test_a_startup_timeout_is_tried_again_after_a_shutdown():
    timeout = Exception("The current node timed out during startup. This could happen ...")
    ray, calls, shutdowns = _fake_ray([timeout, timeout])
    start_local_ray(ray)
    assert len(calls) == 3 and len(shutdowns) == 2
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 2


def test_other_errors_and_a_third_timeout_are_raised():
    ray, calls, _ = _fake_ray([ValueError("bad address")])
    with pytest.raises(ValueError, match="bad address"):
        start_local_ray(ray)
    assert len(calls) == 1
    timeouts = [Exception("node timed out during startup")] * 3
    ray, calls, _ = _fake_ray(list(timeouts))
    with pytest.raises(Exception, match="timed out during startup"):
        start_local_ray(ray)
    assert len(calls) == 3

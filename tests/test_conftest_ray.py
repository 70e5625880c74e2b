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


def test_a_process_started_later_joins_the_session_instance(ray_session, monkeypatch):
    """What ray.init set while the instance started (its token mode) stays for the processes
    the tests start later: restoring the whole environment after it locked every job out."""
    import os
    import subprocess
    import sys
    monkeypatch.setenv("RAY_ADDRESS", ray_session.get_runtime_context().gcs_address)
    code = "import ray; ray.init(); print(int(ray.cluster_resources()['CPU']))"
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ), timeout=120)
    assert got.returncode == 0 and got.stdout.split()[-1] == "2", got.stderr[-2000:]


def test_variables_set_while_puts_back_only_its_own(monkeypatch):
    import os

    from rknn_ray.job.ray_env import variables_set_while
    monkeypatch.setenv("RKNN_T_KEPT", "before")
    monkeypatch.delenv("RKNN_T_NEW", raising=False)
    monkeypatch.delenv("RKNN_T_SET_INSIDE", raising=False)
    with variables_set_while(RKNN_T_KEPT="during", RKNN_T_NEW="1"):
        assert os.environ["RKNN_T_KEPT"] == "during" and os.environ["RKNN_T_NEW"] == "1"
        os.environ["RKNN_T_SET_INSIDE"] = "x"       # as ray.init sets RAY_AUTH_MODE
    assert os.environ["RKNN_T_KEPT"] == "before" and "RKNN_T_NEW" not in os.environ
    assert os.environ.pop("RKNN_T_SET_INSIDE") == "x"

"""Shared fixtures: one session-scoped local Ray instance (num_cpus=2, loopback)."""
import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def isolated_privacy_ledger(tmp_path, monkeypatch):
    """Every test gets its own persistent privacy ledger (never the user's)."""
    path = tmp_path / "privacy-ledger.sqlite"
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(path))
    return path


@pytest.fixture(scope="session")
def ray_session():
    import ray
    from rknn_ray.job.ray_env import quiet_ray_logs
    quiet_ray_logs()
    started = False
    if not ray.is_initialized():
        # address="local": always a fresh instance of our own, never a cluster that a
        # `ray start` (the multi-node tests, another user) left running on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def digits():
    """sklearn's real 8x8 digits as (N, 1, 8, 8) in [0, 1], split 1200 train / 597 test."""
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    p = np.random.default_rng(0).permutation(len(y))
    return x[p[:1200]], y[p[:1200]], x[p[1200:]], y[p[1200:]]

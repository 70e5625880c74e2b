"""Shared fixtures: one session-scoped local Ray instance (num_cpus=2, loopback)."""
import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def ray_session():
    import ray
    from jobs.ray_env import quiet_ray_logs
    quiet_ray_logs()
    started = False
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        started = True
    yield ray
    if started:
        ray.shutdown()

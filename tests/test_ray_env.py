"""A job's local Ray names itself to its workers: with a second Ray instance on the machine,
Ray Train's PlacementGroupCleaner (State API lookups without an address) must still find its
own cluster instead of dying on "Found multiple active Ray instances" (a CI failure)."""
import os
import subprocess
import sys

CHILD = """
import ray
from rknn_ray.job.ray_env import ensure_ray
ensure_ray(num_cpus=1)

@ray.remote(num_cpus=0)
def resolve():
    from ray._private.services import canonicalize_bootstrap_address_or_die
    return canonicalize_bootstrap_address_or_die(None)

print("OWN", ray.get_runtime_context().gcs_address)
print("RESOLVED", ray.get(resolve.remote()))
"""


def test_workers_resolve_their_own_cluster_beside_another_instance(ray_session):
    assert ray_session.is_initialized()          # the other instance: this test session's
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = os.getcwd()
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["RESOLVED"] == lines["OWN"]
    assert lines["OWN"] != ray_session.get_runtime_context().gcs_address

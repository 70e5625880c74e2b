"""The cluster path, proven: a separate local head started with `ray start --head` (loopback,
token authentication on, as Ray 2.5x+ clusters run), `ray job submit --working-dir .` of the
main job with the token, the run folder checked, a request without the token refused, the
head stopped (by its own process group: never `ray stop`, which would end every Ray on the
machine). Also: cluster.yaml passes Ray's own cluster-config validation."""
import secrets
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _free_ports(count: int) -> list[int]:
    socks, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _ray_cli() -> str:
    exe = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))
    if not os.path.exists(exe):
        pytest.fail("the `ray` CLI is not installed: pip install 'ray[default]'")
    return exe


@pytest.fixture
def local_head():
    """A Ray head of its own on 127.0.0.1 with token authentication (a fresh token)."""
    ray = _ray_cli()
    gcs, dash, agent, client, metrics, rt_agent, agent_grpc = _free_ports(7)
    temp_dir = tempfile.mkdtemp(prefix="rkh", dir="/tmp")       # short: unix socket path limits
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}    # SIGTERM stops it now, not in 30 s
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    proc = subprocess.Popen(
        [ray, "start", "--head", "--block", f"--port={gcs}", "--num-cpus=2",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
         f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
         f"--ray-client-server-port={client}", f"--metrics-export-port={metrics}",
         f"--runtime-env-agent-port={rt_agent}", f"--temp-dir={temp_dir}",
         "--disable-usage-stats"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    address = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{address}/api/version", timeout=2).read()
                break
            except urllib.error.HTTPError:      # up, and refusing us without the token
                break
            except OSError:
                if proc.poll() is not None:
                    pytest.fail(f"ray start --head exited: {proc.stderr.read().decode()[-2000:]}")
                if time.monotonic() > deadline:
                    pytest.fail("the local Ray head did not come up within 120 s")
                time.sleep(1)
        yield address, env
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        left = subprocess.run(["pgrep", "-f", temp_dir], capture_output=True, text=True).stdout.split()
        for pid in left:
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_the_main_job_on_a_local_cluster(local_head, tmp_path):
    address, env = local_head
    out = tmp_path / "cluster-run"
    sub_id = f"rknn-test-{os.getpid()}-{int(time.time())}"
    cmd = [_ray_cli(), "job", "submit", "--address", address, "--submission-id", sub_id,
           "--working-dir", str(ROOT), "--no-wait", "--",
           "python", "-m", "jobs.distill", "--config", "jobs/configs/digits_central.yaml",
           "--out", str(out), "--quiet", "--set", "student.epochs=1",
           "--set", "student.num_workers=1", "--set", "queries.restarts=1"]
    no_token = {k: v for k, v in env.items() if k != "RAY_AUTH_TOKEN"}
    refused = subprocess.run([*cmd[:4], "--submission-id", sub_id + "-x", "--no-wait", "--",
                              "true"], cwd=ROOT, env={**no_token, "RAY_AUTH_TOKEN": "0" * 64},
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0                   # token auth is really on
    submitted = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert submitted.returncode == 0, submitted.stderr[-3000:]

    def ray_job(*args):                              # the CLI logs its answer on stderr
        done = subprocess.run([_ray_cli(), "job", *args, "--address", address, sub_id], env=env,
                              capture_output=True, text=True, timeout=60)
        return (done.stdout + done.stderr).lower()    # "Job '...' succeeded"
    deadline = time.monotonic() + 420
    while not any(word in (status := ray_job("status")) for word in ("succeeded", "failed",
                                                                     "stopped")):
        assert time.monotonic() < deadline, "the submitted job did not finish in 7 minutes"
        time.sleep(2)
    logs = ray_job("logs")
    assert "succeeded" in status, logs[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["privacy"]["model"] == "central" and report["counts"]["clients"] == 100
    assert 0 <= report["accuracy"]["student"] <= 1
    assert (out / "labels.parquet").stat().st_size > 0
    assert f"run folder: {out}".lower() in logs


def test_cluster_yaml_passes_rays_own_validation():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    validate_config(prepare_config(config))       # Ray's schema; raises on a violation
    broken = {**config, "max_workers": "lots"}    # ...and the check has teeth
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))
    setup = " ".join(config["setup_commands"])
    assert "pip install" in setup and "rknn-ray" in setup
    assert config["file_mounts"]["/home/ubuntu/rknn-ray"] == "."

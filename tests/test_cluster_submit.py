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


def _jobs_api(address: str, token: str) -> int:
    """HTTP status of the head's job list for a request carrying ``token``."""
    request = urllib.request.Request(f"{address}/api/jobs/",
                                     headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status
    except urllib.error.HTTPError as err:
        return err.code


def test_ray_job_submit_runs_the_main_job_on_a_local_cluster(local_head, tmp_path):
    address, env = local_head
    # token auth is really on: the jobs API refuses a wrong token and answers the right one
    # (asked over HTTP: a refused `ray job submit` costs a CLI start-up and proves no more)
    assert _jobs_api(address, "0" * 64) in (401, 403)
    assert _jobs_api(address, env["RAY_AUTH_TOKEN"]) == 200
    out = tmp_path / "cluster-run"
    sub_id = f"rknn-test-{os.getpid()}-{int(time.time())}"
    # without --no-wait the CLI tails the job's logs until it ends and exits 1 if it failed:
    # one CLI process, not a `ray job status` start-up every few seconds beside the job
    cmd = [_ray_cli(), "job", "submit", "--address", address, "--submission-id", sub_id,
           "--working-dir", str(ROOT), "--",
           "python", "-m", "jobs.distill", "--config", "jobs/configs/digits_central.yaml",
           "--out", str(out), "--quiet", "--set", "student.epochs=1",
           "--set", "student.num_workers=1", "--set", "queries.restarts=1"]
    submitted = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    said = (submitted.stdout + submitted.stderr).lower()   # the CLI logs the status on stderr
    assert submitted.returncode == 0 and f"job '{sub_id}' succeeded" in said, said[-4000:]
    report = json.loads((out / "report.json").read_text())
    assert report["privacy"]["model"] == "central" and report["counts"]["clients"] == 100
    assert report["student"]["trainer"] == "ray"     # Ray Train on a joined cluster
    assert 0 <= report["accuracy"]["student"] <= 1
    assert (out / "labels.parquet").stat().st_size > 0
    assert f"run folder: {out}".lower() in said      # the job's own stdout, tailed


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
    # what each node type runs, resolved as Ray's autoscaler does (a type's own
    # worker_setup_commands replace the merged global ones): only GPU types get [gpu]
    prepared = prepare_config(config)
    for name, node_type in prepared["available_node_types"].items():
        if name == prepared["head_node_type"]:
            commands = prepared["head_setup_commands"]
        else:
            commands = node_type.get("worker_setup_commands", prepared["worker_setup_commands"])
        installs = [c for c in commands if "pip install -e" in c]
        gpu_node = node_type["node_config"]["InstanceType"].startswith(("g", "p"))
        assert len(installs) == 1 and ("[gpu]" in installs[0]) == gpu_node, (name, commands)
    assert any(t["node_config"]["InstanceType"].startswith("g")
               for t in config["available_node_types"].values())


def test_ray_job_submit_to_the_one_machine_cluster_of_jobs_local_cluster(tmp_path):
    """The README's submit recipe on one machine: jobs.local_cluster starts real nodes with a
    loopback dashboard (the Jobs API) and runs `ray job submit` against them; the job's
    parties land on the nodes its placement names."""
    out = tmp_path / "local-cluster-run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_ADDRESS")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    cmd = [sys.executable, "-m", "jobs.local_cluster", "--node", "server+shuffler",
           "--node", "client", "--cpus", "2", "--",
           _ray_cli(), "job", "submit", "--working-dir", str(ROOT), "--",
           "python", "-m", "jobs.distill", "--config", "jobs/configs/digits_central.yaml",
           "--out", str(out), "--quiet", "--set", "student.epochs=1",
           # the student in the driver: Ray Train on a joined cluster is the test above's
           "--set", "student.trainer=local", "--set", "queries.restarts=1",
           "--set", "cluster.placement.client={resources: {client: 1}}",
           "--set", "cluster.placement.server={resources: {server: 1}}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-4000:]
    assert "dashboard and Jobs API: http://127.0.0.1:" in said
    assert "succeeded" in said.lower()
    report = json.loads((out / "report.json").read_text())
    assert report["privacy"]["model"] == "central" and 0 <= report["accuracy"]["student"] <= 1
    assert report["student"]["trainer"] == "local"


def test_local_cluster_refuses_a_missing_command_and_a_command_with_serve(capsys):
    from jobs.local_cluster import _submits_a_job, main
    for argv in ([], ["--serve", "--", "true"]):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    said = capsys.readouterr().err
    assert "or --serve" in said and "give it no command" in said
    assert _submits_a_job(["/usr/bin/ray", "job", "submit"]) and not _submits_a_job(["ray", "up"])

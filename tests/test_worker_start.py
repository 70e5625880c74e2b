"""actors/worker_start.py: a Ray worker started without importing Ray twice, and everything
but a plain Python worker handed to Ray's own setup_worker.py unchanged."""
import json
import os
import subprocess
import sys

import pytest

from actors import worker_start

SCRIPT = worker_start.__file__
PROBE = ("import os, sys; print(os.environ.get('X'), os.environ.get('Y'), "
         "os.environ.get('RKNN_RAY_WORKER_START'), 'ray' in sys.modules)")


def run_launcher(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("X", "Y", worker_start.MARK)}
    env["HOME_FOR_TEST"] = "/h"
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize("argv", [
    ["default_worker.py", "--a=1", "--language=PYTHON", "--serialized-runtime-env-context={}"],
    ["default_worker.py", "--language", "PYTHON", "--b", "--serialized-runtime-env-context",
     '{"env_vars": {"K": "v"}}', "--c=3"],
    ["-S", "default_worker.py", "--runtime-env-hash=0", "--language=PYTHON"],
    ["default_worker.py", "--language=PYTHON", "--language=JAVA"],
    ["default_worker.py"],
])
def test_arguments_split_as_ray_s_setup_worker_reads_them(argv):
    from ray._private.workers.setup_worker import parser     # the parser Ray's script uses
    args, rest = parser.parse_known_args(argv)
    assert worker_start.split_args(argv) == (args.serialized_runtime_env_context, args.language,
                                             rest)


def test_variables_expand_as_ray_s_update_envs(monkeypatch):
    from ray._private.utils import update_envs
    monkeypatch.setenv("HOME_FOR_TEST", "/h")
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    env_vars = {"A": "${HOME_FOR_TEST}/x", "B": "$HOME_FOR_TEST:y", "C": "a${NOT_SET_ANYWHERE}b",
                "D": "plain", "E": ""}
    update_envs(env_vars)
    theirs = {k: os.environ[k] for k in env_vars}
    for k in env_vars:
        monkeypatch.delenv(k)
    worker_start.apply_env(env_vars)
    assert {k: os.environ[k] for k in env_vars} == theirs
    for k in env_vars:
        monkeypatch.delenv(k)


@pytest.mark.parametrize("context,language", [
    ({"command_prefix": ["source", "activate", "env"]}, "PYTHON"),
    ({"py_executable": "/usr/bin/python3 -X dev"}, "PYTHON"),
    ({"override_worker_entrypoint": "/elsewhere/default_worker.py"}, "PYTHON"),
    ({"java_jars": ["a.jar"]}, "PYTHON"),
    ({"a_field_ray_added_later": 1}, "PYTHON"),
    ({"env_vars": {"X": 1}}, "PYTHON"),
    ({}, "JAVA"),
    ({}, "CPP"),
    ({}, None),
])
def test_anything_but_a_plain_python_worker_is_left_to_ray(context, language):
    assert worker_start.plain_context(json.dumps(context), language) is None


def test_a_context_it_cannot_read_is_left_to_ray():
    assert worker_start.plain_context("{not json", "PYTHON") is None
    assert worker_start.plain_context("[1, 2]", "PYTHON") is None


def test_a_plain_worker_starts_with_its_variables_and_without_ray_loaded():
    context = {"command_prefix": [], "env_vars": {"X": "${HOME_FOR_TEST}/a", "Y": "b"},
               "py_executable": sys.executable, "override_worker_entrypoint": None,
               "java_jars": []}
    done = run_launcher("-c", PROBE, "--language=PYTHON",
                        f"--serialized-runtime-env-context={json.dumps(context)}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["/h/a", "b", "1", "False"]


def test_a_worker_without_runtime_env_starts_the_same_way():
    done = run_launcher("-c", PROBE, "--runtime-env-hash=0", "--language=PYTHON")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["None", "None", "1", "False"]


def test_a_command_prefix_goes_through_ray_s_own_script():
    """Ray's setup_worker.py runs ``bash -c "<prefix> exec <python> <args>"``: with ``echo`` as
    the prefix, the line it prints proves Ray's script ran, with the worker's args intact."""
    context = {"command_prefix": ["echo", "RAY-SETUP"], "env_vars": {"X": "1"}}
    done = run_launcher("-c", "pass", "--language=PYTHON",
                        f"--serialized-runtime-env-context={json.dumps(context)}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["RAY-SETUP", "exec", sys.executable, "-c", "pass"]


def test_workers_of_a_job_s_own_instance_start_through_it(ray_session):
    """A job's own local instance (ensure_ray) beside another one (this session's), so its
    workers carry the job's runtime env: an actor and a task see the launcher's mark and the
    runtime env's variables (the setup hook ran: RAY_ADDRESS pinned), and Ray's constant is
    restored after."""
    code = """
import os, ray
from rknn_ray.job.ray_env import ensure_ray
assert ensure_ray(1, log_to_driver=False)
@ray.remote
class A:
    def seen(self):
        return os.environ.get("RKNN_RAY_WORKER_START"), os.environ.get("RAY_ADDRESS") is not None
@ray.remote
def seen():
    return os.environ.get("RKNN_RAY_WORKER_START")
print("SEEN", ray.get(A.remote().seen.remote()), ray.get(seen.remote()))
from ray._private import ray_constants
print("RESTORED", ray_constants.SETUP_WORKER_FILENAME)
ray.shutdown()
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env)
    assert "SEEN ('1', True) 1" in done.stdout, done.stdout + done.stderr[-3000:]
    assert "RESTORED setup_worker.py" in done.stdout

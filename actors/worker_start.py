"""Starts a Ray worker process without importing Ray twice.

Ray's raylet starts every worker as ``python setup_worker.py <worker args>``: that script
imports all of Ray (~0.75 CPU s) only to apply the runtime env's variables and exec
``default_worker.py``, which imports Ray again. A local instance this project starts
(rknn_ray.job.ray_env.ensure_ray, the test session) names this file instead, which does the
same for a plain Python worker with the standard library alone. Anything else (a container
or conda/venv command prefix, another interpreter, an entrypoint override, a Java or C++
worker, a context it cannot read) goes to Ray's own setup_worker.py, unchanged.

Run as a script by the raylet: it imports nothing of Ray or of this project.
"""
import json
import os
import re
import sys

CONTEXT = "--serialized-runtime-env-context"
LANGUAGE = "--language"
#: what a plain context holds (ray._private.runtime_env.context.RuntimeEnvContext's fields)
#: set in a worker this launcher started (which launcher started a worker is otherwise
#: invisible once it runs)
MARK = "RKNN_RAY_WORKER_START"
KNOWN_FIELDS = {"command_prefix", "env_vars", "py_executable", "override_worker_entrypoint",
                "java_jars"}


def split_args(argv: list[str]) -> tuple[str | None, str | None, list[str]]:
    """(serialized context, language, the worker's own args) as Ray's setup_worker.py reads
    them (argparse's parse_known_args: ``--opt=value`` or ``--opt value``, anywhere)."""
    found: dict[str, str | None] = {CONTEXT: None, LANGUAGE: None}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        if name in found and eq:
            found[name] = value
        elif arg in found and i + 1 < len(argv):
            found[arg] = argv[i + 1]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return found[CONTEXT], found[LANGUAGE], rest


def plain_context(serialized: str | None, language: str | None) -> dict | None:
    """The context's env vars when this launcher may start the worker itself, else None."""
    if language != "PYTHON":
        return None
    try:
        context = json.loads(serialized or "{}")
    except ValueError:
        return None
    if not isinstance(context, dict) or set(context) - KNOWN_FIELDS:
        return None
    if context.get("command_prefix") or context.get("java_jars") \
            or context.get("override_worker_entrypoint"):
        return None
    if context.get("py_executable") not in (None, sys.executable):
        return None
    env_vars = context.get("env_vars") or {}
    if not isinstance(env_vars, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env_vars.items()):
        return None
    return env_vars


def apply_env(env_vars: dict) -> None:
    """As Ray's update_envs: ``${X}`` and ``$X`` expand from this environment, unknown
    ``${X}`` become empty."""
    for key, value in env_vars.items():
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))


def ray_setup_worker() -> str:
    """Ray's own setup_worker.py, found without importing Ray."""
    from importlib.util import find_spec
    spec = find_spec("ray")
    return os.path.join(os.path.dirname(spec.origin), "_private", "workers", "setup_worker.py")


def main(argv: list[str]) -> None:
    serialized, language, rest = split_args(argv)
    env_vars = plain_context(serialized, language)
    if env_vars is None or not rest:
        os.execv(sys.executable, [sys.executable, ray_setup_worker(), *argv])
    apply_env(env_vars)
    os.environ[MARK] = "1"
    os.execv(sys.executable, [sys.executable, *rest])


if __name__ == "__main__":
    main(sys.argv[1:])

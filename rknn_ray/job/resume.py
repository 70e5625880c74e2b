"""Which run folder a ``--resume`` may finish, and with which config.

A resumed run finishes a saved release (labels, student, report) with the run folder's own
config.yaml. Overrides may change only what comes after the release: the labels are
post-processing of the released counts and the student is trained on them. Everything else
decides what was released, and report.json must agree with release.npz.
"""
from __future__ import annotations

import os

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.runio import RELEASE_FILE, RUN_MARKER, unfinished_release

#: the config keys (prefixes) that ``--resume RUN --set key=value`` may change
RESUME_MAY_CHANGE = ("student.", "labels.", "cluster.", "run.progress")


def resume_config(run_dir: str, overrides=()):
    """The config to finish ``run_dir`` with: its config.yaml plus ``overrides``, refused
    when the folder has no release to finish, is already complete (a report.json of that
    release: a malformed one finishes nothing), or an override would change what the saved
    release means."""
    if not os.path.isfile(os.path.join(run_dir, RELEASE_FILE)):
        raise ConfigError("--resume", f"{run_dir} has no {RELEASE_FILE}",
                          "resume a run folder whose private round finished")
    if not unfinished_release(run_dir):         # its own report.json finished it
        raise ConfigError("--resume", f"{run_dir} is already complete ({RUN_MARKER})",
                          "nothing to resume; start a new run instead")
    path = os.path.join(run_dir, "config.yaml")
    saved, cfg = load_config(path), load_config(path, list(overrides))
    check_resume_overrides(saved, cfg)
    return cfg


def check_resume_overrides(saved, cfg) -> None:
    """Refuse overrides that would change the meaning of a finished release."""
    before, after = _leaves(saved.to_dict()), _leaves(cfg.to_dict())
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    refused = [k for k in changed if not k.startswith(RESUME_MAY_CHANGE)]
    if refused:
        raise ConfigError("--resume", f"--set {', '.join(refused)} would change what the saved "
                          "release means (it was released with the run folder's config.yaml)",
                          "resume changes only student.*, labels.*, cluster.* and run.progress; "
                          "start a new run (a new release, new budget) for anything else")


def _leaves(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} for every leaf of a nested config dict."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out

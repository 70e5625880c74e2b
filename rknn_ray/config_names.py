"""The configs that ship with the package (``jobs/configs/*.yaml``, package data of ``jobs``),
found by name: ``rknn-ray run --config digits_central`` and ``rknn_ray.run("digits_central")``
both work from any folder after a plain install. Located through the ``jobs`` package's
spec, without importing it (the library sits below the entrypoints: tests/test_layers.py).
"""
from __future__ import annotations

import difflib
import importlib.util
import os

from rknn_ray.errors import ConfigError

__all__ = ["config_dir", "packaged_configs", "resolve_config"]


def config_dir() -> str:
    """The folder of the packaged configs (``jobs/configs``)."""
    spec = importlib.util.find_spec("jobs")
    if spec is None or not spec.submodule_search_locations:
        return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))), "jobs", "configs")
    return os.path.join(list(spec.submodule_search_locations)[0], "configs")


def packaged_configs() -> dict[str, str]:
    """``name -> path`` of every packaged config, sorted by name."""
    folder = config_dir()
    names = sorted(f[:-len(".yaml")] for f in os.listdir(folder) if f.endswith(".yaml")) \
        if os.path.isdir(folder) else []
    return {name: os.path.join(folder, f"{name}.yaml") for name in names}


def resolve_config(value, key: str = "--config"):
    """The file ``value`` means: an existing file (or any path) as given, else the packaged
    config of that name (``digits_central`` or ``digits_central.yaml``). A bare name that
    matches none is refused with the nearest names."""
    value = os.fspath(value)
    if os.path.exists(value) or os.sep in value or (os.altsep and os.altsep in value):
        return value                    # a path: load_config says what is wrong with it
    name = value[:-len(".yaml")] if value.endswith(".yaml") else value
    known = packaged_configs()
    if name in known:
        return known[name]
    near = difflib.get_close_matches(name, list(known), n=3)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise ConfigError(key, f"{value!r} is neither a file nor a packaged config",
                      f"{hint}rknn-ray run --list-configs lists the packaged ones; "
                      "or pass a path to a YAML file")

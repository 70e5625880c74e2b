"""The configs that ship with the package (jobs/configs/*.yaml), found by name.

``--config digits_central`` works from any folder after a plain install: a value that is not
an existing file and names no folder is looked up among the packaged configs (with or
without ``.yaml``). ``rknn-ray run --list-configs`` prints each with the first sentence of
its opening comment.
"""
from __future__ import annotations

import difflib
import os
import re

from rknn_ray.errors import ConfigError

__all__ = ["CONFIG_DIR", "describe", "list_configs", "packaged_configs", "resolve_config"]

#: where the packaged configs live (package data of ``jobs``)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
#: a description longer than this is cut at a word (one line per config)
LONGEST = 100


def packaged_configs() -> dict[str, str]:
    """``name -> path`` of every packaged config, sorted by name."""
    names = sorted(f[:-len(".yaml")] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
    return {name: os.path.join(CONFIG_DIR, f"{name}.yaml") for name in names}


def resolve_config(value: str) -> str:
    """The file ``--config value`` means: an existing file as given, else the packaged config
    of that name (``digits_central`` or ``digits_central.yaml``). A bare name that matches
    none is refused with the nearest names."""
    if os.path.exists(value) or os.sep in value or (os.altsep and os.altsep in value):
        return value                    # a path: load_config says what is wrong with it
    name = value[:-len(".yaml")] if value.endswith(".yaml") else value
    known = packaged_configs()
    if name in known:
        return known[name]
    near = difflib.get_close_matches(name, list(known), n=3)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    raise ConfigError("--config", f"{value!r} is neither a file nor a packaged config",
                      f"{hint}rknn-ray run --list-configs lists the packaged ones; "
                      "or pass a path to a YAML file")


def describe(path: str) -> str:
    """The first sentence of a config's opening comment block ('' without one)."""
    lines = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").strip())
    text = " ".join(part for part in lines if part)
    match = re.match(r"(.+?[.;])(\s|$)", text)
    text = match.group(1) if match else text
    return text if len(text) <= LONGEST else text[:LONGEST].rsplit(" ", 1)[0] + " ..."


def list_configs() -> str:
    """One line per packaged config: its name and description."""
    configs = packaged_configs()
    width = max(map(len, configs))
    return "\n".join(f"{name:<{width}}  {describe(path)}" for name, path in configs.items())

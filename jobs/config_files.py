"""The configs that ship with the package (jobs/configs/*.yaml), found by name.

``--config digits_central`` works from any folder after a plain install: a value that is not
an existing file and names no folder is looked up among the packaged configs (with or
without ``.yaml``). ``rknn-ray run --list-configs`` prints each with the first sentence of
its opening comment.
"""
from __future__ import annotations

import re

from rknn_ray.config_names import config_dir, packaged_configs, resolve_config

__all__ = ["CONFIG_DIR", "describe", "list_configs", "packaged_configs", "resolve_config"]

#: where the packaged configs live (package data of ``jobs``)
CONFIG_DIR = config_dir()
#: a description longer than this is cut at a word (one line per config)
LONGEST = 100


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

"""``rknn_ray.run(config, private=None, public=None, evaluation=None, out_dir=None, **overrides)``:
one job from Python (a notebook), the user's data given as files in the config or in memory.

``config``: a YAML path, a packaged config's name, a dict or a Config; ``ledger``: the
persistent ledger file (else $RKNN_RAY_LEDGER or the default); ``overrides``: sections to change, e.g.
``privacy={"eps": 0.5}``. ``private`` / ``public`` / ``evaluation``: pandas DataFrames, Arrow
tables or dicts of column -> numpy array (2-D: one list column), with the columns
``data.<part>`` names (they take the place of that part's path; data.dataset becomes table).
Private rows given in memory are in the driver already: it scans them, deals each shard its
own rows (one object per shard) and drops its references once the shards hold them; the
driver is then trusted with them for that time (docs/running.md, "Your own data").
"""
from __future__ import annotations

import copy
import os
import time

from rknn_ray.config import Config, _read_yaml
from rknn_ray.config_names import resolve_config

from rknn_ray.job.runner import run as run_job

from rknn_ray.runio import prepare_run_dir


def _config(config, overrides: dict, in_memory: bool):
    if isinstance(config, Config):
        base = config.to_dict()
    elif isinstance(config, dict):
        base = copy.deepcopy(config)
    else:           # a YAML file, or a packaged config by name ("digits_central")
        base = _read_yaml(resolve_config(config, key="config"))
    for section, values in overrides.items():
        if isinstance(values, dict) and isinstance(base.get(section), dict):
            base[section] = {**base[section], **values}
        else:
            base[section] = values
    if in_memory:
        base.setdefault("data", {})["dataset"] = "table"
    return Config.from_dict(base)


def run(config, private=None, public=None, evaluation=None, out_dir: str | None = None,
        ledger: str | None = None, **overrides):
    """Run one job; returns rknn_ray.job.RunResult (report, labels, guarantee, ledger, paths).
    ``config``: a YAML path, a packaged config's name (``"digits_central"``: from any folder),
    a dict or a Config. ``out_dir``: the run folder (default runs/<run.name>-<time>).
    ``ledger``: the persistent ledger file (default $RKNN_RAY_LEDGER, else
    ~/.local/share/rknn-ray/ledger.sqlite; the CLI's --ledger)."""
    inputs = {"private": private, "public": public, "evaluation": evaluation}
    cfg = _config(config, overrides, any(v is not None for v in inputs.values()))
    out = out_dir or os.path.join("runs", f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out = prepare_run_dir(out)
    return run_job(cfg, out, inputs=inputs,
                   ledger_path=os.fspath(ledger) if ledger is not None else None)

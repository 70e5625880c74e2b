"""Run configuration: YAML file + ``--set dotted.key=value`` overrides, validated
up front so a bad value fails in milliseconds, before data loads or Ray starts.

The defaults below are the single source of truth for every key; a key that is
not here is a typo and is rejected with the closest known key.
"""
from __future__ import annotations

import copy
import difflib
import os

import yaml

from rknn_ray.errors import ConfigError

DEFAULTS: dict = {
    "run": {"name": "run", "seed": 0, "rng": "secure", "progress": True},
    "data": {"dataset": "digits", "data_root": None, "split": "paper", "clients": 100,
             "partition": "iid", "alpha": 0.5, "synthetic": {}},
    "represent": {"encoder": "pca", "dim": 32, "whiten": False},
    "queries": {"s": 100, "restarts": 3, "niter": 25, "use_nearest_public": False},
    "rknn": {"k": 1, "r": 1},
    "privacy": {"model": "central", "mechanism": "laplace", "eps": 1.0, "delta": 0.0,
                "noise": "discrete", "multi_record": "sample", "options": {},
                "budget_eps": None, "budget_delta": None, "accountant": "basic",
                "amplification_bound": "clones_numerical"},
    "shuffle": {"min_senders": None, "onion_layers": 0, "dropout": 0.0},
    "labels": {"type": "hard", "train_on": "public"},
    "student": {"epochs": 30, "batch_size": 64, "lr": 0.001, "weight_decay": 0.0,
                "num_workers": 2, "use_gpu": None, "arch": "auto", "augment": "none"},
    "cluster": {"shards": 2, "batch_clients": 20000, "shard_cpus": 0.5},
}

MODELS = ("central", "local", "shuffle")
RNG_KINDS = ("secure", "seeded")
PARTITIONS = ("iid", "dirichlet", "one_per_client")
LABEL_TYPES = ("hard", "soft")
FREE_FORM = {("privacy", "options"), ("data", "synthetic")}


def _flat_keys(d: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        keys.append(path)
        if isinstance(v, dict) and tuple(path.split(".")) not in FREE_FORM:
            keys.extend(_flat_keys(v, path + "."))
    return keys


def _merge(base: dict, extra: dict, prefix: str = "") -> dict:
    out = copy.deepcopy(base)
    known = _flat_keys(DEFAULTS)
    for k, v in (extra or {}).items():
        path = f"{prefix}{k}"
        if path not in known:
            near = difflib.get_close_matches(path, known, n=1)
            hint = f"did you mean '{near[0]}'?" if near else "see jobs/configs/*.yaml for the keys"
            raise ConfigError(path, "unknown key", hint)
        if isinstance(out.get(k), dict) and tuple(path.split(".")) not in FREE_FORM:
            if not isinstance(v, dict):
                raise ConfigError(path, f"expected a mapping, got {v!r}", f"write {path}.<key>: value")
            out[k] = _merge(out[k], v, path + ".")
        else:
            out[k] = v
    return out


def parse_override(text: str) -> dict:
    """'a.b.c=value' -> {'a': {'b': {'c': value}}} (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(text, "override is not key=value", "write --set privacy.eps=0.5")
    key, raw = text.split("=", 1)
    value = yaml.safe_load(raw) if raw.strip() else None
    out: dict = {}
    cur = out
    parts = key.strip().split(".")
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None) -> dict:
    """Defaults <- YAML file <- overrides, then validated."""
    cfg = copy.deepcopy(DEFAULTS)
    if path:
        if not os.path.isfile(path):
            raise ConfigError("--config", f"file {path!r} not found",
                              "pass a path to a YAML file, e.g. jobs/configs/digits_central.yaml")
        with open(path) as fh:
            try:
                loaded = yaml.safe_load(fh) or {}
            except yaml.YAMLError as exc:
                raise ConfigError("--config", f"{path} is not valid YAML ({exc})",
                                  "fix the YAML syntax") from exc
        if not isinstance(loaded, dict):
            raise ConfigError("--config", f"{path} must hold a mapping", "see jobs/configs/")
        cfg = _merge(cfg, loaded)
    for text in overrides or []:
        cfg = _merge(cfg, parse_override(text))
    validate(cfg)
    return cfg


def _number(cfg: dict, path: str, kind=float, low=None, high=None, low_open=False,
            high_open=False, allow_none=False):
    section, key = path.split(".")
    v = cfg[section][key]
    if v is None and allow_none:
        return
    if isinstance(v, str):      # YAML 1.1 reads '1e-6' (no dot) as a string
        try:
            v = cfg[section][key] = float(v) if kind is float else int(v)
        except ValueError:
            pass
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and v != int(v)):
        raise ConfigError(path, f"expected {'an integer' if kind is int else 'a number'}, got {v!r}",
                          f"set {path} to a {'whole ' if kind is int else ''}number")
    if v != v:  # NaN
        raise ConfigError(path, "is NaN", f"set {path} to a finite number")
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "" if low is None else f"{'(' if low_open else '['}{low}"
        hi = "" if high is None else f"{high}{')' if high_open else ']'}"
        raise ConfigError(path, f"{v} is out of range", f"choose {path} in {lo or '(-inf'}, {hi or 'inf)'}")


def _choice(cfg: dict, path: str, choices) -> None:
    section, key = path.split(".")
    if cfg[section][key] not in choices:
        raise ConfigError(path, f"{cfg[section][key]!r} is not supported",
                          f"use one of {list(choices)}")


def validate(cfg: dict, public_size: int | None = None, num_private: int | None = None) -> None:
    """Check every value; with data sizes known, also s <= public size and clients <= records."""
    from rknn_ray.data import canonical_name
    try:
        cfg["data"]["dataset"] = canonical_name(cfg["data"]["dataset"])
    except ConfigError as exc:
        raise ConfigError("data.dataset", exc.problem, exc.fix) from None
    _choice(cfg, "run.rng", RNG_KINDS)
    if cfg["run"]["rng"] == "seeded":
        _number(cfg, "run.seed", int, 0)
    _choice(cfg, "data.partition", PARTITIONS)
    _choice(cfg, "privacy.model", MODELS)
    _choice(cfg, "labels.type", LABEL_TYPES)
    _number(cfg, "data.clients", int, 1)
    _number(cfg, "data.alpha", float, 0, low_open=True)
    _number(cfg, "represent.dim", int, 1)
    _number(cfg, "queries.s", int, 1)
    _number(cfg, "queries.restarts", int, 1)
    _number(cfg, "rknn.k", int, 1)
    _number(cfg, "rknn.r", int, 1)
    _number(cfg, "privacy.eps", float, 0, low_open=True)
    if cfg["privacy"]["eps"] == float("inf"):
        raise ConfigError("privacy.eps", "is infinite", "use a finite eps > 0 "
                          "(the report always includes the non-private reference)")
    _number(cfg, "privacy.delta", float, 0, 1, high_open=True)
    if cfg["privacy"]["model"] == "shuffle":
        _number(cfg, "privacy.delta", float, 0, 1, low_open=True, high_open=True)
    _number(cfg, "privacy.budget_eps", float, 0, low_open=True, allow_none=True)
    _number(cfg, "privacy.budget_delta", float, 0, 1, high_open=True, allow_none=True)
    _number(cfg, "student.epochs", int, 1)
    _number(cfg, "student.batch_size", int, 1)
    _number(cfg, "student.lr", float, 0, low_open=True)
    _number(cfg, "student.num_workers", int, 1)
    _number(cfg, "cluster.shards", int, 1)
    _number(cfg, "cluster.batch_clients", int, 1)
    s, k = cfg["queries"]["s"], cfg["rknn"]["k"]
    if k > s:
        raise ConfigError("rknn.k", f"k = {k} exceeds the number of queries s = {s}",
                          f"set rknn.k <= {s} or raise queries.s")
    if public_size is not None and s > public_size:
        raise ConfigError("queries.s", f"s = {s} exceeds the {public_size} public samples",
                          f"set queries.s <= {public_size}")
    if num_private is not None and cfg["data"]["partition"] != "one_per_client" \
            and cfg["data"]["clients"] > num_private:
        raise ConfigError("data.clients", f"{cfg['data']['clients']} clients for only "
                          f"{num_private} private records",
                          f"set data.clients <= {num_private} or data.partition=one_per_client")
    from rknn_ray.mechanisms import available
    names = available().get(cfg["privacy"]["model"], [])
    if cfg["privacy"]["mechanism"] not in names:
        raise ConfigError("privacy.mechanism", f"{cfg['privacy']['mechanism']!r} is not a "
                          f"{cfg['privacy']['model']} mechanism", f"use one of {sorted(names)}")

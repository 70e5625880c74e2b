"""Run configuration: YAML file + ``--set dotted.key=value`` overrides, validated
once, up front, so a bad value fails in milliseconds, before data loads or Ray starts.

``load_config`` returns a frozen :class:`Config` with one frozen dataclass per
section (``cfg.privacy.eps``, ``cfg.rounds.count``); ``cfg.to_dict()`` is the plain
nested dict written to config.yaml and report.json, and ``cfg.with_overrides([...])``
derives a changed, re-validated copy. The defaults below are the single source of
truth for every key; a key that is not here is a typo and is rejected with the
closest known key. Free-form sections (``privacy.options``, ``data.synthetic``) are
merged key by key, and their keys are checked against what the code reads.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import os
from dataclasses import dataclass, field

import yaml

from rknn_ray.errors import ConfigError

DEFAULTS: dict = {
    "run": {"name": "run", "seed": 0, "rng": "secure", "progress": True, "diagnostics": False},
    "data": {"dataset": "digits", "data_root": None, "split": "paper", "clients": 100,
             "partition": "iid", "alpha": 0.5, "synthetic": {}},
    "represent": {"encoder": "pca", "dim": 32, "whiten": False},
    "queries": {"s": 100, "restarts": 3, "niter": 25, "use_nearest_public": False},
    "rknn": {"k": 1, "r": 1},
    "privacy": {"model": "central", "mechanism": "laplace", "eps": 1.0, "delta": 0.0,
                "noise": "discrete", "multi_record": "sample", "options": {},
                "budget_eps": None, "budget_delta": None, "accountant": "basic",
                "amplification_bound": "clones_numerical"},
    "shuffle": {"min_senders": None, "onion_layers": 0, "dropout": 0.0,
                "distributed_above": 5_000_000},
    "labels": {"type": "hard", "train_on": "public"},
    "student": {"epochs": 30, "batch_size": 64, "lr": 0.001, "weight_decay": 0.0,
                "num_workers": 2, "use_gpu": None, "arch": "auto", "augment": "none"},
    "cluster": {"shards": 2, "batch_clients": 20000, "shard_cpus": 0.5, "server_cpus": 0.25,
                "shuffler_cpus": 0.25, "openers": None, "window": 16},
    "rounds": {"count": 1, "budget_split": "even", "query_selection": "farthest"},
}

#: Keys the code reads from the free-form sections (anything else is a typo).
PRIVACY_OPTIONS = ("collision_l", "separation_split", "expected_dropout")
SYNTHETIC_KEYS = ("num_samples", "num_classes", "dim", "seed", "separation")
TRAIN_ON = ("public", "queries")
ENCODERS = ("pca", "raw")
NOISE_KINDS = ("discrete", "continuous")
MULTI_RECORD = ("sample", "normalize")
ACCOUNTANTS = ("basic", "pld")

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
        elif tuple(path.split(".")) in FREE_FORM:        # merged key by key, never replaced
            if v is not None and not isinstance(v, dict):
                raise ConfigError(path, f"expected a mapping, got {v!r}", f"write {path}.<key>: value")
            out[k] = {**(out.get(k) or {}), **(v or {})}
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
    """Defaults <- YAML file <- overrides, validated once: a frozen :class:`Config`."""
    cfg = copy.deepcopy(DEFAULTS)
    if path:
        cfg = _merge(cfg, _read_yaml(path))
    return _finish(cfg, overrides)


def _read_yaml(path: str) -> dict:
    if not os.path.isfile(path):
        raise ConfigError("--config", f"file {path!r} not found",
                          "pass a path to a YAML file, e.g. jobs/configs/digits_central.yaml")
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = yaml.safe_load(fh) or {}
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("--config", f"{path} is not a valid YAML text file "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})",
                          "pass a YAML config such as jobs/configs/digits_central.yaml") from None
    if not isinstance(loaded, dict):
        raise ConfigError("--config", f"{path} must hold a mapping", "see jobs/configs/")
    return loaded


def _finish(cfg: dict, overrides: list[str] | None) -> "Config":
    for text in overrides or []:
        cfg = _merge(cfg, parse_override(text))
    validate(cfg)
    return Config.from_dict(cfg)


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
    _choice(cfg, "labels.train_on", TRAIN_ON)
    _choice(cfg, "represent.encoder", ENCODERS)
    _choice(cfg, "privacy.noise", NOISE_KINDS)
    _choice(cfg, "privacy.multi_record", MULTI_RECORD)
    _choice(cfg, "privacy.accountant", ACCOUNTANTS)
    from rknn_ray.accounting import BOUNDS
    _choice(cfg, "privacy.amplification_bound",
            sorted(b for b in BOUNDS if BOUNDS[b].kind == "upper"))
    from rknn_ray.student.models import ARCHS
    from rknn_ray.student.train import AUGMENTATIONS
    _choice(cfg, "student.arch", ARCHS)
    _choice(cfg, "student.augment", AUGMENTATIONS)
    if cfg["student"]["use_gpu"] not in (None, True, False):
        raise ConfigError("student.use_gpu", f"{cfg['student']['use_gpu']!r} is not true, false "
                          "or null", "set student.use_gpu: null (automatic), true or false")
    for key in ("run.progress", "run.diagnostics", "queries.use_nearest_public", "represent.whiten"):
        section, name = key.split(".")
        if not isinstance(cfg[section][name], bool):
            raise ConfigError(key, f"{cfg[section][name]!r} is not true or false", f"set {key}: true or false")
    _number(cfg, "student.weight_decay", float, 0)
    _number(cfg, "queries.niter", int, 1)
    _number(cfg, "shuffle.dropout", float, 0, 1, high_open=True)
    _number(cfg, "shuffle.onion_layers", int, 0, 8)
    _number(cfg, "shuffle.min_senders", int, 1, allow_none=True)
    _number(cfg, "shuffle.distributed_above", int, 1, allow_none=True)
    _number(cfg, "cluster.shard_cpus", float, 0, low_open=True)
    _number(cfg, "cluster.server_cpus", float, 0, low_open=True)
    _number(cfg, "cluster.shuffler_cpus", float, 0, low_open=True)
    _number(cfg, "cluster.openers", int, 0, 64, allow_none=True)
    _number(cfg, "cluster.window", int, 1, 1024)
    _number(cfg, "rounds.count", int, 1, 100)
    _choice(cfg, "rounds.query_selection", ("farthest",))
    _check_split(cfg["rounds"]["budget_split"], cfg["rounds"]["count"])
    _check_free_form(cfg["privacy"]["options"], "privacy.options", PRIVACY_OPTIONS)
    _check_free_form(cfg["data"]["synthetic"], "data.synthetic", SYNTHETIC_KEYS)
    if cfg["privacy"]["eps"] < 1e-6:
        raise ConfigError("privacy.eps", f"{cfg['privacy']['eps']} is below 1e-6: its noise scale "
                          "2kr/eps would dwarf any count", "use privacy.eps >= 1e-6")
    s, k = cfg["queries"]["s"], cfg["rknn"]["k"]
    if k > s:
        raise ConfigError("rknn.k", f"k = {k} exceeds the number of queries s = {s}",
                          f"set rknn.k <= {s} or raise queries.s")
    if public_size is not None and s > public_size:
        raise ConfigError("queries.s", f"s = {s} exceeds the {public_size} public samples",
                          f"set queries.s <= {public_size}")
    if public_size is not None and s * cfg["rounds"]["count"] > public_size:
        raise ConfigError("rounds.count", f"{cfg['rounds']['count']} rounds of s = {s} new queries "
                          f"need {s * cfg['rounds']['count']} public samples, there are {public_size}",
                          "lower rounds.count or queries.s")
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


def _check_split(split, count: int) -> None:
    if split == "even":
        return
    if not isinstance(split, (list, tuple)) or len(split) != count or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in split) \
            or sum(split) > 1 + 1e-12:
        raise ConfigError("rounds.budget_split", f"{split!r} is not 'even' or {count} positive "
                          "fractions summing to at most 1",
                          f"use 'even' or a list of {count} fractions, e.g. {[round(1 / count, 3)] * count}")


def _check_free_form(section: dict, path: str, known: tuple) -> None:
    for key in section or {}:
        if key not in known:
            near = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean '{path}.{near[0]}'?" if near else f"known keys: {list(known)}"
            raise ConfigError(f"{path}.{key}", "unknown key", hint)


def validate_with_data(cfg: "Config", public_size: int, num_private: int,
                       num_classes: int) -> None:
    """The checks that need the loaded data (s <= public size, clients <= records, r <= |Y|)."""
    validate(cfg.to_dict(), public_size=public_size, num_private=num_private)
    if cfg.rknn.r > num_classes:
        raise ConfigError("rknn.r", f"r = {cfg.rknn.r} labels per record exceeds the "
                          f"{num_classes} classes", f"set rknn.r <= {num_classes}")


def validate_resources(cfg: "Config", available_cpus: float) -> None:
    """Shards, the Server and the shufflers must fit the cluster's CPUs (Ray would wait forever)."""
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    need = cfg.cluster.shards * cfg.cluster.shard_cpus + cfg.cluster.server_cpus \
        + hops * cfg.cluster.shuffler_cpus
    if need > available_cpus + 1e-9:
        raise ConfigError("cluster.shards", f"{cfg.cluster.shards} shards x {cfg.cluster.shard_cpus} "
                          f"CPU + server {cfg.cluster.server_cpus} + {hops} shuffler(s) x "
                          f"{cfg.cluster.shuffler_cpus} = {need:g} CPUs, but the cluster has "
                          f"{available_cpus:g}", "lower cluster.shards or cluster.shard_cpus")


# ---------------------------------------------------------------------- typed sections

@dataclass(frozen=True)
class RunConfig:
    name: str
    seed: int
    rng: str
    progress: bool
    diagnostics: bool


@dataclass(frozen=True)
class DataConfig:
    dataset: str
    data_root: str | None
    split: str
    clients: int
    partition: str
    alpha: float
    synthetic: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RepresentConfig:
    encoder: str
    dim: int
    whiten: bool


@dataclass(frozen=True)
class QueriesConfig:
    s: int
    restarts: int
    niter: int
    use_nearest_public: bool


@dataclass(frozen=True)
class RknnConfig:
    k: int
    r: int


@dataclass(frozen=True)
class PrivacyConfig:
    model: str
    mechanism: str
    eps: float
    delta: float
    noise: str
    multi_record: str
    options: dict
    budget_eps: float | None
    budget_delta: float | None
    accountant: str
    amplification_bound: str


@dataclass(frozen=True)
class ShuffleConfig:
    min_senders: int | None
    onion_layers: int
    dropout: float
    distributed_above: int | None


@dataclass(frozen=True)
class LabelsConfig:
    type: str
    train_on: str


@dataclass(frozen=True)
class StudentSection:
    epochs: int
    batch_size: int
    lr: float
    weight_decay: float
    num_workers: int
    use_gpu: bool | None
    arch: str
    augment: str


@dataclass(frozen=True)
class ClusterConfig:
    shards: int
    batch_clients: int
    shard_cpus: float
    server_cpus: float
    shuffler_cpus: float
    openers: int | None
    window: int


@dataclass(frozen=True)
class RoundsConfig:
    count: int
    budget_split: object            # "even" or a tuple of fractions
    query_selection: str


SECTIONS = {"run": RunConfig, "data": DataConfig, "represent": RepresentConfig,
            "queries": QueriesConfig, "rknn": RknnConfig, "privacy": PrivacyConfig,
            "shuffle": ShuffleConfig, "labels": LabelsConfig, "student": StudentSection,
            "cluster": ClusterConfig, "rounds": RoundsConfig}


@dataclass(frozen=True)
class Config:
    """A validated run configuration: one frozen section per key of DEFAULTS."""
    run: RunConfig
    data: DataConfig
    represent: RepresentConfig
    queries: QueriesConfig
    rknn: RknnConfig
    privacy: PrivacyConfig
    shuffle: ShuffleConfig
    labels: LabelsConfig
    student: StudentSection
    cluster: ClusterConfig
    rounds: RoundsConfig

    @classmethod
    def from_dict(cls, cfg: dict) -> "Config":
        """From a merged, *validated* dict (use load_config)."""
        parts = {}
        for name, section in SECTIONS.items():
            values = dict(cfg[name])
            if name == "rounds" and isinstance(values["budget_split"], list):
                values["budget_split"] = tuple(values["budget_split"])
            parts[name] = section(**values)
        return cls(**parts)

    def to_dict(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            sec = dataclasses.asdict(getattr(self, f.name))
            if f.name == "rounds" and isinstance(sec["budget_split"], tuple):
                sec["budget_split"] = list(sec["budget_split"])
            out[f.name] = sec
        return out

    def with_overrides(self, overrides: list[str]) -> "Config":
        """A changed copy (``["run.progress=false", ...]``), validated again."""
        return _finish(self.to_dict(), overrides)

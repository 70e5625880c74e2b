"""Run configuration: YAML file + ``--set dotted.key=value`` overrides, validated
once, up front, so a bad value fails before data loads or Ray starts.

``load_config`` returns a frozen :class:`Config` with one frozen dataclass per
section (``cfg.privacy.eps``, ``cfg.rounds.count``); ``cfg.to_dict()`` is the plain
nested dict written to config.yaml and report.json, and ``cfg.with_overrides([...])``
derives a changed, re-validated copy. The section dataclasses below are the single
source of truth for every key and default; a key that is not there is a typo and is
rejected with the closest known key.

Free-form sections (``privacy.options``, ``data.synthetic``) are merged key by key
(file, then each override); a key set to null is dropped (its default applies again)
and the whole section set to null is emptied. Their keys are checked against what
the code reads. The lists of allowed values come from the modules that use them.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import math
import os
from dataclasses import dataclass, field

import yaml

from rknn_ray.errors import ConfigError


class FrozenDict(dict):
    """A read-only dict: the free-form sections of a frozen :class:`Config`."""

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("a Config is read-only; derive a changed copy with "
                        "cfg.with_overrides(['privacy.options.<key>=<value>'])")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):        # pickle / deepcopy / Ray rebuild it without __setitem__
        return (FrozenDict, (dict(self),))

    def __hash__(self):
        return hash(frozenset(self.items()))


# ---------------------------------------------------------------------- typed sections

@dataclass(frozen=True)
class RunConfig:
    name: str = "run"                 # names the run folder runs/<name>-<time>
    seed: int = 0                     # split / partition seed (and all randomness if rng=seeded)
    rng: str = "secure"               # "secure" (OS CSPRNG) or "seeded" (reproducible simulation)
    progress: bool = True             # bars or periodic lines on stderr; false: silent
    diagnostics: bool = False         # NOT PRIVATE: also label with exact counts, into diagnostics/


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "digits"           # digits is embedded; the others read data_root
    data_root: str | None = None      # the dataset's standard files (null: default place)
    split: str = "paper"              # paper: paper 000's private/public/evaluation split
    clients: int = 100                # virtual clients the private records are partitioned over
    partition: str = "iid"            # how private records are dealt to clients
    alpha: float = 0.5                # Dirichlet concentration (partition=dirichlet)
    max_records_per_client: int | None = None  # public bound on a client's records (message
    # sizes, allowances, auto s); records beyond it are dropped. null: ceil(records / clients)
    # for iid, 1 for one_per_client; dirichlet must declare it (its record counts are private)
    include_extra: bool = False       # SVHN: extra_32x32.mat joins the private train set
    synthetic: FrozenDict = field(default_factory=FrozenDict)   # gaussian_mixture arguments


@dataclass(frozen=True)
class RepresentConfig:
    encoder: str = "pca"              # fitted on public data only
    dim: int = 32                     # output dimension (PCA components)
    whiten: bool = False              # PCA whitening
    # learned encoder (simclr), rknn_ray.contrastive; trained on public data only and cached
    epochs: int = 15                  # simclr training epochs (public data only)
    batch_size: int = 256             # simclr batch size
    flip: bool = True                 # left-right mirror augmentation (false for digits)
    backbone: str = "auto"            # auto | cnn | resnet (32x32, GPU)
    trainer: str = "ray"              # ray (one-worker Ray Train) | local
    cache_dir: str | None = None      # null: $RKNN_RAY_CACHE/encoders or ~/.cache/rknn-ray/encoders


@dataclass(frozen=True)
class QueriesConfig:
    s: int | str = 100                # or "auto": rknn_ray.autotune from n, eps and public data
    restarts: int = 3                 # faiss k-means restarts
    niter: int = 25                   # faiss k-means iterations
    use_nearest_public: bool = False  # snap each centre to its nearest public sample


@dataclass(frozen=True)
class RknnConfig:
    k: int | str = 1                  # or "auto" (with queries.s: auto)
    r: int = 1                        # label bits a record votes (r-hot); sensitivity is 2kr


@dataclass(frozen=True)
class PrivacyConfig:
    model: str = "central"            # trust model: who adds the noise
    mechanism: str = "laplace"        # per model: see the README's trust-model table
    eps: float = 1.0                  # the job's total eps, record level, replace-one
    delta: float = 0.0                # the job's total delta (shuffle: below 1/n; central, local: 0)
    noise: str = "discrete"           # central: discrete (exact) or continuous (paper's)
    multi_record: str = "sample"      # local/shuffle, clients with several records
    options: FrozenDict = field(default_factory=FrozenDict)     # mechanism tuning, see PRIVACY_OPTIONS
    budget_eps: float | None = None   # the records' eps budget across jobs (null: this job's eps)
    budget_delta: float | None = None  # the records' delta budget across jobs, below 1/n (null: max(delta, 1/(10 n)))
    accountant: str = "basic"         # composition: basic (sums) or pld
    amplification_bound: str = "clones_numerical"  # shuffle, single message: the amplification bound
    honest_fraction: float | None = None  # shuffle: share of senders assumed to follow the protocol (null: 0.5 for multi, 1.0 single message; docs/threat-model.md)


@dataclass(frozen=True)
class ShuffleConfig:
    min_senders: int | None = None    # sender floor above what the target needs
    onion_layers: int = 0             # N chained shufflers, each peeling its own layer
    dropout: float = 0.0              # simulated fraction of clients that never send
    distributed_above: int | None = 5_000_000  # above: a distributed sort
    max_messages_per_client: int | None = 64   # multi-message + queries.s auto: caps s so a
                                                # client sends at most this many (expected)


@dataclass(frozen=True)
class LabelsConfig:
    type: str = "hard"                # hard (argmax) or soft (normalized counts) targets
    train_on: str = "public"          # train on propagated public labels, or on the queries only
    smooth: int | str = 1             # public-graph neighbours for denoising (1: off) or "auto"


@dataclass(frozen=True)
class StudentSection:
    epochs: int = 30                  # training epochs
    batch_size: int = 64              # per worker
    lr: float = 0.001                 # Adam learning rate
    weight_decay: float = 0.0         # Adam weight decay
    num_workers: int = 2              # Ray Train workers (checked against the CPUs)
    use_gpu: bool | None = None       # null: use a GPU when Ray has one
    arch: str = "auto"                # model architecture (auto: by input shape)
    augment: str = "none"             # training augmentation
    method: str = "supervised"        # supervised (train.py) | semi (student/semi.py, FixMatch-like)
    target: str = "weighted"          # semi: hard | soft | weighted
    threshold: float = 0.9            # semi: model confidence for a consistency target
    init: str = "encoder"             # semi: encoder (the simclr backbone, if any) | scratch
    input: str = "images"             # images | features: an MLP on the (public) encoder's features
    trainer: str = "ray"              # ray (Ray Train, num_workers workers) | local (this process,
                                      # the same training loop; no Train start-up cost)


@dataclass(frozen=True)
class ClusterConfig:
    shards: int = 2                   # ClientShard actors, each hosting many virtual clients
    batch_clients: int = 20000        # virtual clients per sealed Arrow batch
    shard_cpus: float = 0.5           # Ray CPUs per shard actor
    server_cpus: float = 0.25         # Ray CPUs of the Server actor
    shuffler_cpus: float = 0.25       # Ray CPUs per Shuffler actor
    openers: int | None = None        # the Server's opener processes (null: one per CPU, at most 16)
    window: int = 16                  # batches in flight per shard stream and in the Server
    key_store: str | None = None      # absolute node-local folder for shard secrets
                                      # (null: $TMPDIR/rknn-ray-keys-<uid> on each shard's node)
    placement: FrozenDict = field(default_factory=FrozenDict)   # party (client | shuffler | server) -> the
                                      # {resources, labels} a node must have to host it; {}: any node


@dataclass(frozen=True)
class RoundsConfig:
    count: int = 1                                   # T labeling rounds in one job
    budget_split: str | tuple[float, ...] = "even"   # or T fractions of (eps, delta), sum <= 1
    query_selection: str = "farthest"               # farthest | uncertain (rknn_ray/adaptive.py)
    uncertainty: str = "margin"                      # uncertain: margin | entropy
    pool_factor: float = 2.0                         # uncertain: pick s among the pool_factor*s least certain
    split_queries: bool = False                      # true: queries.s in total, divided over the rounds


SECTIONS = {"run": RunConfig, "data": DataConfig, "represent": RepresentConfig,
            "queries": QueriesConfig, "rknn": RknnConfig, "privacy": PrivacyConfig,
            "shuffle": ShuffleConfig, "labels": LabelsConfig, "student": StudentSection,
            "cluster": ClusterConfig, "rounds": RoundsConfig}


def _plain(value):
    """FrozenDict -> dict, tuple -> list (what YAML and JSON write)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _section_dict(section) -> dict:
    return {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)}


#: Every key and its default, as a plain nested dict (derived from the sections).
DEFAULTS: dict = {name: _section_dict(cls()) for name, cls in SECTIONS.items()}


@dataclass(frozen=True)
class Config:
    """A validated run configuration: one frozen section per key of DEFAULTS.

    Build it with :func:`load_config`, :meth:`from_dict` or :meth:`with_overrides`
    (all validate); the constructor itself does not.
    """
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
        """Defaults <- ``cfg`` (e.g. report.json's "config"), validated."""
        return _finish(_merge(DEFAULTS, cfg), None)

    def to_dict(self) -> dict:
        """The plain nested dict (lists, dicts, scalars) for config.yaml and report.json."""
        return {f.name: _section_dict(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def with_overrides(self, overrides: list[str]) -> "Config":
        """A changed copy (``["run.progress=false", ...]``), validated again."""
        return _finish(self.to_dict(), overrides)


def _build(cfg: dict) -> Config:
    """From a merged, validated dict."""
    parts = {}
    for name, section in SECTIONS.items():
        values = dict(cfg[name])
        for key, value in values.items():
            if isinstance(value, dict):
                values[key] = FrozenDict(value)
            elif isinstance(value, list):
                values[key] = tuple(value)
        parts[name] = section(**values)
    return Config(**parts)


# ---------------------------------------------------------------------- loading

FREE_FORM = {("privacy", "options"), ("data", "synthetic"), ("cluster", "placement")}


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file <- overrides, validated once: a frozen :class:`Config`."""
    cfg = _merge(DEFAULTS, _read_yaml(path)) if path else _merge(DEFAULTS, {})
    return _finish(cfg, overrides)


def parse_override(text: str) -> dict:
    """'a.b.c=value' -> {'a': {'b': {'c': value}}} (value parsed as YAML)."""
    if "=" not in text:
        raise ConfigError(text, "override is not key=value", "write --set privacy.eps=0.5")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "override key is empty or has an empty part",
                          "write a dotted key such as privacy.eps")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value {raw!r} is not valid YAML ({str(exc).splitlines()[0]})",
                          "quote the value or write a list as [a, b]") from None
    out: dict = {}
    cur = out
    for p in parts[:-1]:
        cur = cur.setdefault(p, {})
    cur[parts[-1]] = value
    return out


def _read_yaml(path: str) -> dict:
    fix = "pass a YAML config such as jobs/configs/digits_central.yaml"
    if not os.path.isfile(path):
        problem = "is a folder" if os.path.isdir(path) else "not found"
        raise ConfigError("--config", f"file {path!r} {problem}", fix)
    try:
        with open(path, encoding="utf-8") as fh:
            loaded = yaml.safe_load(fh)
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("--config", f"{path} is not a valid YAML text file "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", fix) from None
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}",
                          "check the file's permissions") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError("--config", f"{path} holds a {type(loaded).__name__}, not a mapping of "
                          "sections", "write sections such as 'privacy: {eps: 1.0}'; " + fix)
    return loaded


def _flat_keys(d: dict, prefix: str = "") -> list[str]:
    keys = []
    for k, v in d.items():
        path = f"{prefix}{k}"
        keys.append(path)
        if isinstance(v, dict) and tuple(path.split(".")) not in FREE_FORM:
            keys.extend(_flat_keys(v, path + "."))
    return keys


KNOWN_KEYS = _flat_keys(DEFAULTS)


def _unknown(path: str, known: list[str], fallback: str) -> ConfigError:
    near = difflib.get_close_matches(path, known, n=1)
    return ConfigError(path, "unknown key", f"did you mean '{near[0]}'?" if near else fallback)


def _merge(base: dict, extra: dict, prefix: str = "") -> dict:
    """``base`` updated by ``extra``; sections recursively, free-form sections key by key."""
    out = copy.deepcopy(base)
    if not isinstance(extra, dict):
        raise ConfigError(prefix.rstrip(".") or "--config", f"expected a mapping, got {extra!r}",
                          "write sections as 'section: {key: value}'")
    for k, v in extra.items():
        path = f"{prefix}{k}"
        if path not in KNOWN_KEYS:
            raise _unknown(path, KNOWN_KEYS, "see jobs/configs/*.yaml for the keys")
        if tuple(path.split(".")) in FREE_FORM:
            if v is not None and not isinstance(v, dict):
                raise ConfigError(path, f"expected a mapping, got {v!r}", f"write {path}.<key>=value")
            merged = {} if v is None else {**out[k], **v}
            out[k] = {key: val for key, val in merged.items() if val is not None}
        elif isinstance(out.get(k), dict):
            if not isinstance(v, dict):
                raise ConfigError(path, f"expected a mapping, got {v!r}", f"write {path}.<key>=value")
            out[k] = _merge(out[k], v, path + ".")
        else:
            out[k] = v
    return out


def _finish(cfg: dict, overrides: list[str] | None) -> Config:
    for text in overrides or []:
        cfg = _merge(cfg, parse_override(text))
    _validate(cfg)
    return _build(cfg)


# ---------------------------------------------------------------------- validation

TRAIN_ON = ("public", "queries")    # jobs/distill.py: train on propagated public labels or the queries
#: privacy.options keys the mechanisms read -> (kind, low, high, low_open, high_open).
PRIVACY_OPTIONS = {"collision_l": (int, 2, None, False, False),
                   "separation_split": (float, 0, 1, True, True),
                   "expected_dropout": (float, 0, 1, False, True),
                   "dlap_share": (float, 0, 1, True, True)}     # shuffle multi: DLap vs flooding
#: Options the pipeline fills from a dedicated key (an options entry would override it).
SHADOWED_OPTIONS = {"noise": "privacy.noise", "multi_record": "privacy.multi_record",
                    "bound": "privacy.amplification_bound",
                    "honest_fraction": "privacy.honest_fraction"}

#: key -> (kind, low, high, low_open, high_open, allow_none)
NUMBERS = {
    "run.seed": (int, 0, None, False, False, False),
    "data.clients": (int, 1, None, False, False, False),
    "data.alpha": (float, 0, None, True, False, False),
    "data.max_records_per_client": (int, 1, None, False, False, True),
    "represent.dim": (int, 1, None, False, False, False),
    "queries.s": (int, 1, None, False, False, False),
    "represent.epochs": (int, 1, None, False, False, False),
    "represent.batch_size": (int, 2, None, False, False, False),
    "student.threshold": (float, 0, 1, True, False, False),
    "queries.restarts": (int, 1, None, False, False, False),
    "queries.niter": (int, 1, None, False, False, False),
    "rknn.k": (int, 1, None, False, False, False),
    "rknn.r": (int, 1, None, False, False, False),
    "privacy.eps": (float, 0, None, True, False, False),
    "privacy.delta": (float, 0, 1, False, True, False),
    "privacy.budget_eps": (float, 0, None, True, False, True),
    "privacy.budget_delta": (float, 0, 1, False, True, True),
    "privacy.honest_fraction": (float, 0, 1, True, False, True),
    "shuffle.min_senders": (int, 1, None, False, False, True),
    "shuffle.onion_layers": (int, 0, 8, False, False, False),
    "shuffle.dropout": (float, 0, 1, False, True, False),
    "shuffle.distributed_above": (int, 1, None, False, False, True),
    "shuffle.max_messages_per_client": (int, 2, None, False, False, True),
    "student.epochs": (int, 1, None, False, False, False),
    "student.batch_size": (int, 1, None, False, False, False),
    "student.lr": (float, 0, None, True, False, False),
    "student.weight_decay": (float, 0, None, False, False, False),
    "student.num_workers": (int, 1, None, False, False, False),
    "cluster.shards": (int, 1, None, False, False, False),
    "cluster.batch_clients": (int, 1, None, False, False, False),
    "cluster.shard_cpus": (float, 0, None, True, False, False),
    "cluster.server_cpus": (float, 0, None, True, False, False),
    "cluster.shuffler_cpus": (float, 0, None, True, False, False),
    "cluster.openers": (int, 0, 64, False, False, True),
    "cluster.window": (int, 1, 1024, False, False, False),
    "rounds.count": (int, 1, 100, False, False, False),
    "rounds.pool_factor": (float, 1, None, False, False, False),
}
BOOLS = ("run.progress", "run.diagnostics", "data.include_extra", "represent.whiten",
         "queries.use_nearest_public", "represent.flip", "rounds.split_queries")
#: keys that take "auto" instead of a number (rknn_ray.autotune / rknn_ray.denoise decide)
AUTO_KEYS = ("queries.s", "rknn.k", "labels.smooth")


def allowed_values() -> dict[str, tuple]:
    """Allowed values per key, taken from the modules that act on them."""
    from rknn_ray.accounting import BOUNDS
    from rknn_ray.accounting.ledger import ACCOUNTANTS
    from rknn_ray.data.partition import SCHEMES
    from rknn_ray.data.splits import RULES
    from rknn_ray.mechanisms import available
    from rknn_ray.mechanisms.central import NOISE_KINDS
    from rknn_ray.mechanisms.randomized_response import MULTI_RECORD
    from rknn_ray.adaptive import UNCERTAINTY_RULES
    from rknn_ray.queries import ADAPTIVE_SELECTORS, NEXT_ROUND_SELECTORS
    from rknn_ray.represent import ENCODERS
    from rknn_ray.rng import RNG_KINDS
    from rknn_ray.student.models import ARCHS
    from rknn_ray.student.train import AUGMENTATIONS, LABEL_TYPES
    return {"run.rng": RNG_KINDS, "data.split": RULES, "data.partition": SCHEMES,
            "represent.encoder": tuple(ENCODERS), "privacy.model": tuple(available()),
            "privacy.noise": NOISE_KINDS, "privacy.multi_record": MULTI_RECORD,
            "privacy.accountant": tuple(ACCOUNTANTS),
            "privacy.amplification_bound": tuple(sorted(b for b in BOUNDS
                                                        if BOUNDS[b].kind == "upper")),
            "labels.type": LABEL_TYPES, "labels.train_on": TRAIN_ON,
            "student.arch": ARCHS, "student.augment": AUGMENTATIONS,
            "rounds.query_selection": (*NEXT_ROUND_SELECTORS, *ADAPTIVE_SELECTORS),
            "rounds.uncertainty": UNCERTAINTY_RULES,
            "represent.backbone": ("auto", "cnn", "resnet"), "represent.trainer": ("ray", "local"),
            "student.method": ("supervised", "semi"), "student.target": ("hard", "soft", "weighted"),
            "student.init": ("encoder", "scratch"), "student.input": ("images", "features"),
            "student.trainer": ("ray", "local")}


def synthetic_keys() -> dict[str, type]:
    """data.synthetic keys: gaussian_mixture's parameters, typed by their defaults."""
    from rknn_ray.data.synthetic import gaussian_mixture
    return {name: type(p.default) for name, p in inspect.signature(gaussian_mixture).parameters.items()}


def _number(holder: dict, key: str, path: str, kind=float, low=None, high=None,
            low_open=False, high_open=False, allow_none=False) -> None:
    """Check ``holder[key]`` and store it normalized (numeric strings parsed, ints as int)."""
    v = holder[key]
    if v is None and allow_none:
        return
    if isinstance(v, str):      # YAML 1.1 reads '1e-6' (no dot) as a string
        try:
            v = float(v.strip())
        except ValueError:
            pass
    whole = "whole " if kind is int else ""
    fix = f"set {path} to a finite {whole}number" + (" or null" if allow_none else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(path, f"expected {'an integer' if kind is int else 'a number'}, got {v!r}", fix)
    if not math.isfinite(v):
        raise ConfigError(path, f"{v} is not finite", fix)
    if kind is int:
        if v != int(v):
            raise ConfigError(path, f"expected an integer, got {v!r}", fix)
        v = int(v)
    holder[key] = v
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "(-inf" if low is None else f"{'(' if low_open else '['}{low}"
        hi = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
        raise ConfigError(path, f"{v} is out of range", f"choose {path} in {lo}, {hi}")


def _at(cfg: dict, path: str) -> tuple[dict, str]:
    section, key = path.split(".")
    return cfg[section], key


def _validate(cfg: dict) -> None:
    """Check every value of a merged dict, normalizing it in place (names, numbers)."""
    from rknn_ray.data import canonical_name
    try:
        cfg["data"]["dataset"] = canonical_name(cfg["data"]["dataset"])
    except ConfigError as exc:
        raise ConfigError("data.dataset", exc.problem, exc.fix) from None
    for path, allowed in allowed_values().items():
        holder, key = _at(cfg, path)
        if not isinstance(holder[key], str) or holder[key] not in allowed:
            raise ConfigError(path, f"{holder[key]!r} is not supported", f"use one of {list(allowed)}")
    eps = cfg["privacy"]["eps"]
    if isinstance(eps, float) and math.isinf(eps):
        raise ConfigError("privacy.eps", "is infinite", "use a finite eps > 0 "
                          "(the report always includes the non-private reference)")
    for path, spec in NUMBERS.items():
        if path in AUTO_KEYS and _at(cfg, path)[0][_at(cfg, path)[1]] == "auto":
            continue
        _number(*_at(cfg, path), path, *spec)
    holder, key = _at(cfg, "labels.smooth")
    if holder[key] != "auto":
        _number(holder, key, "labels.smooth", int, 1, None)
    cd = cfg["represent"]["cache_dir"]
    if cd is not None and not isinstance(cd, str):
        raise ConfigError("represent.cache_dir", f"{cd!r} is not a path", "set a folder path or null")
    for path in BOOLS:
        holder, key = _at(cfg, path)
        if not isinstance(holder[key], bool):
            raise ConfigError(path, f"{holder[key]!r} is not true or false", f"set {path}: true or false")
    if not (cfg["student"]["use_gpu"] is None or isinstance(cfg["student"]["use_gpu"], bool)):
        raise ConfigError("student.use_gpu", f"{cfg['student']['use_gpu']!r} is not true, false "
                          "or null", "set student.use_gpu: null (automatic), true or false")
    _check_strings(cfg)
    _check_relations(cfg)
    cfg["rounds"]["budget_split"] = _check_split(cfg["rounds"]["budget_split"], cfg["rounds"]["count"])
    _check_options(cfg)
    _check_synthetic(cfg)
    cfg["cluster"]["placement"] = check_placement(cfg["cluster"]["placement"])


def _check_strings(cfg: dict) -> None:
    name = cfg["run"]["name"]
    if not isinstance(name, str) or not name.strip() or os.sep in name or "/" in name:
        raise ConfigError("run.name", f"{name!r} is not a plain folder name",
                          "set run.name to a non-empty name without '/' (it names runs/<name>-<time>)")
    if cfg["data"]["include_extra"] and cfg["data"]["dataset"] != "svhn":
        raise ConfigError("data.include_extra", f"is only read for SVHN, not "
                          f"{cfg['data']['dataset']!r}", "set data.include_extra: false")
    ks = cfg["cluster"]["key_store"]
    if ks is not None and not (isinstance(ks, str) and os.path.isabs(ks)):
        raise ConfigError("cluster.key_store", f"{ks!r} is not an absolute path (each shard "
                          "opens it on its own node, from its own working folder)",
                          "set cluster.key_store to an absolute folder on the shards' nodes, "
                          "or null for $TMPDIR/rknn-ray-keys-<uid>")
    root = cfg["data"]["data_root"]
    if root is not None and not isinstance(root, str):
        raise ConfigError("data.data_root", f"{root!r} is not a path",
                          "set data.data_root to a folder path, or null for the default location")


def _check_relations(cfg: dict) -> None:
    d = cfg["data"]
    if d["partition"] == "dirichlet" and d["max_records_per_client"] is None:
        raise ConfigError("data.max_records_per_client", "partition=dirichlet deals records by "
                          "their private labels, so the largest client's record count is private; "
                          "the bound that sets message sizes, allowances and auto s must be public",
                          "declare it, e.g. data.max_records_per_client=<3 x records/clients>; "
                          "a client's records beyond it are dropped")
    p = cfg["privacy"]
    if p["eps"] < 1e-6:
        raise ConfigError("privacy.eps", f"{p['eps']} is below 1e-6: its noise scale 2kr/eps "
                          "would dwarf any count", "use privacy.eps >= 1e-6")
    if p["model"] == "shuffle" and p["delta"] <= 0:
        raise ConfigError("privacy.delta", "the shuffle model needs delta > 0 (amplification "
                          "gives (eps, delta) guarantees)", "set privacy.delta, e.g. 1e-6")
    if p["model"] != "shuffle" and p["delta"] != 0:
        raise ConfigError("privacy.delta", f"delta = {p['delta']:g}, but every {p['model']} "
                          "mechanism is pure eps-DP: the delta would be reserved from the "
                          "dataset's budget and never used", "set privacy.delta=0 (the "
                          "dataset's delta budget across jobs is privacy.budget_delta)")
    from rknn_ray.mechanisms import available
    names = available().get(p["model"], [])
    if p["mechanism"] not in names:
        raise ConfigError("privacy.mechanism", f"{p['mechanism']!r} is not a {p['model']} "
                          "mechanism", f"use one of {sorted(names)}")
    s, k = cfg["queries"]["s"], cfg["rknn"]["k"]
    if "auto" in (s, k):
        return
    if k > s:
        raise ConfigError("rknn.k", f"k = {k} exceeds the number of queries s = {s}",
                          f"set rknn.k <= {s} or raise queries.s")
    count = cfg["rounds"]["count"]
    if cfg["rounds"]["split_queries"] is True and isinstance(count, int) and s // count < max(1, k):
        raise ConfigError("rounds.split_queries", f"s = {s} queries split over {count} rounds "
                          f"leaves {s // count} per round, fewer than k = {k}",
                          f"raise queries.s to >= {count * max(1, k)}, lower rounds.count, or set "
                          "rounds.split_queries=false")


def _check_split(split, count: int):
    """'even', or ``count`` positive fractions summing to at most 1 (numeric strings parsed)."""
    fix = f"use 'even' or a list of {count} fractions, e.g. {[round(1 / count, 3)] * count}"
    if split == "even":
        return split
    if not isinstance(split, (list, tuple)):
        raise ConfigError("rounds.budget_split", f"{split!r} is not 'even' or a list", fix)
    holder = list(split)
    for i in range(len(holder)):
        _number(holder, i, f"rounds.budget_split[{i}]", float, 0, 1, low_open=True)
    if len(holder) != count or sum(holder) > 1 + 1e-12:
        raise ConfigError("rounds.budget_split", f"{list(split)!r} is not {count} positive "
                          "fractions summing to at most 1", fix)
    return holder


def _check_options(cfg: dict) -> None:
    options = cfg["privacy"]["options"]
    for key in options:
        path = f"privacy.options.{key}"
        if key in SHADOWED_OPTIONS:
            raise ConfigError(path, f"is set by {SHADOWED_OPTIONS[key]}",
                              f"write {SHADOWED_OPTIONS[key]}=<value> instead")
        if key not in PRIVACY_OPTIONS:
            raise _unknown(path, [f"privacy.options.{o}" for o in PRIVACY_OPTIONS],
                           f"known keys: {list(PRIVACY_OPTIONS)}")
        kind, low, high, low_open, high_open = PRIVACY_OPTIONS[key]
        _number(options, key, path, kind, low, high, low_open, high_open)
    c = (1 if cfg["rknn"]["k"] == "auto" else cfg["rknn"]["k"]) * cfg["rknn"]["r"]
    if options.get("collision_l", c + 1) <= c:
        raise ConfigError("privacy.options.collision_l", f"l = {options['collision_l']} must "
                          f"exceed k*r = {c} (the Collision mechanism's domain)",
                          f"set privacy.options.collision_l > {c}, or null for the variance-optimal l")


def _check_synthetic(cfg: dict) -> None:
    synthetic = cfg["data"]["synthetic"]
    known = synthetic_keys()
    for key in synthetic:
        path = f"data.synthetic.{key}"
        if key not in known:
            raise _unknown(path, [f"data.synthetic.{k}" for k in known], f"known keys: {list(known)}")
        _number(synthetic, key, path, int if known[key] is int else float)
    if synthetic and cfg["data"]["dataset"] != "synthetic":
        raise ConfigError("data.synthetic", f"is only read for data.dataset=synthetic, not "
                          f"{cfg['data']['dataset']!r}", "set data.synthetic=null or data.dataset=synthetic")


#: cluster.placement: the protocol's parties (jobs/protocol.py) and what each may require of
#: the node its actors run on: Ray custom resources (``ray start --resources``) and node labels
#: (``ray start --labels``). A party left out runs wherever Ray puts it.
PLACEMENT_PARTIES = ("client", "shuffler", "server")
PLACEMENT_KEYS = ("resources", "labels")
#: resources with their own keys (cluster.*_cpus) or that Ray manages itself
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_placement(placement) -> dict:
    """``{party: {resources: {name: amount > 0}, labels: {key: value}}}``, normalized;
    a bad entry names itself and the fix (docs/running.md, "A multi-node cluster")."""
    example = "e.g. cluster.placement.client={resources: {client: 1}}"
    out = {}
    for party, need in (placement or {}).items():
        path = f"cluster.placement.{party}"
        if party not in PLACEMENT_PARTIES:
            raise _unknown(path, [f"cluster.placement.{p}" for p in PLACEMENT_PARTIES],
                           f"the parties are {list(PLACEMENT_PARTIES)}")
        if not isinstance(need, dict) or not need or set(need) - set(PLACEMENT_KEYS):
            raise ConfigError(path, f"{need!r} is not a mapping of {list(PLACEMENT_KEYS)}",
                              f"write {example}, or labels: {{rknn-party: {party}}}")
        for key in PLACEMENT_KEYS:
            if not isinstance(need.get(key) or {}, dict):
                raise ConfigError(f"{path}.{key}", f"{need[key]!r} is not a mapping",
                                  f"write {key} as name: value pairs, {example}")
        resources = dict(need.get("resources") or {})
        for name in list(resources):
            where = f"{path}.resources.{name}"
            if not isinstance(name, str) or name in RESERVED_RESOURCES or name.startswith("node:"):
                raise ConfigError(where, "is not a custom resource name (CPUs have their own "
                                  "keys, cluster.shard_cpus / server_cpus / shuffler_cpus)",
                                  f"name a resource the node was started with, {example}")
            _number(resources, name, where, float, 0, None, low_open=True)
        labels = dict(need.get("labels") or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, (str, int)) or isinstance(value, bool):
                raise ConfigError(f"{path}.labels.{key}", f"{value!r} is not a label value",
                                  "write labels as key: value strings, e.g. {rknn-party: client}")
            labels[key] = str(value)
        if resources or labels:
            out[party] = FrozenDict({"resources": FrozenDict(resources),
                                     "labels": FrozenDict(labels)})
    return out


# ---------------------------------------------------------------------- after loading

def validate_with_data(cfg: Config, public_size: int, num_private: int, num_classes: int) -> None:
    """The checks that need the loaded data (s <= public size, clients <= records, r <= |Y|,
    delta < 1/n in the shuffle model)."""
    s, count = cfg.queries.s, cfg.rounds.count
    if s == "auto":
        s = 1
    if s > public_size:
        raise ConfigError("queries.s", f"s = {s} exceeds the {public_size} public samples",
                          f"set queries.s <= {public_size}")
    if cfg.rounds.split_queries:            # s in total over the rounds (round_query_counts)
        count = 1
    if s * count > public_size:
        raise ConfigError("rounds.count", f"{count} rounds of s = {s} new queries need "
                          f"{s * count} public samples (every round picks s public samples "
                          f"that are not yet queries), there are {public_size}",
                          f"lower rounds.count to <= {public_size // s} or queries.s to <= "
                          f"{max(1, public_size // count)}")
    if cfg.data.partition != "one_per_client" and cfg.data.clients > num_private:
        raise ConfigError("data.clients", f"{cfg.data.clients} clients for only {num_private} "
                          "private records",
                          f"set data.clients <= {num_private} or data.partition=one_per_client")
    if cfg.rknn.r > num_classes:
        raise ConfigError("rknn.r", f"r = {cfg.rknn.r} labels per record exceeds the "
                          f"{num_classes} classes", f"set rknn.r <= {num_classes}")
    delta = cfg.privacy.delta
    if cfg.privacy.model == "shuffle" and delta >= 1.0 / max(1, num_private):
        raise ConfigError("privacy.delta", f"delta = {delta:g} is not below 1/n = "
                          f"{1.0 / max(1, num_private):.3g} for n = {num_private} private records: "
                          "an (eps, delta) mechanism may then expose a whole record outright with "
                          "probability delta", f"set privacy.delta below {0.1 / max(1, num_private):.1g} "
                          "(e.g. 1/(10 n))")
    budget_delta = cfg.privacy.budget_delta
    if budget_delta is not None and budget_delta >= 1.0 / max(1, num_private):
        raise ConfigError("privacy.budget_delta", f"{budget_delta:g} is not below 1/n = "
                          f"{1.0 / max(1, num_private):.3g} for n = {num_private} private records: "
                          "the delta summed over every job on the data must stay below 1/n",
                          f"set privacy.budget_delta below {1.0 / max(1, num_private):.3g}, e.g. "
                          f"1/(10 n) = {0.1 / max(1, num_private):.2g}")


def protocol_cpus(cfg: Config) -> float:
    """CPUs the protocol's actors reserve (jobs/protocol.py): every ClientShard
    ``cluster.shard_cpus``, the Server ``cluster.server_cpus``, and in the shuffle model
    max(1, onion_layers) Shuffler hops ``cluster.shuffler_cpus`` each."""
    cl = cfg.cluster
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    return cl.shards * cl.shard_cpus + cl.server_cpus + hops * cl.shuffler_cpus


def validate_resources(cfg: Config, available_cpus: float) -> None:
    """The protocol's actors and the student's workers must fit the cluster's CPUs (Ray would
    wait for them forever); checked before any budget is reserved."""
    st = cfg.student
    if st.trainer == "ray" and st.method != "semi" and not st.use_gpu and \
            st.num_workers > available_cpus + 1e-9:
        raise ConfigError("student.num_workers", f"{st.num_workers} Ray Train workers need "
                          f"{st.num_workers} CPUs but the cluster has {available_cpus:g}",
                          f"set student.num_workers<={max(1, int(available_cpus))} (with --resume "
                          "RUN: --resume RUN --set student.num_workers=N)")
    need = protocol_cpus(cfg)
    if need <= available_cpus + 1e-9:
        return
    cl = cfg.cluster
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    fixed = cl.server_cpus + hops * cl.shuffler_cpus
    fits = math.floor((available_cpus - fixed) / cl.shard_cpus + 1e-9)
    fix = (f"set cluster.shards <= {fits} (or lower cluster.shard_cpus)" if fits >= 1 else
           f"lower cluster.server_cpus / cluster.shuffler_cpus / cluster.shard_cpus, or use a "
           f"cluster with at least {need:g} CPUs")
    raise ConfigError("cluster.shards", f"the protocol reserves {cl.shards} shards x "
                      f"{cl.shard_cpus:g} CPU + server {cl.server_cpus:g} + {hops} shuffler(s) x "
                      f"{cl.shuffler_cpus:g} = {need:g} CPUs, but the cluster has {available_cpus:g}",
                      fix)

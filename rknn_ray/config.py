"""Run configuration: YAML file + ``--set dotted.key=value`` overrides, validated
once, up front, so a bad value fails before data loads or Ray starts.

``load_config`` returns a frozen :class:`Config` with one frozen dataclass per
section (``cfg.privacy.eps``, ``cfg.rounds.count``); ``cfg.to_dict()`` is the plain
nested dict written to config.yaml and report.json, and ``cfg.with_overrides({...})``
derives a changed, re-validated copy. ``load_config`` takes a file's path or a dict.

Each key is declared once, as a field of its section written with
:func:`rknn_ray.keyspec.key`: default, doc, type, range or choices. The validator and the
generated reference (docs/configuration.md) read that declaration; a key that is not there
is a typo and is rejected with the closest known key. Choices that a module owns (encoders,
mechanisms, bounds) are read from it when a value is checked; the student's keys live in
rknn_ray/student/config.py. Nothing here imports torch, faiss or Ray. Rules that tie keys
together (k <= s, dirichlet needs a record bound, delta per trust model) are explicit checks
below, each naming the problem and the fix.

Free-form sections (``privacy.options``, ``data.synthetic``, ``cluster.placement``) are
merged key by key (file, then each override); a key set to null is dropped (its default
applies again) and the whole section set to null is emptied. Their keys are checked against
what the code reads.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import inspect
import math
import os
from dataclasses import dataclass

import yaml

from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import Spec, check_number, key, spec_of
from rknn_ray.student.config import LABEL_TYPES, StudentSection

__all__ = ["Config", "ConfigError", "DEFAULTS", "KNOWN_KEYS", "load_config", "parse_override",
           "protocol_cpus", "specs", "validate_resources", "validate_with_data"]


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


# ---------------------------------------------------------------------- what single keys accept

def _owned(module: str, name: str):
    """Choices the module that acts on them owns, imported only when a value is checked."""
    def names() -> tuple:
        value = getattr(importlib.import_module(module), name)
        return tuple(value() if callable(value) else value)
    return names


def _upper_bounds() -> tuple:
    from rknn_ray.accounting import BOUNDS
    return tuple(sorted(b for b in BOUNDS if BOUNDS[b].kind == "upper"))


def _query_selections() -> tuple:
    from rknn_ray.labeling.queries import ADAPTIVE_SELECTORS, NEXT_ROUND_SELECTORS
    return (*NEXT_ROUND_SELECTORS, *ADAPTIVE_SELECTORS)


def _mechanisms_per_model() -> str:
    from rknn_ray.mechanisms import available
    return "per `privacy.model`: " + "; ".join(
        f"{model}: " + " \\| ".join(f"`{m}`" for m in names) for model, names in available().items())


def _dataset(value, path, spec):
    from rknn_ray.data import canonical_name
    try:
        return canonical_name(value)
    except ConfigError as exc:
        raise ConfigError(path, exc.problem, exc.fix) from None


def _classes(value, path, spec):
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or len(value) < 2
            or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value)
            or len(set(map(str, value))) != len(value)):
        raise ConfigError(path, f"{value!r} is not a list of two or more distinct class names",
                          "write data.classes: [cat, dog] or [0, 1, 2] (label order), or null")
    return list(value)


def _shape(value, path, spec):
    if value is None:
        return None
    if (not isinstance(value, (list, tuple)) or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConfigError(path, f"{value!r} is not a list of positive integers",
                          "write data.shape: [1, 28, 28] (channels, height, width), or null")
    return list(value)


def _folder_name(value, path, spec):
    if not isinstance(value, str) or not value.strip() or os.sep in value or "/" in value:
        raise ConfigError(path, f"{value!r} is not a plain folder name",
                          "set run.name to a non-empty name without '/' (it names runs/<name>-<time>)")
    return value


def _path_or_null(fix: str):
    def check(value, path, spec):
        if value is not None and not isinstance(value, str):
            raise ConfigError(path, f"{value!r} is not a path", fix)
        return value
    return check


def _absolute_or_null(value, path, spec):
    if value is not None and not (isinstance(value, str) and os.path.isabs(value)):
        raise ConfigError(path, f"{value!r} is not an absolute path (each shard opens it on its "
                          "own node, from its own working folder)",
                          "set cluster.key_store to an absolute folder on the shards' nodes, "
                          "or null for $TMPDIR/rknn-ray-keys-<uid>")
    return value


def _eps(value, path, spec):
    if isinstance(value, float) and math.isinf(value):
        raise ConfigError(path, "is infinite", "use a finite eps > 0 "
                          "(the report always includes the non-private reference)")
    value = spec.standard(value, path)
    if value < 1e-6:
        raise ConfigError(path, f"{value} is below 1e-6: its noise scale 2kr/eps "
                          "would dwarf any count", "use privacy.eps >= 1e-6")
    return value


# ---------------------------------------------------------------------- typed sections

#: the largest run.seed: faiss takes its k-means seed as a C int
SEED_MAX = 2 ** 31 - 1


@dataclass(frozen=True)
class RunConfig:
    name: str = key("run", "names the run folder runs/<name>-<time>", str, check=_folder_name,
                    accepts_text="a folder name without `/`")
    seed: int = key(0, "split / partition seed (and all randomness if rng=seeded); at most "
                    "2**31 - 1, a C int (faiss's k-means seed)", int, low=0, high=SEED_MAX)
    rng: str = key("secure", "secure (OS CSPRNG) or seeded (reproducible simulation)", str,
                   choices=_owned("rknn_ray.rng", "RNG_KINDS"))
    progress: bool = key(True, "bars or periodic lines on stderr; false: silent", bool)
    diagnostics: bool = key(False, "NOT PRIVATE: also label with exact counts, into diagnostics/",
                            bool)


@dataclass(frozen=True)
class DataConfig:
    dataset: str = key("digits", "digits is embedded; the others read data_root", str,
                       choices=_owned("rknn_ray.data.registry", "known"), check=_dataset)
    data_root: str | None = key(None, "the dataset's standard files (null: default place)", str,
                                nullable=True, accepts_text="a folder path, or null",
                                check=_path_or_null("set data.data_root to a folder path, or "
                                                    "null for the default location"))
    split: str = key("paper", "paper: paper 000's private/public/evaluation split", str,
                     choices=_owned("rknn_ray.data.splits", "RULES"))
    clients: int = key(100, "virtual clients the private records are partitioned over", int, low=1)
    partition: str = key("iid", "how private records are dealt to clients", str,
                         choices=_owned("rknn_ray.data.partition", "SCHEMES"))
    alpha: float = key(0.5, "Dirichlet concentration (partition=dirichlet)", float, low=0,
                       low_open=True)
    max_records_per_client: int | None = key(
        None, "public bound on a client's records (message sizes, allowances, auto s); records "
        "beyond it are dropped. null: ceil(records / clients) for iid, 1 for one_per_client; "
        "dirichlet must declare it (its record counts are private)", int, low=1, nullable=True)
    include_extra: bool = key(False, "SVHN: extra_32x32.mat joins the private train set", bool)
    synthetic: FrozenDict = key(None, "gaussian_mixture arguments", free_form=True,
                                factory=FrozenDict)
    # data.dataset: table (rknn_ray/data/kinds/table.py; docs/running.md, "Your own data")
    classes: tuple | None = key(None, "table: the class list, in label order (strings or ints); "
                                "null: the public file's schema metadata 'classes'",
                                check=_classes, accepts_text="a list of 2+ distinct names, or null")
    shape: tuple | None = key(None, "table: the features are an image of this shape, e.g. "
                              "[1, 28, 28]; uint8 pixels are scaled to [0, 1] (null: a table; standardize / one-hot)", check=_shape,
                              accepts_text="a list of positive integers, or null")
    private: FrozenDict = key(None, "table: {path, label, client, holders, features}: the private "
                              "records (client: the holder id column, with holders: the declared "
                              "number of holders; none: one record per client)",
                              free_form=True, factory=FrozenDict)
    public: FrozenDict = key(None, "table: {path, id, features}: the unlabelled public rows "
                             "(id: the row id column labels.parquet is keyed by)",
                             free_form=True, factory=FrozenDict)
    evaluation: FrozenDict = key(None, "table: {path, label, features}: an optional labelled "
                                 "evaluation set", free_form=True, factory=FrozenDict)


@dataclass(frozen=True)
class RepresentConfig:
    encoder: str = key("pca", "fitted on public data only", str,
                       choices=_owned("rknn_ray.representation.represent", "ENCODERS"))
    dim: int = key(32, "output dimension (PCA components)", int, low=1)
    whiten: bool = key(False, "PCA whitening", bool)
    # the learned encoder (simclr, rknn_ray.representation.contrastive): trained on public data only, cached
    epochs: int = key(15, "simclr training epochs (public data only)", int, low=1)
    batch_size: int = key(256, "simclr batch size", int, low=2)
    flip: bool = key(True, "left-right mirror augmentation (false for digits)", bool)
    backbone: str = key("auto", "simclr backbone (resnet: 32x32, GPU)", str,
                        choices=("auto", "cnn", "resnet"))
    trainer: str = key("ray", "simclr (and the semi student): ray (one-worker Ray Train) | local",
                       str, choices=("ray", "local"))
    cache_dir: str | None = key(None, "null: $RKNN_RAY_CACHE/encoders or "
                                "~/.cache/rknn-ray/encoders", str, nullable=True,
                                accepts_text="a folder path, or null",
                                check=_path_or_null("set a folder path or null"))


@dataclass(frozen=True)
class QueriesConfig:
    s: int | str = key(100, "queries; auto: rknn_ray.labeling.autotune from n, eps and public data", int,
                       low=1, auto=True)
    restarts: int = key(3, "faiss k-means restarts", int, low=1)
    niter: int = key(25, "faiss k-means iterations", int, low=1)
    use_nearest_public: bool = key(False, "snap each centre to its nearest public sample", bool)


@dataclass(frozen=True)
class RknnConfig:
    k: int | str = key(1, "queries each record connects to; auto: with queries.s: auto", int,
                       low=1, auto=True)
    r: int = key(1, "label bits a record votes (r-hot); sensitivity is 2kr", int, low=1)
    connection: str = key("reverse_knn", "which k queries a record votes for: reverse_knn, or a "
                          "balanced rule priced on public data (still 2kr); auto: from public "
                          "degrees and the noise (docs/running.md)", str,
                          choices=_owned("rknn_ray.labeling.connection", "CHOICES"))
    reweight: str = key("public", "what a balanced rule's prices balance: public (the public "
                        "samples) or released (from round 2 on, the public samples reweighted "
                        "by the counts released so far: post-processing, rounds.count >= 2)",
                        str, choices=("public", "released"))


@dataclass(frozen=True)
class PrivacyConfig:
    model: str = key("central", "trust model: who adds the noise", str,
                     choices=_owned("rknn_ray.mechanisms", "available"))
    mechanism: str = key("laplace", "see the README's trust-model table", str,
                         accepts_text=_mechanisms_per_model)     # checked per model, below
    eps: float = key(1.0, "the job's total eps, record level, replace-one", float, low=0,
                     low_open=True, check=_eps, accepts_text="number in [1e-06, inf)")
    delta: float = key(0.0, "the job's total delta (shuffle: below 1/n; central, local: 0)", float,
                       low=0, high=1, high_open=True)
    noise: str = key("discrete", "central: discrete (exact) or continuous (paper's)", str,
                     choices=_owned("rknn_ray.mechanisms.central", "NOISE_KINDS"))
    multi_record: str = key("sample", "local/shuffle, clients with several records", str,
                            choices=_owned("rknn_ray.mechanisms.randomized_response",
                                           "MULTI_RECORD"))
    options: FrozenDict = key(None, "mechanism tuning (see below)", free_form=True,
                              factory=FrozenDict)
    budget_eps: float | None = key(None, "the records' eps budget across jobs (null: this job's "
                                   "eps)", float, low=0, low_open=True, nullable=True)
    budget_delta: float | None = key(None, "the records' delta budget across jobs, below 1/n "
                                     "(null: max(delta, 1/(10 n)))", float, low=0, high=1,
                                     high_open=True, nullable=True)
    accountant: str = key("basic", "composition: basic (sums) or pld", str,
                          choices=_owned("rknn_ray.accounting.ledger", "ACCOUNTANTS"))
    amplification_bound: str = key("clones_numerical", "shuffle, single message: the "
                                   "amplification bound", str, choices=_upper_bounds)
    honest_fraction: float | None = key(None, "shuffle: share of senders assumed to follow the "
                                        "protocol (null: 0.5 for multi, 1.0 single message; "
                                        "docs/threat-model.md)", float, low=0, high=1,
                                        low_open=True, nullable=True)


@dataclass(frozen=True)
class ShuffleConfig:
    min_senders: int | None = key(None, "sender floor above what the target needs", int, low=1,
                                  nullable=True)
    onion_layers: int = key(0, "N chained shufflers, each peeling its own layer", int, low=0,
                            high=8)
    dropout: float = key(0.0, "simulated fraction of clients that never send", float, low=0,
                         high=1, high_open=True)
    distributed_above: int | None = key(5_000_000, "above: a distributed sort", int, low=1,
                                        nullable=True)
    max_messages_per_client: int | None = key(64, "multi-message + queries.s auto: caps s so a "
                                              "client sends at most this many (expected)", int,
                                              low=2, nullable=True)


@dataclass(frozen=True)
class LabelsConfig:
    type: str = key("hard", "hard (argmax) or soft (normalized counts) targets", str,
                    choices=LABEL_TYPES)
    train_on: str = key("public", "train on propagated public labels, or on the queries only",
                        str, choices=("public", "queries"))
    smooth: int | str = key(1, "public-graph neighbours for denoising (1: off); auto: "
                            "rknn_ray.labeling.denoise decides", int, low=1, auto=True)


@dataclass(frozen=True)
class ClusterConfig:
    shards: int = key(2, "ClientShard actors, each hosting many virtual clients", int, low=1)
    batch_clients: int = key(20000, "virtual clients per sealed Arrow batch", int, low=1)
    shard_cpus: float = key(0.5, "Ray CPUs per shard actor", float, low=0, low_open=True)
    server_cpus: float = key(0.25, "Ray CPUs of the Server actor", float, low=0, low_open=True)
    shuffler_cpus: float = key(0.25, "Ray CPUs per Shuffler actor", float, low=0, low_open=True)
    openers: int | None = key(None, "the Server's opener processes (null: none for a round of "
                              "under 20,000 expected messages, the Server opens them itself; "
                              "else one per CPU, at most 16)", int, low=0, high=64, nullable=True)
    window: int = key(16, "batches in flight per shard stream and in the Server", int, low=1,
                      high=1024)
    key_store: str | None = key(None, "absolute node-local folder for shard secrets (null: "
                                "$TMPDIR/rknn-ray-keys-<uid> on each shard's node)", str,
                                nullable=True, check=_absolute_or_null,
                                accepts_text="an absolute folder path, or null")
    placement: FrozenDict = key(None, "party (client | shuffler | server) -> the {resources, "
                                "labels} a node must have to host it; {}: any node",
                                free_form=True, factory=FrozenDict)
    precompute_keys: bool = key(True, "between rounds each shard makes the next round's "
                                "encapsulations (ephemeral X25519 + key derivation: data-free, "
                                "each used once) while the driver picks queries", bool)
    precompute_max: int = key(1 << 20, "encapsulations a shard holds ready at most (~150 bytes "
                              "each in memory)", int, low=0, high=1 << 26)


@dataclass(frozen=True)
class RoundsConfig:
    count: int = key(1, "T labeling rounds in one job", int, low=1, high=100)
    budget_split: str | tuple[float, ...] = key(
        "even", "or T fractions of (eps, delta), sum <= 1",
        accepts_text="`even`, or a list of `rounds.count` fractions in (0, 1] summing to <= 1")
    query_selection: str = key("farthest", "farthest | uncertain (rknn_ray/labeling/adaptive.py)", str,
                               choices=_query_selections)
    uncertainty: str = key("margin", "uncertain: margin | entropy", str,
                           choices=_owned("rknn_ray.labeling.adaptive", "UNCERTAINTY_RULES"))
    pool_factor: float = key(2.0, "uncertain: pick s among the pool_factor*s least certain",
                             float, low=1)
    split_queries: bool = key(False, "true: queries.s in total, divided over the rounds", bool)


SECTIONS = {"run": RunConfig, "data": DataConfig, "represent": RepresentConfig,
            "queries": QueriesConfig, "rknn": RknnConfig, "privacy": PrivacyConfig,
            "shuffle": ShuffleConfig, "labels": LabelsConfig, "student": StudentSection,
            "cluster": ClusterConfig, "rounds": RoundsConfig}


def specs() -> dict[str, Spec]:
    """``"section.key" -> Spec`` for every typed key, in declaration order."""
    return {f"{name}.{f.name}": spec_of(f) for name, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)}


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

    def with_overrides(self, overrides: "dict | list[str]") -> "Config":
        """A changed copy, validated again: ``{"privacy.eps": 0.5}`` (dotted keys, Python
        values) or ``["privacy.eps=0.5", ...]`` (``--set`` text, values read as YAML)."""
        if isinstance(overrides, dict):
            cfg = self.to_dict()
            for key, value in overrides.items():
                cfg = _merge(cfg, _nested(str(key), value))
            return _finish(cfg, None)
        return _finish(self.to_dict(), overrides)


def _build(cfg: dict) -> Config:
    """From a merged, validated dict."""
    parts = {}
    for name, section in SECTIONS.items():
        values = dict(cfg[name])
        for field_name, value in values.items():
            if isinstance(value, dict):
                values[field_name] = FrozenDict(value)
            elif isinstance(value, list):
                values[field_name] = tuple(value)
        parts[name] = section(**values)
    return Config(**parts)


# ---------------------------------------------------------------------- loading

#: The free-form sections, merged key by key.
FREE_FORM = {(name, f.name) for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)
             if spec_of(f).free_form}


def load_config(path: "str | os.PathLike | dict | None" = None,
                overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file (or a nested dict of sections) <- overrides, validated once: a
    frozen :class:`Config`."""
    if isinstance(path, dict):
        source = copy.deepcopy(path)          # validation normalizes in place: not the caller's
    elif isinstance(path, (str, os.PathLike)):
        source = None
    elif path is None:
        source = {}
    else:
        raise ConfigError("--config", f"a {type(path).__name__} is not a config",
                          "pass a YAML file's path or a dict of sections such as "
                          "{'privacy': {'eps': 1.0}}")
    try:
        if source is None:
            source = _read_yaml(os.fspath(path))
        return _finish(_merge(DEFAULTS, source), overrides)
    except RecursionError:        # a mapping nested thousands deep, in the file or an override
        raise ConfigError(os.fspath(path) if isinstance(path, (str, os.PathLike)) else "--set",
                          "is nested too deeply to be a config",
                          "write sections one level deep, as in jobs/configs/*.yaml") from None


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key written twice in one mapping (PyYAML keeps the
    last silently, so a config could say eps twice and mean the second)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue                      # '<<' merges are overridden on purpose
                name = self.construct_object(key_node, deep=True)
                try:
                    duplicate = name in seen
                    seen.add(name)
                except TypeError:                 # an unhashable key: SafeLoader says so itself
                    continue
                if duplicate:
                    raise ConfigError("--config", f"key '{name}' is set twice in one mapping "
                                      f"(line {key_node.start_mark.line + 1}); YAML would keep "
                                      "only the last", "delete one of the two")
        return super().construct_mapping(node, deep=deep)


def strict_yaml(text):
    """YAML text (or an open file) as :class:`StrictLoader` reads it."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


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
        value = strict_yaml(raw) if raw.strip() else None
    except ConfigError as exc:                # a key set twice
        raise ConfigError(key, exc.problem, exc.fix) from None
    except yaml.YAMLError as exc:
        raise ConfigError(key, f"value {raw!r} is not valid YAML ({str(exc).splitlines()[0]})",
                          "quote the value or write a list as [a, b]") from None
    return _nested(key, value)


def _nested(key: str, value) -> dict:
    """'a.b.c', value -> {'a': {'b': {'c': value}}}."""
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(key, "override key is empty or has an empty part",
                          "write a dotted key such as privacy.eps")
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
            loaded = strict_yaml(fh)
    except ConfigError as exc:                # a key set twice
        raise ConfigError(path, exc.problem, exc.fix) from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError("--config", f"{path} is not a valid YAML text file "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})", fix) from None
    except OSError as exc:
        raise ConfigError("--config", f"cannot read {path}: {exc.strerror}",
                          "check the file's permissions") from None
    if loaded is None or loaded == {}:     # it would run the default job, and spend its budget
        raise ConfigError("--config", f"{path} sets nothing (empty, or only comments)",
                          "write the sections to change, e.g. 'privacy: {eps: 1.0}'; " + fix)
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

#: privacy.options keys the mechanisms read, and what each accepts.
PRIVACY_OPTIONS = {
    "collision_l": Spec("Collision / separation: the output domain l, above k*r (unset: the "
                        "variance-optimal l)", int, low=2),
    "separation_split": Spec("separation: share f of eps for the query part (0.5, the paper's)",
                             float, low=0, high=1, low_open=True, high_open=True),
    "expected_dropout": Spec("shuffle multi: share of clients that may not send; the noise is "
                             "split over the rest", float, low=0, high=1, high_open=True),
    "dlap_share": Spec("shuffle multi: the DLap noise's share of the per-cell eps; the rest "
                       "pays for flooding: lower sends fewer messages, with more noise. Unset: "
                       "with queries.s auto under shuffle.max_messages_per_client, the one of "
                       "0.85, 0.7, 0.55 that allows the most queries; else 0.85",
                       float, low=0, high=1, low_open=True, high_open=True)}
#: Options the pipeline fills from a dedicated key (an options entry would override it).
SHADOWED_OPTIONS = {"noise": "privacy.noise", "multi_record": "privacy.multi_record",
                    "bound": "privacy.amplification_bound",
                    "honest_fraction": "privacy.honest_fraction"}


def synthetic_keys() -> dict[str, type]:
    """data.synthetic keys: gaussian_mixture's parameters, typed by their defaults."""
    return {name: type(default) for name, default in _synthetic_defaults().items()}


def _validate(cfg: dict) -> None:
    """Check every value of a merged dict against its key's declaration, normalizing it in
    place (names, numbers), then the rules that tie keys together."""
    for name, cls in SECTIONS.items():
        values = cfg[name]
        for f in dataclasses.fields(cls):
            values[f.name] = spec_of(f).validate(values[f.name], f"{name}.{f.name}")
    _check_relations(cfg)
    cfg["rounds"]["budget_split"] = _check_split(cfg["rounds"]["budget_split"], cfg["rounds"]["count"])
    _check_options(cfg)
    _check_synthetic(cfg)
    public = declared_public_size(cfg)
    if public is not None:
        _check_queries_fit(cfg["queries"]["s"], cfg["rounds"]["count"],
                           cfg["rounds"]["split_queries"], public)
    _check_table(cfg)
    cfg["cluster"]["placement"] = check_placement(cfg["cluster"]["placement"])


def _check_relations(cfg: dict) -> None:
    """The rules that tie keys together, each naming the problem and the fix."""
    d = cfg["data"]
    if d["include_extra"] and d["dataset"] != "svhn":
        raise ConfigError("data.include_extra", f"is only read for SVHN, not "
                          f"{d['dataset']!r}", "set data.include_extra: false")
    if d["partition"] == "dirichlet" and d["max_records_per_client"] is None:
        raise ConfigError("data.max_records_per_client", "partition=dirichlet deals records by "
                          "their private labels, so the largest client's record count is private; "
                          "the bound that sets message sizes, allowances and auto s must be public",
                          "declare it, e.g. data.max_records_per_client=<3 x records/clients>; "
                          "a client's records beyond it are dropped")
    p = cfg["privacy"]
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
    rk = cfg["rknn"]
    if rk["reweight"] == "released" and (rk["connection"] == "reverse_knn"
                                         or cfg["rounds"]["count"] < 2):
        raise ConfigError("rknn.reweight", "released reweights a balanced rule's prices by the "
                          "counts of earlier rounds: it needs rknn.connection balanced_min, "
                          "balanced_harmonic or auto and rounds.count >= 2",
                          "set rknn.reweight=public, or a balanced rknn.connection and "
                          "rounds.count=2")
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
        holder[i] = check_number(holder[i], f"rounds.budget_split[{i}]", float, 0, 1, low_open=True)
    if len(holder) != count or sum(holder) > 1 + 1e-12:
        raise ConfigError("rounds.budget_split", f"{list(split)!r} is not {count} positive "
                          "fractions summing to at most 1", fix)
    return holder


def _check_options(cfg: dict) -> None:
    options = cfg["privacy"]["options"]
    for opt in options:
        path = f"privacy.options.{opt}"
        if opt in SHADOWED_OPTIONS:
            raise ConfigError(path, f"is set by {SHADOWED_OPTIONS[opt]}",
                              f"write {SHADOWED_OPTIONS[opt]}=<value> instead")
        if opt not in PRIVACY_OPTIONS:
            raise _unknown(path, [f"privacy.options.{o}" for o in PRIVACY_OPTIONS],
                           f"known keys: {list(PRIVACY_OPTIONS)}")
        options[opt] = PRIVACY_OPTIONS[opt].standard(options[opt], path)
    c = (1 if cfg["rknn"]["k"] == "auto" else cfg["rknn"]["k"]) * cfg["rknn"]["r"]
    if options.get("collision_l", c + 1) <= c:
        raise ConfigError("privacy.options.collision_l", f"l = {options['collision_l']} must "
                          f"exceed k*r = {c} (the Collision mechanism's domain)",
                          f"set privacy.options.collision_l > {c}, or null for the variance-optimal l")


def _check_synthetic(cfg: dict) -> None:
    synthetic = cfg["data"]["synthetic"]
    known = synthetic_keys()
    for arg in synthetic:
        path = f"data.synthetic.{arg}"
        if arg not in known:
            raise _unknown(path, [f"data.synthetic.{k}" for k in known], f"known keys: {list(known)}")
        synthetic[arg] = check_number(synthetic[arg], path, int if known[arg] is int else float)
    if synthetic and cfg["data"]["dataset"] != "synthetic":
        raise ConfigError("data.synthetic", f"is only read for data.dataset=synthetic, not "
                          f"{cfg['data']['dataset']!r}", "set data.synthetic=null or data.dataset=synthetic")
    if cfg["data"]["dataset"] == "synthetic":
        _check_synthetic_memory({**_synthetic_defaults(), **synthetic})


def _synthetic_defaults() -> dict:
    from rknn_ray.data.synthetic import gaussian_mixture
    return {name: p.default for name, p in inspect.signature(gaussian_mixture).parameters.items()}


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _check_synthetic_memory(args: dict) -> None:
    """A mixture the driver cannot hold is refused here, not by a MemoryError (or minutes of
    QR on a 1e8-dimensional basis) once the job runs."""
    from rknn_ray.data.synthetic import footprint_bytes
    n, c, d = (int(args[k]) for k in ("num_samples", "num_classes", "dim"))
    need, have = footprint_bytes(n, c, d), physical_memory()
    if have and need > have:
        raise ConfigError("data.synthetic", f"num_samples={n:,} x dim={d:,} needs about "
                          f"{need / 2 ** 30:,.1f} GiB (the features held about three times), "
                          f"this machine has {have / 2 ** 30:.1f} GiB",
                          "lower data.synthetic.num_samples or data.synthetic.dim")


def declared_public_size(cfg: dict) -> int | None:
    """The public set's size where the config alone fixes it (digits' fixed pool, synthetic's
    num_samples; both split 'stratified' by either rule), so queries.s is checked before any
    data loads. A dataset read from files learns it when loaded (:func:`validate_with_data`)."""
    from rknn_ray.data.readers import DIGITS_RECORDS
    from rknn_ray.data.splits import stratified_public_count
    d = cfg["data"]
    if d["dataset"] == "digits":
        return stratified_public_count(DIGITS_RECORDS)
    if d["dataset"] == "synthetic":
        return stratified_public_count(int({**_synthetic_defaults(), **d["synthetic"]}["num_samples"]))
    return None


def _check_table(cfg: dict) -> None:
    """data.private / public / evaluation: their keys (rknn_ray.data.tables.PART_KEYS), and
    the rules of a table job."""
    from rknn_ray.data.tables import PART_KEYS
    from rknn_ray.data.registry import kind_of
    d = cfg["data"]
    table = kind_of(d["dataset"]).parts          # table, image_folder
    for part, keys in PART_KEYS.items():
        for k, v in d[part].items():
            path = f"data.{part}.{k}"
            if k not in keys:
                raise _unknown(path, [f"data.{part}.{x}" for x in keys], f"known keys: {list(keys)}")
            if k == "holders":
                if v is None:                   # unset
                    continue
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise ConfigError(path, f"{v!r} is not a number of holders", "declare the "
                                      "number of holders as a positive integer")
                continue
            ok = (isinstance(v, str) and v.strip() if k != "features" else
                  isinstance(v, str) or (isinstance(v, (list, tuple)) and v
                                         and all(isinstance(c, str) for c in v)))
            if not ok:
                raise ConfigError(path, f"{v!r} is not a column name" if k != "path" else
                                  f"{v!r} is not a path", "write a file / folder / glob path"
                                  if k == "path" else "write a column name (features: a list "
                                  "of columns or one list column)")
        if d[part] and not table:
            raise ConfigError(f"data.{part}", f"is only read for data.dataset=table (or "
                              f"image_folder), not {d['dataset']!r}",
                              f"set data.{part}=null or data.dataset=table")
    for k in ("classes", "shape"):
        if d[k] is not None and not table:
            raise ConfigError(f"data.{k}", f"is only read for data.dataset=table, not "
                              f"{d['dataset']!r}", f"set data.{k}=null or data.dataset=table")
    if not table:
        return
    if d["private"].get("client") and d["private"].get("holders") is None:
        raise ConfigError("data.private.holders", "is not declared: with data.private.client "
                          "each holder is a client, and how many holders the file holds is "
                          "private (a record's holder id is part of the record)",
                          "declare the number of holders, e.g. data.private.holders=3000; "
                          "calibration and reports use it, never the count in the file")
    if d["private"].get("holders") is not None and not d["private"].get("client"):
        raise ConfigError("data.private.holders", "is read only with data.private.client "
                          "(without it each record is a client and n is the record count)",
                          "set data.private.client to the holder id column, or unset "
                          "data.private.holders")
    if d["private"].get("client") and d["max_records_per_client"] is None:
        raise ConfigError("data.max_records_per_client", "data.private.client makes each holder "
                          "a client, and how many records the largest holds is private; the "
                          "bound that sets message sizes, allowances and auto s must be public",
                          "declare it, e.g. data.max_records_per_client=40; a holder's records "
                          "beyond it are dropped")
    if cfg["run"]["diagnostics"]:
        raise ConfigError("run.diagnostics", "needs the private rows in the driver, which "
                          "data.dataset=table never loads", "set run.diagnostics=false")


#: cluster.placement: the protocol's parties (rknn_ray/job/session.py) and what each may require of
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
        for part in PLACEMENT_KEYS:
            if not isinstance(need.get(part) or {}, dict):
                raise ConfigError(f"{path}.{part}", f"{need[part]!r} is not a mapping",
                                  f"write {part} as name: value pairs, {example}")
        resources = dict(need.get("resources") or {})
        for name in list(resources):
            where = f"{path}.resources.{name}"
            if not isinstance(name, str) or name in RESERVED_RESOURCES or name.startswith("node:"):
                raise ConfigError(where, "is not a custom resource name (CPUs have their own "
                                  "keys, cluster.shard_cpus / server_cpus / shuffler_cpus)",
                                  f"name a resource the node was started with, {example}")
            resources[name] = check_number(resources[name], where, float, 0, None, low_open=True)
        labels = dict(need.get("labels") or {})
        for label, value in labels.items():
            if not isinstance(label, str) or not isinstance(value, (str, int)) or isinstance(value, bool):
                raise ConfigError(f"{path}.labels.{label}", f"{value!r} is not a label value",
                                  "write labels as key: value strings, e.g. {rknn-party: client}")
            labels[label] = str(value)
        if resources or labels:
            out[party] = FrozenDict({"resources": FrozenDict(resources),
                                     "labels": FrozenDict(labels)})
    return out


# ---------------------------------------------------------------------- after loading

def _check_queries_fit(s, count: int, split_queries: bool, public_size: int) -> None:
    """Every round picks s public samples that are not yet queries: they must exist."""
    if s == "auto":
        s = 1
    if s > public_size:
        raise ConfigError("queries.s", f"s = {s} exceeds the {public_size} public samples",
                          f"set queries.s <= {public_size}")
    if split_queries:            # s in total over the rounds (round_query_counts)
        count = 1
    if s * count > public_size:
        raise ConfigError("rounds.count", f"{count} rounds of s = {s} new queries need "
                          f"{s * count} public samples (every round picks s public samples "
                          f"that are not yet queries), there are {public_size}",
                          f"lower rounds.count to <= {public_size // s} or queries.s to <= "
                          f"{max(1, public_size // count)}")


def check_public_size(cfg: Config, public_size: int) -> None:
    """queries.s and rounds.count against a public set of ``public_size`` samples."""
    _check_queries_fit(cfg.queries.s, cfg.rounds.count, cfg.rounds.split_queries, public_size)


def validate_with_data(cfg: Config, public_size: int, num_private: int, num_classes: int,
                       partitioned: bool = True) -> None:
    """The checks that need the loaded data (s <= public size, clients <= records, r <= |Y|,
    delta < 1/n in the shuffle model). ``partitioned``: data.clients deals the records (not
    for tables, whose clients come from the data)."""
    check_public_size(cfg, public_size)
    if partitioned and cfg.data.partition != "one_per_client" and cfg.data.clients > num_private:
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
    """CPUs the protocol's actors reserve (rknn_ray/job/session.py): every ClientShard
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

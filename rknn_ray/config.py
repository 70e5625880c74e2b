"""Run configuration: YAML file + ``--set dotted.key=value`` overrides, validated
once, up front, so a bad value fails before data loads or Ray starts.

``load_config`` returns a frozen :class:`Config` with one frozen dataclass per
section (``cfg.privacy.eps``, ``cfg.rounds.count``); ``cfg.to_dict()`` is the plain
nested dict written to config.yaml and report.json, and ``cfg.with_overrides({...})``
derives a changed, re-validated copy. ``load_config`` takes a file's path or a dict.

Each key is declared once, as a field of its section written with
:func:`rknn_ray.keyspec.key`: default, doc, type, range or choices. Each package owns its
sections (``rknn_ray/<package>/config.py``: data, representation, labeling, mechanisms,
student), and the rules that tie their keys together (k <= s, dirichlet needs a record
bound, delta per trust model), each naming the problem and the fix; this module composes
them, and holds the job's own ``run`` and ``cluster`` sections (the job layer reads them,
and sits above the library). The validator and the generated reference
(docs/configuration.md) read the declarations; a key that is not there is a typo and is
rejected with the closest known key. Choices that a module owns (encoders, mechanisms,
bounds) are read from it when a value is checked. Nothing here imports torch, faiss or Ray.

Free-form sections (``privacy.options``, ``data.synthetic``, ``cluster.placement``) are
merged key by key (file, then each override); a key set to null is dropped (its default
applies again) and the whole section set to null is emptied. Their keys are checked against
what the code reads.
"""
from __future__ import annotations

import copy
import glob
import dataclasses
import os
from dataclasses import dataclass

import yaml

from rknn_ray.remote.config import RemoteConfig, check_remote
from rknn_ray.data.config import (DataConfig, check_data_relations, check_declared_public_size,
                                  check_synthetic, check_table)
from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import FrozenDict, Spec, check_number, key, owned, spec_of, unknown_key
from rknn_ray.labeling.config import (LabelsConfig, QueriesConfig, RknnConfig, RoundsConfig,
                                      check_budget_split, check_query_relations)
from rknn_ray.mechanisms.config import (PrivacyConfig, ShuffleConfig, check_options,
                                        check_privacy_relations)
from rknn_ray.representation.config import RepresentConfig
from rknn_ray.student.config import StudentSection

__all__ = ["Config", "ConfigError", "DEFAULTS", "KNOWN_KEYS", "load_config", "parse_override",
           "specs"]


# ---------------------------------------------------------------------- what single keys accept

def _folder_name(value, path, spec):
    if not isinstance(value, str) or not value.strip() or os.sep in value or "/" in value:
        raise ConfigError(path, f"{value!r} is not a plain folder name",
                          "set run.name to a non-empty name without '/' (it names runs/<name>-<time>)")
    return value


def _absolute_or_null(value, path, spec):
    if value is not None and not (isinstance(value, str) and os.path.isabs(value)):
        raise ConfigError(path, f"{value!r} is not an absolute path (each shard opens it on its "
                          "own node, from its own working folder)",
                          "set cluster.key_store to an absolute folder on the shards' nodes, "
                          "or null for $TMPDIR/rknn-ray-keys-<uid>")
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
                   choices=owned("rknn_ray.rng", "RNG_KINDS"))
    progress: bool = key(True, "bars or periodic lines on stderr; false: silent", bool)
    diagnostics: bool = key(False, "NOT PRIVATE: also label with exact counts, into diagnostics/",
                            bool)


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
    holders: str = key("in_cluster", "where the holders run: in_cluster (client shards simulate "
                       "them) or remote (each holder its own process off the cluster, "
                       "reaching the shuffler service over HTTPS; the remote section)", str,
                       choices=("in_cluster", "remote"))
    precompute_max: int = key(1 << 20, "encapsulations a shard holds ready at most (~150 bytes "
                              "each in memory)", int, low=0, high=1 << 26)


SECTIONS = {"run": RunConfig, "data": DataConfig, "represent": RepresentConfig,
            "queries": QueriesConfig, "rknn": RknnConfig, "privacy": PrivacyConfig,
            "shuffle": ShuffleConfig, "labels": LabelsConfig, "student": StudentSection,
            "cluster": ClusterConfig, "rounds": RoundsConfig, "remote": RemoteConfig}


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
    remote: RemoteConfig

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
    return relative_to(loaded, os.path.dirname(os.path.abspath(path)))


#: the config keys that name the user's data files (resolved against the config's folder)
DATA_PATH_PARTS = ("private", "public", "evaluation")


def relative_to(loaded: dict, folder: str) -> dict:
    """``loaded`` with each relative ``data.<part>.path`` resolved against ``folder`` (the
    config file's), so a config finds its data from any working folder; a path found only
    from the working folder (a config written before) is left as given. URIs and absolute
    paths are left alone."""
    data = loaded.get("data")
    if not isinstance(data, dict):
        return loaded
    for part in DATA_PATH_PARTS:
        section = data.get(part)
        path = section.get("path") if isinstance(section, dict) else None
        if not isinstance(path, str) or not path or "://" in path or os.path.isabs(path):
            continue
        candidate = os.path.join(folder, path)
        if os.path.exists(candidate) or (any(c in path for c in "*?[") and glob.glob(candidate)):
            section["path"] = os.path.normpath(candidate)
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


def _merge(base: dict, extra: dict, prefix: str = "") -> dict:
    """``base`` updated by ``extra``; sections recursively, free-form sections key by key."""
    out = copy.deepcopy(base)
    if not isinstance(extra, dict):
        raise ConfigError(prefix.rstrip(".") or "--config", f"expected a mapping, got {extra!r}",
                          "write sections as 'section: {key: value}'")
    for k, v in extra.items():
        path = f"{prefix}{k}"
        if path not in KNOWN_KEYS:
            raise unknown_key(path, KNOWN_KEYS, "see jobs/configs/*.yaml for the keys")
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

def _validate(cfg: dict) -> None:
    """Check every value of a merged dict against its key's declaration, normalizing it in
    place (names, numbers), then the rules that tie keys together."""
    for name, cls in SECTIONS.items():
        values = cfg[name]
        for f in dataclasses.fields(cls):
            values[f.name] = spec_of(f).validate(values[f.name], f"{name}.{f.name}")
    check_data_relations(cfg)
    check_privacy_relations(cfg)
    check_query_relations(cfg)
    cfg["rounds"]["budget_split"] = check_budget_split(cfg["rounds"]["budget_split"],
                                                       cfg["rounds"]["count"])
    check_options(cfg)
    check_synthetic(cfg)
    check_declared_public_size(cfg)
    check_table(cfg)
    cfg["cluster"]["placement"] = check_placement(cfg["cluster"]["placement"])
    check_remote(cfg)


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
            raise unknown_key(path, [f"cluster.placement.{p}" for p in PLACEMENT_PARTIES],
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

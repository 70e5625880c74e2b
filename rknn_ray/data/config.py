"""The run config's ``data`` section: every ``data.*`` key declared once, and the rules
that tie them together (SVHN's extra set, a dirichlet partition's record bound, the
synthetic mixture's keys and size, a table's parts). rknn_ray/config.py composes it.
"""
from __future__ import annotations

import inspect
import math
import os
from dataclasses import dataclass

from rknn_ray.data.checks import check_queries_fit
from rknn_ray.data.readers import DIGITS_RECORDS, canonical_name
from rknn_ray.data.registry import kind_of
from rknn_ray.data.splits import stratified_public_count
from rknn_ray.data.synthetic import footprint_bytes, gaussian_mixture
from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import FrozenDict, check_number, key, owned, path_or_null, unknown_key


def _dataset(value, path, spec):
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


#: keys of data.clip (the domain of private feature values; docs/threat-model.md)
CLIP_KEYS = {"margin": "the public rows' range of each numeric column, widened by this fraction "
                       "of its width on each side, bounds every private value (default 0.1; 0: "
                       "the public range itself)",
             "bounds": "column -> [low, high]: bounds from the config for these columns (a "
                       "list column: one pair for all its values), instead of the public range"}


def _clip(value, path, spec):
    """data.clip: {margin: number >= 0, bounds: {column: [low, high]}}, checked and normalized
    (the columns are checked against the public part when it is read)."""
    example = "write data.clip: {margin: 0.1} or {bounds: {age: [0, 120]}}, or leave it unset"
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ConfigError(path, f"{value!r} is not a mapping", example)
    for k in value:
        if k not in CLIP_KEYS:
            raise unknown_key(f"{path}.{k}", [f"{path}.{x}" for x in CLIP_KEYS],
                              f"known keys: {list(CLIP_KEYS)}")
    out = {}
    if value.get("margin") is not None:
        out["margin"] = check_number(value["margin"], f"{path}.margin", float, 0, 1e6)
    bounds = value.get("bounds")
    if bounds is not None:
        if not isinstance(bounds, dict):
            raise ConfigError(f"{path}.bounds", f"{bounds!r} is not a mapping of columns", example)
        checked_bounds = {}
        for col, pair in bounds.items():
            where = f"{path}.bounds.{col}"
            if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                    or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                               for v in pair)):
                raise ConfigError(where, f"{pair!r} is not [low, high]", "write two finite "
                                  "numbers, low below high, e.g. [0, 120]")
            lo, hi = float(pair[0]), float(pair[1])
            if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
                raise ConfigError(where, f"[{pair[0]}, {pair[1]}] is not a range (two finite "
                                  "numbers, low below high)", "write e.g. [0, 120]")
            checked_bounds[str(col)] = [lo, hi]
        out["bounds"] = FrozenDict(checked_bounds)
    return FrozenDict(out)


@dataclass(frozen=True)
class DataConfig:
    dataset: str = key("digits", "digits is embedded; the others read data_root", str,
                       choices=owned("rknn_ray.data.registry", "known"), check=_dataset)
    name: str | None = key(None, "your name for these records, shown by rknn-ray budget and in "
                           "report.json beside the source (public: never taken from the data; "
                           "null: '<dataset>: record pool')", str, nullable=True,
                           accepts_text="a short name, or null")
    data_root: str | None = key(None, "the dataset's standard files (null: default place)", str,
                                nullable=True, accepts_text="a folder path, or null",
                                check=path_or_null("set data.data_root to a folder path, or "
                                                    "null for the default location"))
    split: str = key("paper", "paper: paper 000's private/public/evaluation split", str,
                     choices=owned("rknn_ray.data.splits", "RULES"))
    clients: int = key(100, "virtual clients the private records are partitioned over", int, low=1)
    partition: str = key("iid", "how private records are dealt to clients", str,
                         choices=owned("rknn_ray.data.partition", "SCHEMES"))
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
                              "records (client: the holder id column; holders: optional, the "
                              "number of holders you expect, checked against the data; none: "
                              "one record per client)",
                              free_form=True, factory=FrozenDict)
    public: FrozenDict = key(None, "table: {path, id, features}: the unlabelled public rows "
                             "(id: the row id column labels.parquet is keyed by)",
                             free_form=True, factory=FrozenDict)
    evaluation: FrozenDict = key(None, "table: {path, label, features}: an optional labelled "
                                 "evaluation set", free_form=True, factory=FrozenDict)
    clip: FrozenDict = key(None, "table: {margin, bounds}: the domain of private feature "
                           "values; each numeric value is clipped to its column's bounds (the "
                           "public range widened by margin=0.1 of its width on each side, or "
                           "bounds: {column: [low, high]}); NaN / infinite values are refused",
                           free_form=True, factory=FrozenDict, check=_clip,
                           accepts_text="mapping (see below)")


def synthetic_keys() -> dict[str, type]:
    """data.synthetic keys: gaussian_mixture's parameters, typed by their defaults."""
    return {name: type(default) for name, default in _synthetic_defaults().items()}


def check_data_relations(cfg: dict) -> None:
    """The data keys that only hold together (a merged, checked config dict)."""
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


def check_synthetic(cfg: dict) -> None:
    synthetic = cfg["data"]["synthetic"]
    known = synthetic_keys()
    for arg in synthetic:
        path = f"data.synthetic.{arg}"
        if arg not in known:
            raise unknown_key(path, [f"data.synthetic.{k}" for k in known], f"known keys: {list(known)}")
        synthetic[arg] = check_number(synthetic[arg], path, int if known[arg] is int else float)
    if synthetic and cfg["data"]["dataset"] != "synthetic":
        raise ConfigError("data.synthetic", f"is only read for data.dataset=synthetic, not "
                          f"{cfg['data']['dataset']!r}", "set data.synthetic=null or data.dataset=synthetic")
    if cfg["data"]["dataset"] == "synthetic":
        _check_synthetic_memory({**_synthetic_defaults(), **synthetic})


def _synthetic_defaults() -> dict:
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
    data loads. A dataset read from files learns it when loaded
    (:func:`rknn_ray.data.checks.validate_with_data`)."""
    d = cfg["data"]
    if d["dataset"] == "digits":
        return stratified_public_count(DIGITS_RECORDS)
    if d["dataset"] == "synthetic":
        return stratified_public_count(int({**_synthetic_defaults(), **d["synthetic"]}["num_samples"]))
    return None


def check_table(cfg: dict) -> None:
    """data.private / public / evaluation: their keys (rknn_ray.data.tables.PART_KEYS), and
    the rules of a table job."""
    from rknn_ray.data.tables import PART_KEYS      # pyarrow: only when checked
    d = cfg["data"]
    table = kind_of(d["dataset"]).parts          # table, image_folder
    for part, keys in PART_KEYS.items():
        for k, v in d[part].items():
            path = f"data.{part}.{k}"
            if k not in keys:
                raise unknown_key(path, [f"data.{part}.{x}" for x in keys], f"known keys: {list(keys)}")
            if k == "sites":
                continue                        # checked below (check_sites)
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
    if d["clip"] and not table:
        raise ConfigError("data.clip", f"is only read for data.dataset=table (or image_folder), "
                          f"not {d['dataset']!r}", "set data.clip=null or data.dataset=table")
    for k in ("classes", "shape"):
        if d[k] is not None and not table:
            raise ConfigError(f"data.{k}", f"is only read for data.dataset=table, not "
                              f"{d['dataset']!r}", f"set data.{k}=null or data.dataset=table")
    if d["private"].get("sites") is not None and d["dataset"] != "table":
        raise ConfigError("data.private.sites", f"is only read for data.dataset=table, not "
                          f"{d['dataset']!r}", "give the private part one path "
                          "(data.private.path), or set data.dataset=table")
    if not table:
        return
    check_sites(d["private"])
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


#: keys of one site of data.private.sites (docs/running.md, "Private data on its holders' nodes")
SITE_KEYS = ("path", "labels", "resources", "shards")
#: resources with their own keys or that Ray manages itself (as cluster.placement's)
_RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")


def check_sites(private: dict) -> None:
    """data.private.sites: site name -> {path, labels, resources, shards}, instead of one
    data.private.path; normalized in place (labels as text, resources as numbers)."""
    sites = private.get("sites")
    if sites is None:
        return
    example = ("e.g. data.private.sites={a: {path: /data/private, labels: {site: a}}} (the node "
               "joins with `ray start --address=<head> --labels site=a`)")
    if not isinstance(sites, dict) or not sites:
        raise ConfigError("data.private.sites", f"{sites!r} is not a mapping of site names",
                          f"write {example}")
    if private.get("path") is not None:
        raise ConfigError("data.private.path", "is set beside data.private.sites (one path "
                          "every client node reads, or a path per site, not both)",
                          "unset data.private.path, or data.private.sites")
    if not private.get("client"):
        raise ConfigError("data.private.client", "is not set, and data.private.sites needs it "
                          "(a site holds its holders' records; each holder is one client)",
                          "set data.private.client to the holder id column")
    for name, site in sites.items():
        path = f"data.private.sites.{name}"
        if not isinstance(name, str) or not name.replace("_", "").replace("-", "").isalnum():
            raise ConfigError(path, "is not a site name (letters, digits, - and _)",
                              f"name the site in those characters, {example}")
        if not isinstance(site, dict) or set(site) - set(SITE_KEYS):
            extra = sorted(set(site) - set(SITE_KEYS)) if isinstance(site, dict) else None
            raise ConfigError(f"{path}.{extra[0]}" if extra else path,
                              "is not a key of a site" if extra else f"{site!r} is not a "
                              f"mapping of {list(SITE_KEYS)}", f"a site's keys are "
                              f"{list(SITE_KEYS)}, {example}")
        where = site.get("path")
        if not isinstance(where, str) or not where.strip():
            raise ConfigError(f"{path}.path", f"{where!r} is not a path", "give the site's "
                              "file, folder or glob on its own node")
        if "://" not in where and not os.path.isabs(where):
            raise ConfigError(f"{path}.path", f"{where!r} is relative (it is read on the site's "
                              "own node, never here)", "give an absolute path on that node, "
                              "or a URI")
        for part in ("labels", "resources"):
            if not isinstance(site.get(part) or {}, dict):
                raise ConfigError(f"{path}.{part}", f"{site[part]!r} is not a mapping",
                                  f"write {part} as name: value pairs, {example}")
        resources = dict(site.get("resources") or {})
        for res in list(resources):
            if not isinstance(res, str) or res in _RESERVED_RESOURCES or res.startswith("node:"):
                raise ConfigError(f"{path}.resources.{res}", "is not a custom resource name",
                                  "name a resource the site's node was started with "
                                  "(`ray start --resources '{\"site_a\": 1}'`)")
            resources[res] = check_number(resources[res], f"{path}.resources.{res}", float, 0,
                                          None, low_open=True)
        labels = dict(site.get("labels") or {})
        for label, value in labels.items():
            if not isinstance(label, str) or not isinstance(value, (str, int)) \
                    or isinstance(value, bool):
                raise ConfigError(f"{path}.labels.{label}", f"{value!r} is not a label value",
                                  "write labels as key: value strings, e.g. {site: a}")
            labels[label] = str(value)
        if not resources and not labels:
            raise ConfigError(path, "names no node labels or resources: its shards could run "
                              "on any node, where its path is not its part",
                              f"name the node(s) the site's files live on, {example}")
        shards = site.get("shards", 1)
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ConfigError(f"{path}.shards", f"{shards!r} is not a number of shards",
                              "give a positive integer (default 1)")
        sites[name] = {"path": where, "labels": labels, "resources": resources,
                       "shards": shards}


def check_declared_public_size(cfg: dict) -> None:
    """queries.s and rounds.count against the public set where the config fixes its size."""
    public = declared_public_size(cfg)
    if public is not None:
        check_queries_fit(cfg["queries"]["s"], cfg["rounds"]["count"],
                          cfg["rounds"]["split_queries"], public)

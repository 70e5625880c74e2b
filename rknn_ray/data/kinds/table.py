"""``data.dataset: table``: the user's own private, public and evaluation tables.

The driver reads the public part (and the evaluation part, when given): it fits the
featurizer on the public rows, keeps the public ids and, when the public file has the label
column, its labels (to measure label accuracy only). It never opens the private part:
:func:`prepare_table` returns a :class:`~rknn_ray.data.prepared.PendingScan`; the job runs
the scan (rknn_ray.data.table_scan) where the client shards run and completes it with the
answer (counts, keyed fingerprints, each shard's keyed digest, and where the scan left each
shard's rows); each shard then reads its own clients' rows from there, never the file
(rknn_ray.data.table_source), and checks them against that digest. Clients are
the data's holders (``data.private.client``) or one per record. Under the job's neighbour
relation (a record's value replaced; which holders take part and how many records each
holds are public) the number of holders is read from the data (``data.private.holders``,
when given, is checked against it). The per-holder record bound is declared; the class list
is declared (``data.classes``) or in the public file's schema metadata (key ``classes``, a
JSON list), never taken from the private labels.
"""
from __future__ import annotations

import functools
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rknn_ray.accounting.source_identity import FINGERPRINT_DTYPE
from rknn_ray.data.registry import register_dataset
from rknn_ray.data.tables import (Columns, Featurizer, Part, as_table, bucket_of,
                                  feature_matrix, label_indices, missing, pixel_scale,
                                  read, sites_of)
from rknn_ray.errors import ConfigError, DataError


def _read(part: Part, memory) -> pa.Table:
    if memory is not None:
        return as_table(memory)
    if part.path is None:
        raise ConfigError(f"{part.key}.path", "is not set", f"set {part.key}.path to a parquet, "
                          "CSV or Arrow file, a folder of them or a glob")
    return read(part.path, what=part.key)


def class_list(cfg, public: pa.Table) -> tuple:
    """data.classes, else the public file's schema metadata; never the private labels."""
    if cfg.data.classes:
        return tuple(cfg.data.classes)
    meta = (public.schema.metadata or {}).get(b"classes")
    if meta:
        return tuple(json.loads(meta))
    raise ConfigError("data.classes", "is not declared and the public data carries no class "
                      "list (schema metadata 'classes')", "declare data.classes: [...] (every "
                      "class name, in label order); it is never taken from the private labels")


def _columns_for(part: Part, schema, public: Columns) -> Columns:
    """The part's feature columns: its own ``features`` (as its schema types them; the same
    number of values as a public record, checked when read), else the public part's."""
    return Columns.resolve(part, schema, ()) if part.features else public


def prepare_table(cfg, inputs: dict, private_layout: str | None = None):
    """The job's data from the user's parts (module docstring): public and evaluation read
    here, the private part only scanned (its own process) and left to the shards."""
    # the registry imports every kind at its first lookup: what only preparing a table
    # needs (prepared data, the scan process, fingerprints) loads when one is prepared
    from rknn_ray.data.prepared import PendingScan
    from rknn_ray.data.table_scan import ScanSpec
    d = cfg.data
    parts = {name: Part.of(name, getattr(d, name)) for name in ("private", "public", "evaluation")}
    priv, pub, ev = parts["private"], parts["public"], parts["evaluation"]
    if priv.label is None:
        raise ConfigError("data.private.label", "is not set", "name the private label column, "
                          "e.g. data.private.label=label")
    sites = sites_of(d.private)
    remote = cfg.cluster.holders == "remote"      # each holder reads its own rows, off the cluster
    if priv.path is None and inputs.get("private") is None and not sites and not remote:
        raise ConfigError("data.private.path", "is not set", "set data.private.path to the "
                          "private records' file, folder or glob")
    if sites and inputs.get("private") is not None:
        raise ConfigError("data.private.sites", "is set and private rows are given in memory "
                          "(they are in this process, on no site)", "unset data.private.sites, "
                          "or give the rows on their sites' nodes instead of in memory")
    public = _read(pub, inputs.get("public"))
    labelled = priv.label in public.schema.names
    if labelled and pub.id is None:
        raise DataError(f"data.public: the public data has a label column {priv.label!r} but "
                        "data.public.id is not set. Fix: set data.public.id to its row-id column "
                        "(labels.parquet is keyed by it), or drop the label column")
    missing(pub, public.schema, [pub.id])
    classes = class_list(cfg, public)
    if len(set(map(str, classes))) != len(classes) or len(classes) < 2:
        raise ConfigError("data.classes", f"{list(classes)} is not two or more distinct classes",
                          "list every class once")
    cols = Columns.resolve(pub, public.schema, {pub.id, priv.label, priv.client})
    raw_pub = feature_matrix(public, cols, pub)
    if len(raw_pub) == 0:
        raise DataError(f"data.public: {pub.path or 'the public data'} holds no rows. Fix: point "
                        "data.public.path at the unlabelled public rows")
    width = int(raw_pub.shape[1])
    shape = tuple(d.shape) if d.shape else None
    if shape is not None and int(np.prod(shape)) != width:
        raise ConfigError("data.shape", f"{list(shape)} holds {int(np.prod(shape))} values, a "
                          f"record has {width}", f"set data.shape to a shape of {width} values")
    # the private values' domain (data.clip): bounds from the public rows or the config,
    # checked here on public facts only (docs/threat-model.md, "The domain of a record's value")
    featurizer = Featurizer(cols, shape, scale=pixel_scale(public.schema, cols) if shape
                            else 1.0).fit(raw_pub, d.clip)
    public_x = featurizer(raw_pub)
    if not np.isfinite(public_x).all():
        raise DataError("data.public: rows with NaN or infinite features. Fix: drop or impute them")
    public_y = label_indices(public, priv.label, classes, pub) if labelled else \
        np.full(len(public_x), -1, np.int64)
    public_ids = None
    if pub.id is not None:
        public_ids = public.column(pub.id).to_numpy(zero_copy_only=False)
        if pc.count_distinct(public.column(pub.id)).as_py() != len(public_ids):
            raise DataError(f"data.public: ids in {pub.id!r} are not unique. Fix: give every "
                            "public row its own id")
    # a table's record pool (its budget's source) is its private part only: the public and
    # evaluation files are read here in the clear and nothing the job releases protects
    # them, so two private tables that share only those files are two sources
    eval_x, eval_y = _evaluation(ev, inputs.get("evaluation"), cols, featurizer, width,
                                 classes, priv.label)
    bound = int(d.max_records_per_client) if priv.client else 1
    spec = ScanSpec(priv, cols, tuple(str(c) for c in classes), int(cfg.cluster.shards), width,
                    featurizer, bound, private_layout)
    memory = inputs.get("private")
    public_side = dict(public_x=public_x, public_y=public_y, public_ids=public_ids,
                       eval_x=eval_x, eval_y=eval_y, classes=tuple(classes),
                       featurizer=featurizer, width=width,
                       table_input={"featurizer": featurizer.to_dict(), "id": pub.id,
                                    "label": ev.label or priv.label})
    handover = _Handover(None if memory is None else _private_table(priv, memory))
    return PendingScan(spec, handover.table, functools.partial(_scanned, cfg, spec, public_side,
                                                               handover), sites)


def _scanned(cfg, spec, public: dict, handover, found: dict):
    """The job's PreparedData from the scan's answer (rknn_ray.data.table_scan): counts,
    keyed fingerprints and each shard's keyed digest; never a private row."""
    # the registry imports every kind at its first lookup: loaded when a table is prepared
    from rknn_ray.data.checks import validate_with_data
    from rknn_ray.data.prepared import PreparedData
    from rknn_ray.data.splits import Splits
    d, priv = cfg.data, spec.part
    m, holders = int(found["rows"]), int(found["holders"])
    if priv.client and priv.holders is not None and int(priv.holders) != holders:
        # which holders take part is public under the job's relation: a declared count is a check
        raise DataError(f"data.private.holders: declares {priv.holders} holders, the private "
                        f"data holds {holders}. Fix: unset data.private.holders (the count of "
                        "holders is public under the job's neighbour relation and read from "
                        "the data), or point data.private.path at the data you meant")
    priv_cols = Columns(**found["columns"])
    featurizer = public["featurizer"]
    image_shape = featurizer.output_shape
    validate_with_data(cfg, len(public["public_x"]), m, len(public["classes"]),
                       partitioned=False)
    splits = Splits(d.dataset, "table", cfg.run.seed,
                    np.broadcast_to(np.zeros((), np.float32), (m, *image_shape)),
                    np.broadcast_to(np.int64(-1), (m,)), public["public_x"], public["public_y"],
                    public["eval_x"], public["eval_y"], len(public["classes"]), image_shape,
                    public_ids=public["public_ids"], class_names=public["classes"],
                    table_input=public["table_input"])
    make = functools.partial(_shard_sources, handover, priv, priv_cols, spec.classes, featurizer,
                             found["clients"], found["shard_digests"], found["key"], spec.bound,
                             int(cfg.run.seed), public["width"], spec.shards,
                             found["kept_per_shard"], found.get("shard_sites"),
                             found.get("parts"))
    facts = {"holders": holders, "records": m, "kept": int(found["kept"]),
             "largest_holder": int(found["largest_holder"]), "bound": spec.bound,
             "column": priv.client}
    if found.get("sites"):       # per site: public under the relation (docs/threat-model.md)
        facts["sites"] = found["sites"]
    if cfg.privacy.multi_record == "each" and priv.client:
        facts["reports"] = "each kept record (privacy.multi_record=each)"
    data = PreparedData(splits, np.broadcast_to(np.int64(0), (m,)), len(public["classes"]),
                        image_shape, d.dataset, clients=holders if priv.client else m,
                        record_bound=spec.bound, kept_records=int(found["kept"]),
                        pool=np.zeros(0, FINGERPRINT_DTYPE),   # public parts: no one's budget
                        near_pool=np.zeros(0, FINGERPRINT_DTYPE),
                        pool_keyed=found["fingerprints"], near_keyed=found["near"],
                        private_digest=found["digest"], shard_sources=make, remote_private=True,
                        holders=facts, scan_nodes=found.get("scan_nodes"),
                        domain=featurizer.describe_domain())
    return data.records_as_clients() if cfg.privacy.multi_record == "each" else data


def _private_table(part: Part, memory) -> pa.Table:
    """Private rows given in memory as an Arrow table; a fault named without its value."""
    from rknn_ray.data.table_scan import private_read_error  # defers pyarrow's scan module
    try:
        return as_table(memory)
    except Exception as exc:  # noqa: BLE001 - pyarrow's messages quote cells
        raise private_read_error(part, exc, "reading the private rows given in memory") from None


def _evaluation(ev: Part, memory, cols: Columns, featurizer, width: int, classes, label: str):
    """(features, labels) of the evaluation part; without one, 0 rows."""
    if ev.path is None and memory is None:     # no labelled evaluation set
        return np.zeros((0, *featurizer.output_shape), np.float32), np.zeros(0, np.int64)
    evaluation = _read(ev, memory)
    missing(ev, evaluation.schema, [ev.label or label])
    ev_cols = _columns_for(ev, evaluation.schema, cols)
    missing(ev, evaluation.schema, ev_cols.names)
    raw = feature_matrix(evaluation, ev_cols, ev, width)
    if raw.shape[1] != width:
        raise DataError(f"data.evaluation: a record has {raw.shape[1]} feature values, a "
                        f"public one {width}. Fix: give every part the same features")
    y = label_indices(evaluation, ev.label or label, classes, ev)
    return featurizer(raw), y


class _Handover:
    """Private rows given in memory, held until they are dealt to the shards, then dropped."""

    def __init__(self, table):
        self.table = table

    def take(self):
        table, self.table = self.table, None
        return table


def _shard_sources(handover, part, cols, classes, featurizer, clients, digests, key, bound,
                   seed, width, shards, kept, shard_sites, parts, cfg, _requested):
    """One source per shard that holds a client (rknn_ray.data.table_source), each with the
    keyed digest of the rows the scan found for it and ``parts``, where the scan left each
    shard's rows (``.take(shard)``; rows given in memory are dealt here); under
    privacy.multi_record=each every record a holder keeps is a client of its own (``kept``:
    per shard). ``shard_sites`` (data.private.sites): per shard (its site, its index and count
    within the site): the shard takes its site's parts (``parts``: site name -> parts) by
    its index there, placed on the site's nodes."""
    each = cfg.privacy.multi_record == "each" and part.client is not None
    from rknn_ray.data.table_source import TableShardSource  # in the shard: pyarrow reading
    table = handover.take()
    buckets = None
    if table is not None and part.client:
        buckets = bucket_of(table.column(part.client), shards)[0]
    sources, lo = [], 0
    for shard, count in enumerate(kept if each else clients):
        if count == 0:
            continue
        rows = None
        if table is not None:
            rows = table.take(np.flatnonzero(buckets == shard)) if buckets is not None \
                else table.slice(sum(int(digests[i][0]) for i in range(shard)),
                                 int(digests[shard][0]))
        own_part, own_shard, own_shards, site, own_parts = part, shard, shards, None, parts
        if shard_sites:              # a site's shard: its site's part and parts, its index there
            site, own_shard, own_shards = shard_sites[shard]
            own_part, own_parts = part.at_site(site), parts[site.name]
        sources.append(TableShardSource(lo, lo + int(count), own_part, cols, classes, featurizer,
                                        own_shard, own_shards, bound, seed, width, rows,
                                        tuple(digests[shard]), key, each, site,
                                        None if table is not None else own_parts))
        lo += int(count)
    del table
    return sources


register_dataset("table", prepare=prepare_table, parts=True,
                 description="the user's own parquet / CSV / Arrow tables (docs/running.md)")

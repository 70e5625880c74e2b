"""The private split as one job prepares it: the dataset loaded, split, checked and dealt to
clients within the public per-client record bound.

Its own module (in the data layer, below the job that sequences the stages): the job
prepares it once, rknn_ray.job.stages wires it with the later stages and cuts each client
shard's records from it (rknn_ray.data.sources.PreparedShardSource); no shard prepares it
again.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from rknn_ray.data.checks import check_public_size, validate_with_data
from rknn_ray.data.partition import held_within_bound, partition, public_record_bound
from rknn_ray.data.readers import idx_test_count, load_dataset, validate_features
from rknn_ray.data.registry import kind_of
from rknn_ray.data.splits import make_splits, paper_mnist_public_count, paper_rule
from rknn_ray.errors import ConfigError


@dataclass
class PreparedData:
    splits: object              # rknn_ray.data.Splits
    client_ids: np.ndarray      # (m,) virtual client of each private record
    num_classes: int
    image_shape: tuple
    dataset: str
    clients: int | None = None          # public: the configured number of clients
    record_bound: int | None = None     # public: at most this many records per client
    held: np.ndarray | None = None      # (m,) records the clients keep (within the bound)
    # kinds whose private rows the driver never loads (rknn_ray/data/kinds/table.py): the
    # record pool's fingerprints (exact and near) and the private part's digest, computed where the rows were
    # read, and the shards' sources (each opens its own clients' rows)
    pool: np.ndarray | None = None
    near_pool: np.ndarray | None = None  # the pool's near fingerprints (source_identity)
    private_digest: str | None = None
    shard_sources: object = None        # (cfg, shards) -> [source], or None: cut from splits
    remote_private: bool = False        # splits.private_x / private_y are placeholders
    # the private part's fingerprints arrive keyed under the ledger's key (where read)
    pool_keyed: np.ndarray | None = None
    near_keyed: np.ndarray | None = None
    holders: dict | None = None         # a table's holder counts (public under the relation)
    kept_records: int | None = None     # a table's records kept within the bound (public)
    scan_nodes: dict | None = None      # data.private.sites: site -> the node its scan ran on
    domain: dict | None = None          # a table's value domain (Featurizer.describe_domain)
    # privacy.multi_record=each on data cut here: each record's own client before it became a
    # client of its own, and that client's bound (the shards pick and order the kept ones)
    owners: np.ndarray | None = None
    owner_bound: int | None = None

    @property
    def num_clients(self) -> int:
        """Public: the configured n (the partition gives every client a record), or the
        declared number of holders (a table with a client column)."""
        if self.clients is not None:
            return int(self.clients)
        return int(np.unique(self.client_ids).size)     # hand-built data (tests)

    @property
    def max_records_per_client(self) -> int:
        """Public: the declared / public bound (data.max_records_per_client), never the
        partition's actual largest client, which depends on private labels."""
        if self.record_bound is not None:
            return int(self.record_bound)
        return int(np.bincount(self.client_ids).max(initial=0))   # hand-built data (tests)

    def records_as_clients(self) -> "PreparedData":
        """privacy.multi_record=each: every record a client keeps becomes a client of its own
        (one report each); the number of clients is then the kept records' (public under the
        relation: each holder's record count is), at most one record each."""
        if self.shard_sources is not None:     # a table: its shards deal their own (table.py)
            kept = self.kept_records if self.kept_records is not None else self.num_clients
            return dataclasses.replace(self, clients=int(kept), record_bound=1)
        rows = self.held_rows()
        order = rows[np.argsort(self.client_ids[rows], kind="stable")]
        ids = np.full(len(self.client_ids), -1, np.int64)
        ids[order] = np.arange(order.size)    # each client's block; the shard fills it in
        held = np.zeros(len(self.client_ids), bool)     # its own secret order (sources.py)
        held[rows] = True
        return dataclasses.replace(self, client_ids=ids, clients=int(order.size), record_bound=1,
                                   held=held, owners=self.client_ids,
                                   owner_bound=self.max_records_per_client)

    def require_private_rows(self, what: str) -> None:
        """ConfigError when the private rows are not here (a table: only the shards read them)."""
        if self.remote_private:
                raise ConfigError("data.dataset", f"{what} needs the private rows in this process, "
                              "and data.dataset=table never loads them here (only the client "
                              "shards read them)", "run it on a built-in data set, or run the "
                              "private job (python -m jobs.distill)")

    def held_rows(self) -> np.ndarray:
        """Indices of the private records clients hold (all but those beyond the bound)."""
        m = len(self.client_ids)
        return np.arange(m) if self.held is None else np.flatnonzero(self.held)

    def public_counts(self) -> dict:
        """report.json's counts that come from the data: public ones only (the configured
        clients, the record count m, public under replace-one, the split sizes, the bound)."""
        sp = self.splits
        return {"clients": self.num_clients, "records": int(len(sp.private_y)),
                "public": int(len(sp.public_y)), "evaluation": int(len(sp.eval_y)),
                "max_records_per_client": self.max_records_per_client}

    def records_dropped(self) -> int:
        """PRIVATE (depends on the partition): records beyond the bound; diagnostics only."""
        return 0 if self.held is None else int((~self.held).sum())


@dataclass
class PendingScan:
    """A job's data whose private rows are not read yet (the user's tables): the public side
    is prepared; the private part's scan (rknn_ray.data.table_scan) runs where the shards run
    (rknn_ray/job/private_scan.py) and :meth:`complete` turns its answer into the job's
    :class:`PreparedData`. ``memory``: private rows given in memory (scanned in the driver)."""
    spec: object                        # rknn_ray.data.table_scan.ScanSpec
    memory: object                      # a pyarrow Table, or None: read from spec.part.path
    complete: object                    # (scan answer + "key") -> PreparedData
    # data.private.sites: (rknn_ray.data.tables.Site, ...): one scan per site, on the site's
    # node (rknn_ray/job/private_scan.py); (): one path every client node reads
    sites: tuple = ()

    def scan_here(self, key: bytes) -> PreparedData:
        """Scan in this process (data given in memory; tests): the answer, completed."""
        from rknn_ray.data.table_scan import HeldParts, scan   # pyarrow: only for tables
        parts = [] if self.memory is None else None      # read from files: the shards' parts
        found = scan(self.spec, key, self.memory, parts)
        return self.complete({**found, "key": key, "parts": HeldParts(parts or [])})

    def require_private_rows(self, what: str) -> None:
        raise ConfigError("data.dataset", f"{what} needs the private rows in this process, "
                          "and data.dataset=table never loads them here (only the client "
                          "shards read them)", "run it on a built-in data set, or run the "
                          "private job (python -m jobs.distill)")


def prepare_data(cfg, inputs: dict | None = None) -> PreparedData:
    """Load the dataset, make the split, check it, partition private records, and keep at
    most the public record bound per client (rknn_ray.data.partition). A registry entry
    with its own ``prepare`` (the user's tables) does all of this its own way; ``inputs``:
    data given in memory ({"private": ..., "public": ..., "evaluation": ...}) for it."""
    d = cfg.data
    kind = kind_of(d.dataset)
    if kind.prepare is not None:
        return kind.prepare(cfg, inputs or {})
    if inputs and any(v is not None for v in inputs.values()):
        raise ConfigError("data.dataset", f"{d.dataset!r} reads its own files; data given in "
                          "memory is read only by data.dataset=table", "set data.dataset=table")
    early = public_size_before_loading(cfg)
    if early is not None:               # queries.s against the public set, before any private file
        check_public_size(cfg, early)
    ds = load_dataset(d.dataset, d.data_root, **(kind.from_config(d) if kind.from_config else {}))
    splits = make_splits(ds, rule=d.split, seed=cfg.run.seed)
    validate_features(splits.private_x, splits.private_y, ds.num_classes, what="private data")
    validate_features(splits.public_x, splits.public_y, ds.num_classes, what="public data")
    validate_with_data(cfg, len(splits.public_x), len(splits.private_x), ds.num_classes)
    return partitioned(cfg, splits, ds.num_classes, tuple(ds.image_shape), ds.name)


def public_size_before_loading(cfg) -> int | None:
    """The public set's size where a public file says it before any private record is read:
    MNIST-style data under the paper's rule (half the test set, counted from its labels'
    header). digits and synthetic are checked when the config is (rknn_ray.data.config)."""
    d = cfg.data
    if d.split != "paper" or paper_rule(d.dataset) != "mnist":
        return None
    n_test = idx_test_count(d.dataset, d.data_root)
    return None if n_test is None or n_test < 2 else paper_mnist_public_count(n_test)


def partitioned(cfg, splits, num_classes: int, image_shape: tuple, name: str) -> PreparedData:
    """The private split dealt to clients as ``cfg.data`` says, within the public bound."""
    d = cfg.data
    m = len(splits.private_y)
    clients = m if d.partition == "one_per_client" else d.clients
    client_ids = np.asarray(partition(splits.private_y, clients, scheme=d.partition,
                                      alpha=d.alpha, seed=cfg.run.seed), dtype=np.int64)
    bound = public_record_bound(d.partition, m, clients, d.max_records_per_client)
    data = PreparedData(splits, client_ids, num_classes, image_shape, name, clients=int(clients),
                        record_bound=bound, held=held_within_bound(client_ids, bound, cfg.run.seed,
                                                                   splits.private_x,
                                                                   splits.private_y))
    return data.records_as_clients() if cfg.privacy.multi_record == "each" else data

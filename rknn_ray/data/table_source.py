"""A client shard's own rows of the user's private table, read where the shard runs.

:class:`TableShardSource` is the small spec a shard is started with (rknn_ray.data.sources
has the others): the part's path, columns and class list, the public featurizer, and which
clients are the shard's. With a client column a client's shard is a hash of its id modulo
the shard count (rknn_ray.data.tables.bucket_of): the shard reads the id column, keeps its
own ids, and opens only the fragments and rows that hold them (a folder partitioned by
client, ``holder=.../part.parquet``, is pruned to the shard's sub-folders). Without one each
record is a client, and a shard reads its range of rows. The driver never opens the file;
on a cluster the path is read on the shard's node (a node-local copy, or a shared file
system pyarrow reads).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from rknn_ray.data.partition import held_within_bound
from rknn_ray.data.sources import ShardRecords
from rknn_ray.data.table_scan import needed_columns
from rknn_ray.data.tables import (Columns, Featurizer, Part, bucket_of, feature_matrix,
                                  label_indices, open_dataset, read)
from rknn_ray.errors import DataError


def _empty(dataset, names) -> pa.Table:
    return pa.schema([dataset.schema.field(n) for n in names]).empty_table()


@dataclass(frozen=True, eq=False)
class TableShardSource:
    """Clients ``[client_lo, client_hi)``: the holders hashed to ``shard`` of ``shards`` (or,
    without a client column, rows ``[client_lo, client_hi)``), at most ``bound`` records each."""
    client_lo: int
    client_hi: int
    part: Part
    columns: Columns
    classes: tuple
    featurizer: Featurizer
    shard: int
    shards: int
    bound: int
    seed: int
    width: int | None = None
    rows: pa.Table | None = None        # data given in memory: this shard's rows only

    def read(self) -> tuple[pa.Table, list]:
        """(this shard's rows, the fragments it opened)."""
        p, need = self.part, needed_columns(self.part, self.columns)
        if self.rows is not None:
            return self.rows.select(need), ["memory"]
        dataset = open_dataset(p.path)
        if not p.client:                     # one record per client: rows [lo, hi)
            pieces, at = [], 0
            for batch in dataset.to_batches(columns=need):
                lo, hi = max(self.client_lo - at, 0), min(self.client_hi - at, batch.num_rows)
                if hi > lo:
                    pieces.append(batch.slice(lo, hi - lo))
                at += batch.num_rows
            return (pa.Table.from_batches(pieces) if pieces else _empty(dataset, need)), [p.path]
        holders = read(p.path, [p.client], p.key).column(p.client)
        _, ids, id_bucket = bucket_of(holders, self.shards)
        mine = pa.array([ids[i] for i in np.flatnonzero(id_bucket == self.shard)], pa.string())
        expr = pads.field(p.client).isin(mine.cast(holders.type))
        fragments = list(dataset.get_fragments(filter=expr))
        tables = [pads.FileSystemDataset([f], dataset.schema, dataset.format, f.filesystem)
                  .to_table(columns=need, filter=expr) for f in fragments]
        table = pa.concat_tables(tables) if tables else _empty(dataset, need)
        return table, [f.path for f in fragments]

    def open(self) -> ShardRecords:
        p = self.part
        table, opened = self.read()
        x = self.featurizer(feature_matrix(table, self.columns, p, self.width))
        y = label_indices(table, p.label, self.classes, p)
        if p.client:
            holders = table.column(p.client).cast(pa.string()).combine_chunks()
            order = sorted(set(holders.to_pylist()))
            rank = pc.index_in(holders, value_set=pa.array(order, pa.string())).to_numpy()
            ids = self.client_lo + rank.astype(np.int64)
        else:
            ids = np.arange(self.client_lo, self.client_lo + table.num_rows, dtype=np.int64)
            order = ids
        if len(order) != self.client_hi - self.client_lo:
            raise DataError(f"{p.key}: shard {self.shard} found {len(order)} clients where the "
                            f"job's scan found {self.client_hi - self.client_lo}: the private "
                            "data changed after the job checked it. Fix: run the job again")
        held = held_within_bound(ids - self.client_lo, self.bound, self.seed * 7919 + self.shard)
        records = ShardRecords(x[held], y[held], ids[held])
        records.opened = opened              # what the shard read (tests, diagnostics)
        return records

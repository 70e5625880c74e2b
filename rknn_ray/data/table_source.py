"""A client shard's own rows of the user's private table, read where the shard runs.

:class:`TableShardSource` is the small spec a shard is started with (rknn_ray.data.sources
has the others): the part's path, columns and class list, the public featurizer, which
clients are the shard's, and the keyed digest of the rows the job's scan found for it
(rknn_ray.data.table_scan). With a client column a client's shard is a hash of its id modulo
the shard count (rknn_ray.data.tables.bucket_of): the shard reads the id column, keeps its
own ids, and opens only the fragments and rows that hold them (a folder partitioned by
client, ``holder=.../part.parquet``, is pruned to the shard's sub-folders). Without one each
record is a client, and a shard reads its range of rows. The driver never opens the file;
on a cluster the path is read on the shard's node.

The shard recomputes the keyed digest of what it read and refuses rows that differ from what
the scan found (the budget was reserved for those) before any client randomizes. Each holder
keeps at most ``bound`` records, chosen by a keyed hash of each record's own value
(rknn_ray.data.table_scan.kept_within_bound): never by row positions or other holders.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from rknn_ray.data.sources import ShardRecords
from rknn_ray.data.table_scan import (derived_key, holder_hashes, keep_key, kept_within_bound,
                                      multiset_digest, needed_columns, private_read_error,
                                      row_hashes)
from rknn_ray.data.tables import (Columns, Featurizer, Part, bucket_of, feature_matrix,
                                  label_indices, open_dataset, raw_numbers, read)
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
    expect: tuple | None = None         # (rows, keyed multiset digest) the scan found here
    key: bytes = b""                    # the ledger's fingerprint key (keys the digest)
    each: bool = False                  # privacy.multi_record=each: a client per kept record

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
        try:
            table, opened = self.read()
            matrix = feature_matrix(table, self.columns, p, self.width, private=True)
            raw = raw_numbers(matrix)
            y = label_indices(table, p.label, self.classes, p)
        except Exception as exc:  # noqa: BLE001 - one line, no private value
            raise private_read_error(p, exc, f"shard {self.shard} reading its rows") from None
        holder = None
        if p.client:
            holders = table.column(p.client).cast(pa.string()).combine_chunks()
            enc = holders.dictionary_encode()
            holder = holder_hashes(enc.dictionary.to_pylist(), derived_key(self.key, "holders"))[
                enc.indices.to_numpy(zero_copy_only=False)]
        if self.expect is not None:
            got = multiset_digest(row_hashes(raw, y, derived_key(self.key, "rows"), holder))
            if got != tuple(self.expect):
                raise DataError(f"{p.key}: shard {self.shard} read other rows than the job's "
                                "scan found there: the private data changed after the job "
                                "checked it and reserved its budget. No client randomized; the "
                                "reservation is returned. Fix: leave the private files as they "
                                "are while a job runs, and run the job again")
        x = self.featurizer(matrix)
        if p.client:
            order = sorted(set(holders.to_pylist()))
            rank = pc.index_in(holders, value_set=pa.array(order, pa.string())).to_numpy()
            ids = self.client_lo + rank.astype(np.int64)
        else:
            ids = np.arange(self.client_lo, self.client_lo + table.num_rows, dtype=np.int64)
            order = ids
        content = row_hashes(raw, y, keep_key(self.seed))
        held = kept_within_bound(ids, content, self.bound)
        if self.each:        # every kept record its own client, in its holder's order
            rank = np.empty(held.size, np.int64)
            order_kept = np.flatnonzero(held)[np.lexsort((content[held], ids[held]))]
            rank[order_kept] = np.arange(order_kept.size)
            ids = np.where(held, self.client_lo + rank, -1)
            order = order_kept
        if len(order) != self.client_hi - self.client_lo:
            raise DataError(f"{p.key}: shard {self.shard} found {len(order)} clients where the "
                            f"job's scan found {self.client_hi - self.client_lo}: the private "
                            "data changed after the job checked it. Fix: run the job again")
        records = ShardRecords(x[held], y[held], ids[held])
        records.opened = opened              # what the shard read (tests, diagnostics)
        return records

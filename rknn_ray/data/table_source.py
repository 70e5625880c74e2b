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

import ctypes
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from rknn_ray.data.sources import ShardRecords
from rknn_ray.data.table_scan import (BATCH_ROWS, derived_key, holder_hashes, keep_key,
                                      kept_within_bound, multiset_digest, needed_columns,
                                      private_read_error, row_hashes)
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
    # data.private.sites: the site (rknn_ray.data.tables.Site) whose part this shard reads;
    # its actor is placed on the site's nodes (rknn_ray.job.placement.shard_options)
    site: object = None

    def pieces(self) -> tuple:
        """(this shard's rows as an iterator of tables, one per fragment it opens; the
        fragments it opens; the shard's holder ids as sorted text, or None without a client
        column)."""
        p, need = self.part, needed_columns(self.part, self.columns)
        if self.rows is not None:
            rows = self.rows.select(need)
            mine = pc.unique(rows.column(p.client).cast(pa.string())) if p.client else None
            return iter([rows]), ["memory"], _sorted(mine)
        dataset = open_dataset(p.path)
        if not p.client:                     # one record per client: rows [lo, hi)
            pieces, at = [], 0
            for batch in dataset.to_batches(columns=need):
                lo, hi = max(self.client_lo - at, 0), min(self.client_hi - at, batch.num_rows)
                if hi > lo:
                    pieces.append(batch.slice(lo, hi - lo))
                at += batch.num_rows
            table = pa.Table.from_batches(pieces) if pieces else _empty(dataset, need)
            return iter([table]), [p.path], None
        holders = read(p.path, [p.client], p.key).column(p.client)
        _, ids, id_bucket = bucket_of(holders, self.shards)
        mine = pa.array(ids, pa.string()).filter(pa.array(id_bucket == self.shard))
        expr = pads.field(p.client).isin(mine.cast(holders.type))
        del holders, ids
        fragments = list(dataset.get_fragments(filter=expr))

        def tables():
            for f in fragments:
                yield pads.FileSystemDataset([f], dataset.schema, dataset.format,
                                             f.filesystem).to_table(columns=need, filter=expr)
            if not fragments:
                yield _empty(dataset, need)
        return tables(), [f.path for f in fragments], _sorted(mine)

    def read(self) -> tuple[pa.Table, list]:
        """(this shard's rows, the fragments it opened)."""
        tables, opened, _ = self.pieces()
        return pa.concat_tables(list(tables)), opened

    def open(self) -> ShardRecords:
        """The shard's records, read one fragment and one record batch at a time: what stays
        is the featurized float32 records, their labels and a few words per row (the check
        of the scan's digest and the bound need every row first)."""
        p = self.part
        xs, ys, ids, digest, content = [], [], [], [], []
        row_key, keep = derived_key(self.key, "rows"), keep_key(self.seed)
        try:
            tables, opened, mine = self.pieces()
            id_hash = holder_hashes(mine.to_pylist(), derived_key(self.key, "holders")) \
                if p.client else None
            at = 0
            for table in tables:
                for start in range(0, max(table.num_rows, 1), BATCH_ROWS):
                    t = table.slice(start, BATCH_ROWS)
                    matrix = feature_matrix(t, self.columns, p, self.width, private=True)
                    raw = raw_numbers(matrix)
                    y = label_indices(t, p.label, self.classes, p)
                    holder = None
                    if p.client:
                        found = pc.index_in(t.column(p.client).cast(pa.string()),
                                            value_set=mine)
                        if found.null_count:         # an id of another shard: changed
                            raise DataError(_changed(p, self.shard))
                        rank = found.to_numpy(zero_copy_only=False).astype(np.int64)
                        holder = id_hash[rank]
                        ids.append(self.client_lo + rank)
                    else:
                        ids.append(np.arange(self.client_lo + at, self.client_lo + at + len(y),
                                             dtype=np.int64))
                    at += len(y)
                    digest.append(row_hashes(raw, y, row_key, holder))
                    content.append(row_hashes(raw, y, keep))
                    xs.append(self.featurizer(matrix))
                    ys.append(y)
                del table
        except Exception as exc:  # noqa: BLE001 - one line, no private value
            raise private_read_error(p, exc, f"shard {self.shard} reading its rows") from None
        ids, content = np.concatenate(ids), np.concatenate(content)
        if self.expect is not None:
            got = multiset_digest(np.concatenate(digest))
            if got != tuple(self.expect):
                raise DataError(_changed(p, self.shard))
        del digest
        clients = int(np.count_nonzero(np.bincount(ids - self.client_lo))) if p.client and \
            len(ids) else at
        if not self.each and clients != self.client_hi - self.client_lo:
            raise DataError(f"{p.key}: shard {self.shard} found {clients} clients where the "
                            f"job's scan found {self.client_hi - self.client_lo}: the private "
                            "data changed after the job checked it. Fix: run the job again")
        held = np.flatnonzero(kept_within_bound(ids, content, self.bound))
        if self.each:        # every kept record its own client, in its holder's order
            order = held[np.lexsort((content[held], ids[held]))]
            if order.size != self.client_hi - self.client_lo:
                raise DataError(_changed(p, self.shard))
            ids = np.arange(self.client_lo, self.client_lo + order.size, dtype=np.int64)
            records = ShardRecords(_gather(xs, order), _gather(ys, order), ids)
        else:
            order = held[np.argsort(ids[held], kind="stable")]      # grouped by client
            records = ShardRecords(_gather(xs, order), _gather(ys, order), ids[order])
        _give_back_memory()
        records.opened = opened              # what the shard read (tests, diagnostics)
        return records


def _give_back_memory() -> None:
    """The read's freed buffers back to the system: Arrow's pool, and glibc's heap (the
    record batches' arrays sit below its mmap threshold; freed, they stayed resident)."""
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):      # not glibc: nothing to trim
        pass


def _sorted(ids) -> pa.Array | None:
    """Distinct holder ids (text) in Python's sort order of str (UTF-8's byte order)."""
    return None if ids is None else ids.take(pc.array_sort_indices(ids))


def _changed(p: Part, shard: int) -> str:
    return (f"{p.key}: shard {shard} read other rows than the job's scan found there: the "
            "private data changed after the job checked it and reserved its budget. No client "
            "randomized; the reservation is returned. Fix: leave the private files as they are "
            "while a job runs, and run the job again")


def _gather(pieces: list, order: np.ndarray) -> np.ndarray:
    """``np.concatenate(pieces)[order]`` in about one copy's memory: the pieces are copied
    into one array one by one (each dropped once copied; ``pieces`` is emptied), then its
    first ``len(order)`` rows are put in ``order`` a quarter of its columns at a time (each
    quarter's gather reads only that quarter's columns, so it can be written back in place)."""
    first, n = pieces[0], sum(len(a) for a in pieces)
    out = np.empty((n,) + first.shape[1:], first.dtype)
    at = 0
    for i in range(len(pieces)):
        out[at:at + len(pieces[i])] = pieces[i]
        at += len(pieces[i])
        pieces[i] = None
    if out.size == 0:
        return out[order]
    flat, m = out.reshape(n, -1), len(order)
    step = max(1, -(-flat.shape[1] // 4))
    for a in range(0, flat.shape[1], step):
        flat[:m, a:a + step] = flat[order, a:a + step]
    del flat
    out.resize((m,) + out.shape[1:], refcheck=False)   # the rows past m given back
    return out

"""A client shard's own rows of the user's private table, handed over by the job's scan.

:class:`TableShardSource` is the small spec a shard is started with (rknn_ray.data.sources
has the others): the part's columns and class list, the public featurizer, which clients are
the shard's, the keyed digest of the rows the job's scan found for it, and where its rows
are. The scan (rknn_ray.data.table_scan) reads the private part once, where the shards run,
and splits it into each shard's parts as it goes (a client's shard is a hash of its id modulo
the shard count, rknn_ray.data.tables.bucket_of; without a client column each record is a
client and a shard holds a range of rows); each part carries the shard's columns, each row's
client rank and its holder's keyed hash, never the ids. The shard takes its parts once
(``parts.take(shard)``: Ray objects on a cluster, rknn_ray/job/private_scan.py; a list in
this process after a scan run here) and reads them one at a time; it never opens the private
path, and reading costs the job O(rows), not O(shards x rows). Rows given in memory are dealt
to the shards by the driver, which holds them already (``rows``).

The shard recomputes the keyed digest of the rows it was handed and refuses rows that differ
from what the scan found (the budget was reserved for those) before any client randomizes.
Each holder keeps at most ``bound`` records, and its kept records become senders in an
order, both drawn from the shard's secret over the holder's rows
(rknn_ray.data.partition.sender_order): never from a record's value, a public key or other
holders, so replacing one record's value changes the input of one sender at most.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rknn_ray.data.partition import sender_order
from rknn_ray.data.sources import ShardRecords
from rknn_ray.data.table_scan import (BATCH_ROWS, derived_key, holder_hashes, needed_columns,
                                      private_read_error, row_hashes)
from rknn_ray.data.tables import (Columns, Featurizer, Part, feature_matrix, label_indices,
                                  raw_numbers)
from rknn_ray.errors import DataError


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
    parts: object = None                # .take(shard): this shard's parts, handed over once

    def pieces(self):
        """(this shard's parts, one at a time, each ``(rows, client ranks or None, keyed holder
        hashes or None)``; what the shard opened: ``["memory"]`` for rows given in memory,
        else nothing)."""
        p = self.part
        if self.rows is not None:
            rows = self.rows.select(needed_columns(p, self.columns))
            cuts = range(0, max(rows.num_rows, 1), BATCH_ROWS)
            if not p.client:
                return ((rows.slice(a, BATCH_ROWS), None, None) for a in cuts), ["memory"]
            mine = _sorted(pc.unique(rows.column(p.client).cast(pa.string())))
            rank = pc.index_in(rows.column(p.client).cast(pa.string()), value_set=mine)
            rank = rank.to_numpy(zero_copy_only=False).astype(np.int32)
            holder = holder_hashes(mine.to_pylist(), derived_key(self.key, "holders"))[rank]
            return ((rows.slice(a, BATCH_ROWS), rank[a:a + BATCH_ROWS],
                     holder[a:a + BATCH_ROWS]) for a in cuts), ["memory"]
        got = None if self.parts is None else self.parts.take(self.shard)
        if got is None:
            raise DataError(f"{p.key}: shard {self.shard} has no rows to read: the job's scan "
                            "handed each shard its rows once, and this shard took them already "
                            "(a shard restarted after it read them) or none were handed over. "
                            "No client randomized. Fix: run the job again")
        return got, []

    def open(self, order_key: bytes | None = None) -> ShardRecords:
        """The shard's records, read one part at a time (each dropped once read): what stays
        is the featurized float32 records, their labels and a few words per row (the check
        of the scan's digest and the bound need every row first). ``order_key`` (derived from
        the shard's secret; None: a fresh one) picks each holder's kept records and, under
        privacy.multi_record=each, which sender each becomes
        (:func:`rknn_ray.data.partition.sender_order`)."""
        p = self.part
        n = int(self.expect[0]) if self.expect is not None else 0    # rows the scan found
        xs, ys, ids = _Filled(n), _Filled(n), _Filled(n)
        row_key = derived_key(self.key, "rows")
        at, ranks, total = 0, 0, np.uint64(0)    # rows, clients seen, sum of the row hashes
        try:
            parts, opened = self.pieces()
            for table, rank, holder in _slices(parts):
                matrix = feature_matrix(table, self.columns, p, self.width, private=True)
                raw = raw_numbers(matrix)
                y = label_indices(table, p.label, self.classes, p)
                del table
                if p.client:
                    if len(rank) != len(y) or len(holder) != len(y):
                        raise DataError(_changed(p, self.shard))
                    ids.add(np.asarray(rank, np.int32))
                    ranks = max(ranks, int(rank.max(initial=-1)) + 1)
                else:
                    ids.add(np.arange(at, at + len(y), dtype=np.int64))
                at += len(y)
                with np.errstate(over="ignore"):
                    total += np.add.reduce(row_hashes(raw, y, row_key, holder), dtype=np.uint64)
                xs.add(self.featurizer(matrix))
                ys.add(y)
                del matrix, raw, rank, holder
        except Exception as exc:  # noqa: BLE001 - one line, no private value
            raise private_read_error(p, exc, f"shard {self.shard} reading its rows") from None
        if not at and xs.array is None:
            raise DataError(_changed(p, self.shard))
        ids = ids.done()    # ranks from 0 (client_lo added at the end)
        xs, ys = [xs.done()], [ys.done()]
        if self.expect is not None and (at, f"{int(total):016x}") != tuple(self.expect):
            raise DataError(_changed(p, self.shard))
        clients = int(np.count_nonzero(np.bincount(ids, minlength=ranks))) if p.client else at
        if not self.each and (clients != self.client_hi - self.client_lo or
                              (p.client and ranks > clients)):
            raise DataError(f"{p.key}: shard {self.shard} found {clients} clients where the "
                            f"job's scan found {self.client_hi - self.client_lo}: the private "
                            "data changed after the job checked it. Fix: run the job again")
        order = sender_order(ids, self.bound, order_key)     # kept, grouped by holder
        if self.each:        # every kept record its own client, in the secret order
            if order.size != self.client_hi - self.client_lo:
                raise DataError(_changed(p, self.shard))
            ids = np.arange(self.client_lo, self.client_lo + order.size, dtype=np.int64)
        else:
            ids = ids[order].astype(np.int64) + self.client_lo
        records = ShardRecords(_gather(xs, order), _gather(ys, order), ids)
        _give_back_memory()
        records.opened = opened              # what the shard opened (tests, diagnostics)
        return records


class _Filled:
    """An array filled slice by slice into one allocation of the rows the scan found (no list
    of pieces, no concatenation: the open's memory is one copy of each column); more rows
    than expected (refused later by the digest) grow it."""

    def __init__(self, rows: int):
        self.rows, self.at, self.array = rows, 0, None

    def add(self, v: np.ndarray) -> None:
        if self.array is None:
            self.array = np.empty((max(self.rows, len(v)),) + v.shape[1:], v.dtype)
        elif self.at + len(v) > len(self.array):
            grown = np.empty((2 * (self.at + len(v)),) + v.shape[1:], v.dtype)
            grown[:self.at] = self.array[:self.at]
            self.array = grown
        self.array[self.at:self.at + len(v)] = v
        self.at += len(v)

    def done(self) -> np.ndarray:
        """The filled rows: the allocation itself when exactly full (then it owns its data)."""
        a, self.array = self.array, None
        if a is None:
            return np.zeros(0)
        return a if self.at == len(a) else a[:self.at].copy()


#: rows a shard featurizes at a time (its transient arrays: a few times this x the row width)
SLICE_ROWS = 1 << 14


def _slices(parts):
    """Each part ``(rows, ranks, hashes)`` in slices of SLICE_ROWS rows (a part is dropped
    once sliced through)."""
    for table, rank, holder in parts:
        for a in range(0, max(table.num_rows, 1), SLICE_ROWS):
            yield (table.slice(a, SLICE_ROWS), None if rank is None else rank[a:a + SLICE_ROWS],
                   None if holder is None else holder[a:a + SLICE_ROWS])
        del table, rank, holder


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


#: the most memory :func:`_gather` takes beside its array (its columns are moved in steps of
#: at most this much; a step of a quarter of 4.4e6 rows x 32 float32 took 140 MB)
GATHER_BYTES = 32 << 20


def _gather(pieces: list, order: np.ndarray) -> np.ndarray:
    """``np.concatenate(pieces)[order]`` in about one copy's memory: the pieces are copied
    into one array one by one (each dropped once copied; ``pieces`` is emptied), then its
    first ``len(order)`` rows are put in ``order`` a few of its columns at a time (at most a
    quarter of them and GATHER_BYTES; each step's gather reads only its own columns, so it can
    be written back in place)."""
    first, n = pieces[0], sum(len(a) for a in pieces)
    if len(pieces) == 1 and first.base is None and first.flags.c_contiguous:
        out = first                          # one array of its own: gathered in place
        pieces[0] = None
    else:
        out = np.empty((n,) + first.shape[1:], first.dtype)
        at = 0
        for i in range(len(pieces)):
            out[at:at + len(pieces[i])] = pieces[i]
            at += len(pieces[i])
            pieces[i] = None
    if out.size == 0:
        return out[order]
    flat, m = out.reshape(n, -1), len(order)
    step = max(1, min(-(-flat.shape[1] // 4), GATHER_BYTES // max(1, m * flat.itemsize)))
    for a in range(0, flat.shape[1], step):
        flat[:m, a:a + step] = flat[order, a:a + step]
    del flat
    out.resize((m,) + out.shape[1:], refcheck=False)   # the rows past m given back
    return out

"""The private part's scan: where the private rows are read, before the job reserves budget.

The driver never loads private features or labels and never opens a private path. What the
job needs from the private rows it gets from this scan, which the job runs where the client
shards run (rknn_ray/job/private_scan.py: a Ray task placed as the shards are; data given in
memory is scanned in the driver, which holds it already). The scan reads the part once, in
record batches (memory bounded by a batch, not the table), checks every row, and returns
only:

* counts: records, holders, records each shard will read, records kept within the public
  per-holder bound. Under the job's neighbour relation (a record's value replaced; which
  holders take part and how many records each holds are public) these are public;
* the records' exact and near fingerprints, already KEYED under the ledger's fingerprint
  key (rknn_ray.accounting.source_identity): the budget's source; nothing unkeyed leaves;
* per shard, a keyed multiset digest of the rows it must read (:func:`row_hashes`): the
  shard recomputes it from the rows it reads and refuses a mismatch before any client
  randomizes, so the budget is charged for the rows actually read;
* a keyed digest naming the private part (resume).

Every check that needs the rows fails here, before the reservation: an empty part, a label
outside data.classes, a missing holder id, mixed feature lengths, empty values, a value
that cannot be parsed, a NaN or infinite value: input outside the relation's domain (a
finite value of any size is in it, clipped by the featurizer: docs/threat-model.md). No
message quotes a private cell or a row position (:func:`private_read_error`).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rknn_ray.data.partition import keep_key, kept_within_bound, row_hashes  # noqa: F401
from rknn_ray.data.tables import (Columns, Featurizer, Part, bucket_of, feature_matrix,
                                  image_folder, label_indices, missing, open_dataset, raw_numbers)
from rknn_ray.errors import DataError, RknnError
from rknn_ray.accounting.source_identity import (blake2b_64, keyed_fingerprints,
                                                 near_fingerprints, record_fingerprints,
                                                 sorted_unique)

#: rows per record batch the scan and the shards read at a time
BATCH_ROWS = 1 << 16


@dataclass(frozen=True)
class ScanSpec:
    """What the scan needs: the private part, its feature columns (as the public part's), the
    class list, the shard count, the public record width and the public-fitted featurizer
    (its domain clips every finite value: rknn_ray.data.tables.Featurizer.fit)."""
    part: Part
    columns: Columns
    classes: tuple
    shards: int
    width: int
    featurizer: Featurizer
    bound: int = 1                     # public: records a holder keeps at most
    layout: str | None = None          # an image folder's ("classes"): checked where read


def needed_columns(part: Part, cols: Columns) -> list:
    return list(dict.fromkeys([*cols.names, part.label] + ([part.client] if part.client else [])))


def derived_key(key: bytes, purpose: str) -> bytes:
    """A 32-byte key for one use, derived from the ledger's fingerprint key."""
    return hmac.new(key, f"rknn-ray private rows: {purpose}".encode(), hashlib.sha256).digest()


def multiset_digest(hashes: np.ndarray) -> tuple[int, str]:
    """(count, sum of the row hashes mod 2^64 as hex): the same rows in any order agree."""
    with np.errstate(over="ignore"):
        total = np.add.reduce(np.asarray(hashes, np.uint64), dtype=np.uint64) if len(hashes) \
            else np.uint64(0)
    return int(len(hashes)), f"{int(total):016x}"


def holder_hashes(ids: list, key: bytes) -> np.ndarray:
    """Keyed 64-bit hashes of holder ids (their text): holders are counted by these, and a
    row's hash covers its holder, without the ids leaving where they are read."""
    return blake2b_64([str(v).encode() for v in ids], key=key[:32]).astype(np.uint64)


def holder_rows(ids, shards: int, key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(each row's shard as int32, each row's keyed holder hash) of a whole client column:
    every distinct id hashed once (:func:`bucket_of`, :func:`holder_hashes`)."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    enc = arr.cast(pa.string()).dictionary_encode()
    names = enc.dictionary.to_pylist()
    index = enc.indices.to_numpy(zero_copy_only=False)
    buckets = (blake2b_64([v.encode() for v in names]) % np.uint64(shards)).astype(np.int32)
    return buckets[index], holder_hashes(names, key)[index]


# ---------------------------------------------------------------- errors
def private_read_error(part: Part, exc: BaseException, stage: str,
                       part_columns=None) -> DataError:
    """A fault in the private rows as one line that names the column and the kind of fault,
    never a cell's value or a row's position (both depend on private data)."""
    if isinstance(exc, RknnError):
        return exc if isinstance(exc, DataError) else DataError(str(exc).splitlines()[0])
    text = str(exc)
    column = ""
    names = set(part_columns or ())
    for pattern in (r"for column (\S+) with type", r"[Cc]olumn #(\d+)", r"column '([^']*)'",
                    r'column "([^"]*)"'):
        found = re.search(pattern, text)
        if found and (not names or found.group(1) in names or pattern == r"[Cc]olumn #(\d+)"):
            column = (f" in column #{found.group(1)}" if "#" in pattern
                      else f" in column {found.group(1)!r}")
            break
    kind = type(exc).__name__
    return DataError(f"{part.key}: {stage} failed ({kind}{column}: a value could not be read "
                     "as the column's type; the value is not shown, it is private). Fix: check "
                     f"that every value of {part.key}'s columns has the column's type (numbers "
                     "in numeric columns, no stray text)")


# ---------------------------------------------------------------- the scan
#: rows of one group: the scan splits the rows into the shards' parts a group at a time (a
#: group's row boundaries depend on the row count only, so the number of parts handed over,
#: groups x shards, is a function of the public row count)
GROUP_ROWS = 4 * BATCH_ROWS
#: record batches pyarrow reads ahead of the scan, from one file at a time (its defaults, 16
#: batches from each of 4 files, held about 0.5 GB of a 1e7-record table's rows in memory)
READAHEAD_BATCHES = 4


class Holders:
    """The private part's client column, read once: each row's index into the distinct ids,
    and per distinct id its shard (:func:`bucket_of`'s hash), its keyed hash and its rank among
    its shard's ids in the sort order of their text (a shard's client ids are ``lo + rank``)."""

    def __init__(self, ids, shards: int, key: bytes):
        arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
        enc = arr.cast(pa.string()).dictionary_encode()
        names = enc.dictionary
        del arr
        self.index = enc.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
        del enc
        raw = [v.encode() for v in names.to_pylist()]
        self.bucket = (blake2b_64(raw) % np.uint64(shards)).astype(np.int32)
        self.hash = holder_hashes_bytes(raw, key)
        del raw
        order = np.asarray(pc.array_sort_indices(names))       # UTF-8 byte order
        by_shard = order[np.argsort(self.bucket[order], kind="stable")]
        counts = np.bincount(self.bucket, minlength=shards)
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        self.rank = np.empty(len(names), np.int32)
        self.rank[by_shard] = np.arange(len(names), dtype=np.int64) - starts
        self.per_holder = np.bincount(self.index, minlength=len(names))


class _Tally:
    """What the scan accumulates group by group (O(records) words, no rows): the keyed
    fingerprints, and per shard the row count and the sum of the keyed row hashes."""

    def __init__(self, spec: ScanSpec, key: bytes, holders: Holders | None, total: int | None):
        self.spec, self.key = spec, key
        self.row_key = derived_key(key, "rows")
        self.exact, self.near = [], []
        self.holders = holders
        # without a client column: each shard a contiguous range of the (counted) rows
        self.cuts = None if total is None else \
            np.linspace(0, total, min(spec.shards, total) + 1).astype(np.int64)
        self.count = np.zeros(spec.shards, np.int64)
        self.sums = np.zeros(spec.shards, np.uint64)
        self.rows = 0

    def add(self, t: pa.Table):
        """Check and tally one group; (each row's shard, its keyed holder hash or None, its
        client rank or None, the rows' matrix)."""
        spec, part = self.spec, self.spec.part
        matrix = feature_matrix(t, spec.columns, part, spec.width, private=True)
        raw = raw_numbers(matrix)
        if raw.shape[1] != spec.width:
            raise DataError(f"{part.key}: a record has {raw.shape[1]} feature values, a public "
                            f"one {spec.width}. Fix: give every part the same features")
        if not np.isfinite(raw).all():
            raise DataError(f"{part.key}: records with NaN or infinite features. Fix: drop or "
                            "impute them")
        # a finite value is in the domain whatever its size: the featurizer clips it to bounds
        # whose featurized ends were checked finite on public facts alone (Featurizer.fit), so
        # no refusal here depends on how large one record's value is
        y = label_indices(t, part.label, spec.classes, part)
        at, n = self.rows, t.num_rows
        holder = rank = None
        if part.client:
            if at + n > len(self.holders.index):
                raise DataError(changed_while_read(part))
            index = self.holders.index[at:at + n]
            shard = self.holders.bucket[index]
            holder, rank = self.holders.hash[index], self.holders.rank[index]
        else:
            if at + n > self.cuts[-1]:
                raise DataError(changed_while_read(part))
            shard = (np.searchsorted(self.cuts, np.arange(at, at + n), side="right") - 1
                     ).astype(np.int32)
        hashes = row_hashes(raw, y, self.row_key, holder)
        order = np.argsort(shard, kind="stable")
        counts = np.bincount(shard, minlength=spec.shards)
        nonzero = np.flatnonzero(counts)
        if len(order):
            starts = (np.cumsum(counts) - counts)[nonzero]
            with np.errstate(over="ignore"):
                self.sums[nonzero] += np.add.reduceat(hashes[order], starts, dtype=np.uint64)
        self.count += counts
        self.exact.append(keyed_fingerprints(self.key, record_fingerprints(raw)))
        self.near.append(keyed_fingerprints(self.key, near_fingerprints(
            raw, table=spec.featurizer.shape is None)))
        self.rows += n
        return order, counts, holder, rank

    def answer(self) -> dict:
        spec, part = self.spec, self.spec.part
        m = self.rows
        if m == 0:
            raise DataError(f"{part.key}: {part.path or 'the private data'} holds no rows. Fix: "
                            f"point {part.key}.path at the private records")
        if part.client:
            h = self.holders
            if m != len(h.index):
                raise DataError(changed_while_read(part))
            clients = np.bincount(h.bucket, minlength=spec.shards)
            kept_each = np.minimum(h.per_holder, spec.bound)
            kept = int(kept_each.sum())
            kept_per_shard = np.bincount(h.bucket, weights=kept_each, minlength=spec.shards)
            holders, largest = int(len(h.per_holder)), int(h.per_holder.max())
            shards = spec.shards
        else:
            if m != self.cuts[-1]:
                raise DataError(changed_while_read(part))
            clients = np.diff(self.cuts)
            kept, holders, largest = m, m, 1
            kept_per_shard = clients
            shards = len(clients)
        digests = [(int(self.count[s]), f"{int(self.sums[s]):016x}") for s in range(shards)]
        named = {"part": {k: v for k, v in spec.part.__dict__.items() if k != "path"},
                 "columns": spec.columns.__dict__, "classes": list(map(str, spec.classes)),
                 "shards": spec.shards, "width": spec.width}
        h = hmac.new(derived_key(self.key, "digest"), json.dumps(named, sort_keys=True,
                                                                 default=str).encode(),
                     hashlib.sha256)
        h.update(json.dumps(digests).encode())
        exact, self.exact = self.exact, []
        fingerprints = sorted_unique(np.concatenate(exact))
        del exact
        near, self.near = self.near, []
        out = {"rows": int(m), "holders": holders, "kept": kept, "largest_holder": largest,
               "clients": [int(c) for c in clients], "shard_digests": digests,
               "kept_per_shard": [int(c) for c in kept_per_shard],
               "digest": h.hexdigest()[:32], "fingerprints": fingerprints,
               "near": sorted_unique(np.concatenate(near))}
        if part.client:     # keyed holder hashes (holders are public): sites are compared by them
            out["holder_keys"] = np.sort(self.holders.hash)
        return out


def holder_hashes_bytes(raw: list, key: bytes) -> np.ndarray:
    """:func:`holder_hashes` of ids already encoded as UTF-8."""
    return blake2b_64(raw, key=key[:32]).astype(np.uint64)


def private_batches(part: Part, columns: list, table: pa.Table | None = None, dataset=None):
    """The private part's rows, ``columns`` only, one record batch at a time (a table given
    in memory: its batches; ``dataset``: the part's, opened already); faults as
    :func:`private_read_error`."""
    if table is not None:
        yield from table.select(columns).to_batches(max_chunksize=BATCH_ROWS)
        return
    try:
        dataset = dataset if dataset is not None else open_dataset(part.path, part.key)
        scanner = dataset.scanner(columns=columns, batch_size=BATCH_ROWS,
                                  batch_readahead=READAHEAD_BATCHES, fragment_readahead=1)
        batches = iter(scanner.to_batches())
    except RknnError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow's messages quote cells
        raise private_read_error(part, exc, "reading the private part") from None
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as exc:  # noqa: BLE001 - pyarrow's messages quote cells
            raise private_read_error(part, exc, "reading the private part") from None
        yield batch


def changed_while_read(part: Part) -> str:
    return (f"{part.key}: the private rows changed while the scan read them. Fix: leave the "
            "private files as they are while a job runs, and run the job again")


def _client_column(part: Part, table: pa.Table | None, dataset, schema) -> pa.ChunkedArray:
    """The private part's client column, every row, in the scan's row order."""
    batches = list(private_batches(part, [part.client], table, dataset))
    return pa.Table.from_batches(batches, schema=pa.schema([schema.field(part.client)])).column(0)


def _groups(batches, schema: pa.Schema):
    """The record batches re-cut into tables of GROUP_ROWS rows (the last one shorter)."""
    held, rows = [], 0
    for batch in batches:
        if not batch.num_rows:
            continue
        held.append(batch)
        rows += batch.num_rows
        while rows >= GROUP_ROWS:
            t = pa.Table.from_batches(held, schema=schema)
            yield t.slice(0, GROUP_ROWS)
            rest = t.slice(GROUP_ROWS)
            held, rows = rest.to_batches(), rest.num_rows
    if rows:
        yield pa.Table.from_batches(held, schema=schema)


def scan_parts(spec: ScanSpec, key: bytes, table: pa.Table | None = None):
    """The scan (module docstring) as a generator: per group of GROUP_ROWS rows, a list of
    ``spec.shards`` parts in shard order, each ``(rows, client ranks, keyed holder hashes)``
    (the rows: the columns a shard needs; ranks and hashes None without a client column) or
    None where the group holds no row of that shard; then the answer (a dict). ``key``: the
    ledger's fingerprint key; ``table``: the rows, where they were given in memory. Faults:
    one line (:func:`private_read_error`)."""
    part = spec.part
    if spec.layout and table is None and image_folder(str(part.path)) != spec.layout:
        raise DataError(f"{part.key}.path: {part.path!r} is not one sub-folder of images per "
                        f"class. Fix: point {part.key}.path at one sub-folder of images per "
                        "class (ImageFolder layout)")
    try:
        dataset = open_dataset(part.path, part.key) if table is None else None
        schema = table.schema if table is not None else dataset.schema
        missing(part, schema, [part.label, part.client])
        cols = Columns.resolve(part, schema, ()) if part.features else spec.columns
        missing(part, schema, needed_columns(part, cols))
        spec = ScanSpec(part, cols, spec.classes, spec.shards, spec.width, spec.featurizer,
                        spec.bound, spec.layout)
        need = needed_columns(part, cols)
        holders, total = None, None
        if part.client:               # the ids first: each distinct id is hashed once
            ids = _client_column(part, table, dataset, schema)
            if ids.null_count:
                raise DataError(f"{part.key}: client column {part.client!r} has "
                                f"{ids.null_count} empty values. Fix: give every row its "
                                f"holder's id, or unset {part.key}.client (then each record is "
                                "its own client)")
            holders = Holders(ids, spec.shards, derived_key(key, "holders"))
            del ids
            need = [c for c in need if c != part.client or c in cols.names]
        else:                         # each shard a range of rows: the count first
            total = table.num_rows if table is not None else dataset.count_rows()
        tally = _Tally(spec, key, holders, total)
        read_schema = pa.schema([schema.field(c) for c in need])
        for t in _groups(private_batches(part, need, table, dataset), read_schema):
            order, counts, holder, rank = tally.add(t)
            rows = t.take(order)
            del t
            at, out = 0, []
            for s in range(spec.shards):
                n = int(counts[s])
                if n == 0:
                    out.append(None)
                    continue
                mine = order[at:at + n]
                out.append((rows.slice(at, n), None if rank is None else rank[mine],
                            None if holder is None else holder[mine]))
                at += n
            del rows
            yield out
        out = tally.answer()
        pa.default_memory_pool().release_unused()   # the read's buffers: back to the system
    except Exception as exc:  # noqa: BLE001 - one line, no private value
        raise private_read_error(part, exc, "the scan of the private part") from None
    out["columns"] = {"names": list(cols.names), "list_column": cols.list_column,
                      "categorical": list(cols.categorical)}
    # the file's types of those columns (its schema, no value): sites must agree on them
    out["column_types"] = [str(schema.field(name).type) for name in cols.names]
    yield out


def scan(spec: ScanSpec, key: bytes, table: pa.Table | None = None,
         parts: list | None = None) -> dict:
    """The scan's answer (:func:`scan_parts`); ``parts``: when given, a list that receives
    the shards' parts (one list per shard), for :class:`HeldParts`."""
    answer = None
    for item in scan_parts(spec, key, table):
        if isinstance(item, dict):
            answer = item
        elif parts is not None:
            while len(parts) < len(item):
                parts.append([])
            for s, piece in enumerate(item):
                if piece is not None:
                    parts[s].append(piece)
    return answer


class HeldParts:
    """Each shard's parts held in this process (a scan run here: tests, data in memory):
    :meth:`take` hands a shard its parts once."""

    def __init__(self, parts: list):
        self.parts = parts

    def take(self, shard: int):
        if shard >= len(self.parts) or self.parts[shard] is None:
            return None
        mine, self.parts[shard] = self.parts[shard], None
        return iter(mine)


def scan_answer_or_error(spec: ScanSpec, key: bytes) -> dict:
    """:func:`scan` for a remote task: the answer, or ``{"error": one line}`` (an exception
    crossing Ray would carry a traceback; this carries only the scrubbed line)."""
    try:
        return scan(spec, key)
    except RknnError as exc:
        return {"error": str(exc).splitlines()[0]}


def scan_parts_or_error(spec: ScanSpec, key: bytes):
    """:func:`scan_parts` for a remote streaming generator: its items, the last one the answer
    or ``{"error": one line}`` (parts yielded before an error are dropped by the caller)."""
    try:
        yield from scan_parts(spec, key)
    except RknnError as exc:
        yield {"error": str(exc).splitlines()[0]}

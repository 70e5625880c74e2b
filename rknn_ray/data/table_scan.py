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
that cannot be parsed, a value that is finite in the file but not once featurized. No
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
    (a value that overflows once featurized is refused before the reservation)."""
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
class _Tally:
    """What the scan accumulates batch by batch (O(records) words, no rows)."""

    def __init__(self, spec: ScanSpec, key: bytes, holders: tuple | None = None):
        self.spec, self.key = spec, key
        self.row_key, self.id_key = derived_key(key, "rows"), derived_key(key, "holders")
        self.hashes, self.exact, self.near = [], [], []
        # (each row's shard, each row's keyed holder hash): the client column, read first
        self.shard, self.holder = holders if holders is not None else (None, None)
        self.rows = 0

    def add(self, t: pa.Table) -> None:
        spec, part = self.spec, self.spec.part
        matrix = feature_matrix(t, spec.columns, part, spec.width, private=True)
        raw = raw_numbers(matrix)
        if raw.shape[1] != spec.width:
            raise DataError(f"{part.key}: a record has {raw.shape[1]} feature values, a public "
                            f"one {spec.width}. Fix: give every part the same features")
        if not np.isfinite(raw).all():
            raise DataError(f"{part.key}: records with NaN or infinite features. Fix: drop or "
                            "impute them")
        with np.errstate(over="ignore", invalid="ignore"):
            x = spec.featurizer(matrix)
        if not np.isfinite(x).all():
            col = int(np.flatnonzero(~np.isfinite(x).all(axis=0))[0])
            raise DataError(f"{part.key}: a value is finite in the file but not once "
                            f"standardized with the public rows' statistics (model input "
                            f"{col}): it is too large. Fix: rescale or clip that column")
        y = label_indices(t, part.label, spec.classes, part)
        holder = None
        if part.client:
            if self.rows + t.num_rows > len(self.holder):
                raise DataError(changed_while_read(part))
            holder = self.holder[self.rows:self.rows + t.num_rows]
        self.hashes.append(row_hashes(raw, y, self.row_key, holder))
        self.exact.append(keyed_fingerprints(self.key, record_fingerprints(raw)))
        self.near.append(keyed_fingerprints(self.key, near_fingerprints(
            raw, table=spec.featurizer.shape is None)))
        self.rows += t.num_rows

    def answer(self) -> dict:
        spec, part = self.spec, self.spec.part
        m = self.rows
        if m == 0:
            raise DataError(f"{part.key}: {part.path or 'the private data'} holds no rows. Fix: "
                            f"point {part.key}.path at the private records")
        hashes = np.concatenate(self.hashes)
        if part.client:
            if m != len(self.holder):
                raise DataError(changed_while_read(part))
            shard, holder = self.shard, self.holder
            distinct, per_holder = np.unique(holder, return_counts=True)
            owner = np.zeros(distinct.size, np.int32)
            owner[np.searchsorted(distinct, holder)] = shard
            clients = np.bincount(owner, minlength=spec.shards)
            digests = [multiset_digest(hashes[shard == s]) for s in range(spec.shards)]
            kept_each = np.minimum(per_holder, spec.bound)
            kept = int(kept_each.sum())
            kept_per_shard = np.bincount(owner, weights=kept_each, minlength=spec.shards)
            holders = int(distinct.size)
            largest = int(per_holder.max())
        else:
            cuts = np.linspace(0, m, min(spec.shards, m) + 1).astype(np.int64)
            clients = np.diff(cuts)
            digests = [multiset_digest(hashes[a:b]) for a, b in zip(cuts[:-1], cuts[1:])]
            kept, holders, largest = m, m, 1
            kept_per_shard = clients
        named = {"part": {k: v for k, v in spec.part.__dict__.items() if k != "path"},
                 "columns": spec.columns.__dict__, "classes": list(map(str, spec.classes)),
                 "shards": spec.shards, "width": spec.width}
        h = hmac.new(derived_key(self.key, "digest"), json.dumps(named, sort_keys=True,
                                                                 default=str).encode(),
                     hashlib.sha256)
        h.update(json.dumps(digests).encode())
        out = {"rows": int(m), "holders": holders, "kept": kept, "largest_holder": largest,
                "clients": [int(c) for c in clients], "shard_digests": digests,
                "kept_per_shard": [int(c) for c in kept_per_shard],
                "digest": h.hexdigest()[:32],
                "fingerprints": sorted_unique(np.concatenate(self.exact)),
                "near": sorted_unique(np.concatenate(self.near))}
        if part.client:     # keyed holder hashes (holders are public): sites are compared by them
            out["holder_keys"] = distinct
        return out


def private_batches(part: Part, columns: list, table: pa.Table | None = None, dataset=None):
    """The private part's rows, ``columns`` only, one record batch at a time (a table given
    in memory: its batches; ``dataset``: the part's, opened already); faults as
    :func:`private_read_error`."""
    if table is not None:
        yield from table.select(columns).to_batches(max_chunksize=BATCH_ROWS)
        return
    try:
        dataset = dataset if dataset is not None else open_dataset(part.path, part.key)
        scanner = dataset.scanner(columns=columns, batch_size=BATCH_ROWS)
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


def scan(spec: ScanSpec, key: bytes, table: pa.Table | None = None) -> dict:
    """The scan itself (module docstring); ``key``: the ledger's fingerprint key;
    ``table``: the rows, where they were given in memory."""
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
        holders = None
        if part.client:               # the ids first: each distinct id is hashed once
            ids = _client_column(part, table, dataset, schema)
            if ids.null_count:
                raise DataError(f"{part.key}: client column {part.client!r} has "
                                f"{ids.null_count} empty values. Fix: give every row its "
                                f"holder's id, or unset {part.key}.client (then each record is "
                                "its own client)")
            holders = holder_rows(ids, spec.shards, derived_key(key, "holders"))
            del ids
            need = [c for c in need if c != part.client or c in cols.names]
        tally = _Tally(spec, key, holders)
        for batch in private_batches(part, need, table, dataset):
            if batch.num_rows:
                tally.add(pa.Table.from_batches([batch]))
        out = tally.answer()
        pa.default_memory_pool().release_unused()   # the read's buffers: back to the system
    except Exception as exc:  # noqa: BLE001 - one line, no private value
        raise private_read_error(part, exc, "the scan of the private part") from None
    out["columns"] = {"names": list(cols.names), "list_column": cols.list_column,
                      "categorical": list(cols.categorical)}
    return out


def scan_answer_or_error(spec: ScanSpec, key: bytes) -> dict:
    """:func:`scan` for a remote task: the answer, or ``{"error": one line}`` (an exception
    crossing Ray would carry a traceback; this carries only the scrubbed line)."""
    try:
        return scan(spec, key)
    except RknnError as exc:
        return {"error": str(exc).splitlines()[0]}

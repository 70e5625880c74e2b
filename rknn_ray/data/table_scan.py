"""The private part's scan, where the private rows are read, before the job reserves budget.

The driver never loads private features or labels. What it needs from them it
gets from this scan, which runs in a short-lived process of its own (``python -m
rknn_ray.data.table_scan``, the spec on stdin, one JSON line on stdout) and returns only:
the record count, how many clients each shard will hold, the records' exact and near
fingerprints (the budget's source, rknn_ray.accounting.source_identity) and a digest naming the private part
(resume). Every check that needs the rows (empty part, a label outside data.classes, a
client id missing, mixed feature lengths, empty values) fails here, so a bad file costs no
budget. Data given in memory is scanned in the driver itself, which holds it already.
"""
from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys

import numpy as np

from rknn_ray.data.tables import (Columns, Part, bucket_of, feature_matrix, label_indices,
                                  missing, open_dataset, raw_numbers, read)
from rknn_ray.errors import DataError, RknnError
from rknn_ray.accounting.source_identity import near_fingerprints, record_fingerprints


#: the answer's fingerprint arrays: exact and near (rknn_ray.accounting.source_identity)
FINGERPRINTS = ("fingerprints", "near")


def needed_columns(part: Part, cols: Columns) -> list:
    return list(dict.fromkeys([*cols.names, part.label] + ([part.client] if part.client else [])))


def scan(spec: dict, table=None) -> dict:
    """The scan itself: ``spec`` as :func:`run_scan` sends it; ``table``: rows in memory."""
    part, cols = Part(**spec["part"]), Columns(**spec["columns"])
    classes, shards = tuple(spec["classes"]), int(spec["shards"])
    schema = table.schema if table is not None else open_dataset(part.path).schema
    missing(part, schema, [part.label, part.client])
    if part.features:                  # the part's own names for the public features
        cols = Columns.resolve(part, schema, ())
    missing(part, schema, needed_columns(part, cols))
    t = table.select(needed_columns(part, cols)) if table is not None else \
        read(part.path, needed_columns(part, cols), part.key)
    m = t.num_rows
    if m == 0:
        raise DataError(f"{part.key}: {part.path or 'the private data'} holds no rows. Fix: point "
                        f"{part.key}.path at the private records")
    raw = raw_numbers(feature_matrix(t, cols, part, spec.get("width")))
    if not np.isfinite(raw).all():
        bad = int(np.flatnonzero(~np.isfinite(raw).all(axis=1))[0])
        raise DataError(f"{part.key}: records with NaN or infinite features (first at row {bad}). "
                        "Fix: drop or impute them")
    y = label_indices(t, part.label, classes, part)
    if raw.shape[1] != spec.get("width", raw.shape[1]):
        raise DataError(f"{part.key}: a record has {raw.shape[1]} feature values, a public one "
                        f"{spec['width']}. Fix: give every part the same features")
    named = {**spec, "part": {k: v for k, v in spec["part"].items() if k != "path"}}
    h = hashlib.sha256(json.dumps(named, sort_keys=True, default=str).encode())   # not the path
    h.update(np.ascontiguousarray(raw, "<f4").tobytes())
    h.update(np.ascontiguousarray(y, "<i8").tobytes())
    if part.client:
        holders = t.column(part.client)
        if holders.null_count:
            raise DataError(f"{part.key}: client column {part.client!r} has {holders.null_count} "
                            "empty values. Fix: give every row its holder's id, or unset "
                            f"{part.key}.client (then each record is its own client)")
        rows, ids, id_bucket = bucket_of(holders, shards)
        clients = np.bincount(id_bucket, minlength=shards)
        h.update(np.ascontiguousarray(rows, "<i8").tobytes())
        h.update("\n".join(ids).encode())
    else:
        cuts = np.linspace(0, m, min(shards, m) + 1).astype(np.int64)
        clients = np.diff(cuts)
    return {"rows": int(m), "clients": [int(c) for c in clients], "digest": h.hexdigest()[:32],
            "columns": {"names": list(cols.names), "list_column": cols.list_column,
                        "categorical": list(cols.categorical)},
            "fingerprints": record_fingerprints(raw), "near": near_fingerprints(raw)}


def run_scan(spec: dict) -> dict:
    """:func:`scan` in a child process: only its answer reaches the driver."""
    proc = subprocess.run([sys.executable, "-m", "rknn_ray.data.table_scan"],
                          input=json.dumps(spec), capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        answer = {}
    if "error" in answer:
        raise DataError(answer["error"])
    if proc.returncode != 0 or "rows" not in answer:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"the scan of the private data failed ({tail}). Fix: check "
                        "data.private.path can be read from this machine")
    for key in FINGERPRINTS:
        answer[key] = np.frombuffer(base64.b64decode(answer[key]), "<u8").copy()
    return answer


def main() -> int:
    spec = json.loads(sys.stdin.read())
    try:
        out = scan(spec)
    except RknnError as exc:
        print(json.dumps({"error": str(exc).splitlines()[0]}), flush=True)
        return 2
    for key in FINGERPRINTS:
        out[key] = base64.b64encode(np.ascontiguousarray(out[key], "<u8").tobytes()).decode()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

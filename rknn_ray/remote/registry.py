"""The holder registry as the operator's job sees it: which holders take part and how many
records each holds, public under the job's relation (record-level, replace-one; docs/
threat-model.md), and nothing else.

The same file the shuffler service is started with (``--holders``): one hex Ed25519 public
key per line, then the holder's record count. The job's data is the public side of the
user's table plus these counts (:func:`registry_data`), in place of the private part's scan:
the operator's processes never open a holder's file.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rknn_ray.accounting.source_identity import FINGERPRINT_DTYPE
from rknn_ray.errors import DataError


@dataclass(frozen=True)
class Registry:
    keys: tuple          # 32 raw Ed25519 bytes per holder, in file order
    records: tuple       # each holder's record count (public)
    digest: str          # SHA-256 of the file: names the job's record source in its ledger
    path: str


def read_registry(path: str) -> Registry:
    """The registry (DataError with one line: a bad line, a missing count, a repeated key)."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"remote.registry: no file at {p}. Fix: write one line per holder: its "
                        "hex Ed25519 public key (rknn-ray holder keygen prints it) and its record count")
    keys, records = [], []
    body = p.read_bytes()
    for n, line in enumerate(body.decode(errors="replace").splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        try:
            key = bytes.fromhex(words[0])
            count = int(words[1]) if len(words) == 2 else -1
        except ValueError:
            key, count = b"", -1
        if len(key) != 32 or count < 1:
            raise DataError(f"remote.registry: {p} line {n} is not '<64 hex digits> <record "
                            "count >= 1>'. Fix: one holder per line, its public key then how many "
                            "records it holds (public under the job's relation)")
        keys.append(key)
        records.append(count)
    if not keys:
        raise DataError(f"remote.registry: {p} lists no holder. Fix: one line per holder")
    if len(set(keys)) != len(keys):
        raise DataError(f"remote.registry: {p} lists a holder key twice. Fix: one line per holder")
    return Registry(tuple(keys), tuple(records), hashlib.sha256(body).hexdigest(), str(p))


def registry_data(cfg, pending):
    """The job's PreparedData from the public side of ``pending`` (the user's table,
    rknn_ray.data.kinds.table) and the registry's public counts: no private row, no
    fingerprint (the operator holds no record pool; each holder's own ledger is its budget)."""
    reg = read_registry(cfg.remote.registry)
    bound = int(cfg.data.max_records_per_client or 1)
    counts = np.asarray(reg.records, np.int64)
    if int(counts.max()) > bound:
        raise DataError(f"remote.registry: a holder declares {int(counts.max())} records, above "
                        f"data.max_records_per_client={bound}. Fix: raise the bound (it is public "
                        "and sets each holder's message), or register that holder's count within it")
    cols = pending.spec.columns
    found = {"rows": int(counts.sum()), "holders": len(reg.keys), "columns": cols.__dict__,
             "clients": [len(reg.keys)], "shard_digests": [], "key": b"", "kept_per_shard": [],
             "kept": int(np.minimum(counts, bound).sum()), "largest_holder": int(counts.max()),
             "fingerprints": np.zeros(0, FINGERPRINT_DTYPE), "near": np.zeros(0, FINGERPRINT_DTYPE),
             "digest": "remote-registry:" + reg.digest}
    data = pending.complete(found)
    data.holders.update({"column": "registry", "remote": True, "registry": reg.path,
                         "bound": bound})
    data.record_bound, data.clients = bound, len(reg.keys)     # each holder is one client
    return data

"""Which private records a job touches: per-record fingerprints of the source's record pool.

Record-level DP composes per record, so a budget belongs to the records themselves, not to
the split, seed, partition or client count a job happens to use. A job's *record pool* is
every record its split loaded (private, public and evaluation parts together: under
another split rule or seed any of them can become private). Each record is fingerprinted
by its features alone (a relabelled copy of a record is still that record), so the
ledger can tell that two jobs share records even when one uses a subset of the other's
files (rknn_ray/accounting/budget_store.py matches and merges sources on any overlap).

:func:`private_data_digest` is the older, narrower digest (the private part as one job
split and partitioned it). It no longer keys the budget; under the ledger's secret key it
names one release (``release.npz``: resume must find the same private data), and it is
the identity ledgers written before the record-pool identity used, so the migration can
find them. Nothing published is a bare digest of private records (a reader who knows all
records but one could test guesses against it): a source's name is random.
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

FINGERPRINT_DTYPE = np.dtype("<u8")


def record_fingerprints(x: np.ndarray) -> np.ndarray:
    """Sorted unique 64-bit fingerprints (blake2b of each record's little-endian float32
    feature bytes) of the records in ``x`` (N, ...)."""
    a = np.ascontiguousarray(np.asarray(x, dtype="<f4").reshape(len(x), -1))
    rows = a.view(np.uint8).reshape(len(a), -1)
    out = np.fromiter((int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(),
                                      "little") for r in rows), dtype=FINGERPRINT_DTYPE, count=len(rows))
    return np.unique(out)


def pool_fingerprints(splits) -> np.ndarray:
    """Fingerprints of every record a job's split loaded (private + public + evaluation)."""
    parts = [record_fingerprints(x) for x in (splits.private_x, splits.public_x, splits.eval_x)
             if len(x)]
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, FINGERPRINT_DTYPE)


def private_data_digest(cfg, private_x: np.ndarray, private_y: np.ndarray,
                        client_ids: np.ndarray) -> tuple[str, str]:
    """(digest, description) of one job's private part as split and partitioned.

    Covers the manifest (dataset, root, split rule, seed, partition, clients, alpha) and the
    private records' bytes: exactly the ledger identity before the record-pool identity
    (do not change it: the migration of old ledgers and old run folders depends on it).
    """
    d = cfg.data
    manifest = {"dataset": d.dataset, "data_root": d.data_root, "split": d.split,
                "seed": cfg.run.seed, "partition": d.partition, "clients": d.clients,
                "alpha": d.alpha, "synthetic": d.synthetic}
    h = hashlib.sha256(json.dumps(manifest, sort_keys=True, default=str).encode())
    for arr in (private_x, private_y, client_ids):
        a = np.ascontiguousarray(arr)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(memoryview(a).cast("B"))
    description = (f"{d.dataset} (split {d.split}, seed {cfg.run.seed}, {d.partition} partition, "
                   f"{len(private_y)} private records)")
    return h.hexdigest()[:32], description


def job_source(store, cfg, data) -> tuple[str, str, str]:
    """(budget identity, description, release key) of a prepared job (``data``: PreparedData):
    the source its record pool belongs to in ``store`` (registered, merged and migrated
    there; a random name), and the digest of its private part under the ledger's key, which
    names its release (neither published value is a function of the records alone)."""
    sp = data.splits
    if getattr(data, "pool", None) is not None:     # fingerprinted where the rows were read
        digest, pool = data.private_digest, data.pool
    else:
        digest, _ = private_data_digest(cfg, sp.private_x, sp.private_y, data.client_ids)
        pool = pool_fingerprints(sp)
    identity, described = store.source_identity(cfg.data.dataset, pool, legacy=digest)
    return identity, described, store.keyed_name(digest)


def legacy_release_name(cfg, data) -> str:
    """The bare digest run folders saved before release names were keyed (resume accepts it)."""
    sp = data.splits
    if getattr(data, "pool", None) is not None:
        return data.private_digest
    return private_data_digest(cfg, sp.private_x, sp.private_y, data.client_ids)[0]

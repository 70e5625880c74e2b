"""Which private records a job touches: per-record fingerprints of the source's record pool.

Record-level DP composes per record, so a budget belongs to the records themselves, not to
the split, seed, partition or client count a job happens to use. A job's *record pool* is
every record its split loaded (private, public and evaluation parts together: under
another split rule or seed any of them can become private). A user's table
(``data.dataset: table``) has no split: its public and evaluation files are read in the
clear and spend nothing, so its pool is its private part alone, and two private tables that
share only those files are two sources. Each record is fingerprinted
by its features alone (a relabelled copy of a record is still that record), so the
ledger can tell that two jobs share records even when one uses a subset of the other's
files (rknn_ray/accounting/budget_store.py matches and merges sources on any overlap).
The ledger stores these digests only under its own secret key (``BudgetStore.keyed_fingerprints``):
its file alone does not answer "is this record in a source?" for a reader without the key.

Each record also has a *near* fingerprint, of a coarse quantization of its features scaled
by their largest magnitude (:func:`near_fingerprints`): a copy whose every feature stays
within its step (one float32 ulp, x255/256, +1/16 on an always-zero digits pixel) has the
same one, so the sources still meet. A match of either kind only ever merges sources
(more conservative); a shifted or otherwise rearranged copy is not recognized.

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


def sorted_unique(values) -> np.ndarray:
    """``np.unique`` of a 1-D array (sorted distinct values), by a sort: numpy 2.3+'s
    hash-based ``np.unique`` takes seconds per million 64-bit values (100x a sort)."""
    a = np.sort(np.asarray(values).ravel())
    return a[np.r_[True, a[1:] != a[:-1]]] if a.size else a


def blake2b_64(messages, key: bytes = b"", prefix: bytes = b"") -> np.ndarray:
    """``int.from_bytes(blake2b(prefix + m, key=key, digest_size=8).digest(), "little")`` of
    each bytes ``m`` (uint64, in order): one hash state copied per message (the key's block
    and the prefix are hashed once), the digests joined and read as little-endian words."""
    base = hashlib.blake2b(prefix, key=key, digest_size=8)
    copy = base.copy
    out = []
    add = out.append
    for m in messages:
        h = copy()
        h.update(m)
        add(h.digest())
    return np.frombuffer(b"".join(out), FINGERPRINT_DTYPE) if out \
        else np.zeros(0, FINGERPRINT_DTYPE)


def _rows_as_bytes(a: np.ndarray) -> list:
    """Each row of the C-contiguous 2-D ``a`` as one bytes object."""
    a = np.ascontiguousarray(a)
    width = a.shape[1] * a.itemsize if a.ndim == 2 else a.itemsize
    if width == 0:
        return [b""] * len(a)
    return a.view(np.dtype((np.void, width))).ravel().tolist()


def record_fingerprints(x: np.ndarray) -> np.ndarray:
    """Sorted unique 64-bit fingerprints (blake2b of each record's little-endian float32
    feature bytes) of the records in ``x`` (N, ...)."""
    with np.errstate(over="ignore"):    # beyond float32's range: +-inf (no warning on a console)
        a = np.ascontiguousarray(np.asarray(x, dtype="<f4").reshape(len(x), -1))
    return sorted_unique(blake2b_64(_rows_as_bytes(a)))


def keyed_fingerprints(key: bytes, fingerprints) -> np.ndarray:
    """Sorted unique keyed BLAKE2b-64 of each 64-bit fingerprint under ``key`` (the ledger's
    fingerprint key): the form the ledger stores and matches, and the only form in which a
    private record's fingerprint leaves the place its row was read."""
    fp = sorted_unique(np.asarray(fingerprints, dtype=FINGERPRINT_DTYPE))
    return sorted_unique(blake2b_64(_rows_as_bytes(fp.reshape(-1, 1)), key=key))


#: quantization steps between 0 and a record's largest |feature| (near fingerprints), and
#: where the steps' boundaries sit: a feature at 0 keeps its code up to +0.075 of the largest
#: (+1/16 on a digits pixel), and no value k/15 or k/16 of the largest lies on a boundary
NEAR_LEVELS = 4
NEAR_OFFSET = 0.2
#: records with fewer features get no near fingerprint: their coarse codes are too few to
#: keep unrelated data sets apart
NEAR_MIN_FEATURES = 16


#: a table's near code: each value's sign and its magnitude in steps of 1/NEAR_TABLE_LEVELS
#: octave (boundaries moved by NEAR_OFFSET): relative to the value itself, so columns of
#: any scale all count (one record's largest value would zero the rest of a table's)
NEAR_TABLE_LEVELS = 1


def _table_codes(a: np.ndarray) -> np.ndarray:
    """(N, F) int16 near codes of a table chunk: 0 for 0, else 2 * octave step + sign."""
    with np.errstate(divide="ignore", invalid="ignore"):
        step = np.floor(np.log2(np.abs(a)) * NEAR_TABLE_LEVELS + (0.5 + NEAR_OFFSET))
    step = np.clip(np.nan_to_num(step, nan=0.0, posinf=0.0, neginf=0.0), -4000, 4000)
    codes = (step.astype(np.int16) * 2 + (a < 0)).astype("<i2")
    codes[a == 0] = np.int16(-32768)
    return codes


def near_fingerprints(x: np.ndarray, table: bool = False) -> np.ndarray:
    """Sorted unique 64-bit fingerprints of each record's coarse form: its features divided
    by their largest magnitude, in steps of 1/NEAR_LEVELS (boundaries moved by NEAR_OFFSET;
    blake2b, a domain tag apart from :func:`record_fingerprints`); ``table``: each value's
    own octave instead (:func:`_table_codes`: a table's columns differ in scale). Empty for
    records of fewer than NEAR_MIN_FEATURES features."""
    x = np.asarray(x).reshape(len(x), -1)
    if len(x) == 0 or x.shape[1] < NEAR_MIN_FEATURES:
        return np.zeros(0, FINGERPRINT_DTYPE)
    tag = (b"near-table%d+%g:" % (NEAR_TABLE_LEVELS, NEAR_OFFSET) if table
           else b"near%d+%g:" % (NEAR_LEVELS, NEAR_OFFSET))
    out = np.empty(len(x), FINGERPRINT_DTYPE)
    for start in range(0, len(x), 4096):           # a chunk's float32 copy at a time
        with np.errstate(over="ignore"):    # beyond float32's range: +-inf, then 0
            a = x[start:start + 4096].astype("<f4")
        if not np.isfinite(a).all():
            a = np.nan_to_num(a, posinf=0.0, neginf=0.0)
        if table:
            q = _table_codes(a)
        else:
            scale = np.abs(a).max(axis=1, keepdims=True)
            scale[~(scale > 0)] = 1.0
            q = np.floor(a / scale * NEAR_LEVELS + (0.5 + NEAR_OFFSET)).astype("<i1")
        out[start:start + len(q)] = blake2b_64(_rows_as_bytes(q), prefix=tag)
    return sorted_unique(out)


def _pool(splits, fingerprint) -> np.ndarray:
    parts = [fingerprint(x) for x in (splits.private_x, splits.public_x, splits.eval_x)
             if len(x)]
    return sorted_unique(np.concatenate(parts)) if parts else np.zeros(0, FINGERPRINT_DTYPE)


def pool_fingerprints(splits) -> np.ndarray:
    """Fingerprints of every record a job's split loaded (private + public + evaluation)."""
    return _pool(splits, record_fingerprints)


def pool_near_fingerprints(splits) -> np.ndarray:
    """Near fingerprints (:func:`near_fingerprints`) of every record a job's split loaded."""
    return _pool(splits, near_fingerprints)


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
        digest, pool, near = data.private_digest, data.pool, getattr(data, "near_pool", None)
    else:
        digest, _ = private_data_digest(cfg, sp.private_x, sp.private_y, data.client_ids)
        pool, near = pool_fingerprints(sp), pool_near_fingerprints(sp)
    identity, described = store.source_identity(
        cfg.data.dataset, pool, legacy=digest, near=near,
        keyed=getattr(data, "pool_keyed", None), keyed_near=getattr(data, "near_keyed", None))
    return identity, described, store.keyed_name(digest)


def legacy_release_name(cfg, data) -> str:
    """The bare digest run folders saved before release names were keyed (resume accepts it)."""
    sp = data.splits
    if getattr(data, "pool", None) is not None:
        return data.private_digest
    return private_data_digest(cfg, sp.private_x, sp.private_y, data.client_ids)[0]

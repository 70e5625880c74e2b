"""Assign private records to virtual clients: IID, Dirichlet label skew, one per client.

All schemes are vectorized (a handful of numpy passes over records and clients,
a loop only over classes), so a million records or clients take well under a second.
They return ``client_ids`` (one int64 per record); :func:`order_by_client` groups
records by client, which is the order :class:`rknn_ray.labeling.answers.RecordAnswers` wants.

* ``iid``: a seeded random permutation dealt round-robin; sizes differ by at most 1.
* ``dirichlet``: for every class ``c`` draw ``p_c ~ Dir(alpha * 1_n)`` over the ``n``
  clients and cut that class's (shuffled) records at the cumulative proportions
  (the "distribution-based label imbalance" of Yurochkin et al. 2019 / NIID-Bench).
  Small ``alpha`` -> each class lives on few clients. Gamma draws are made in log
  space (``log G(a) = log G(a+1) - Exp(1)/a``, i.e. ``G(a+1) U^(1/a)``) so a tiny
  ``alpha`` cannot underflow to 0/0.
  Clients left empty then receive one record each, taken at random from clients
  holding more than one (``ensure_nonempty``); when ``n`` is close to ``m`` this
  moves many records and the skew shrinks accordingly.
* ``one_per_client``: client ``i`` holds exactly one record (``num_clients = m``), the
  paper's most stringent local-DP setting.

``num_clients > m`` cannot give every client a record: ConfigError (lower
``num_clients``, or use ``one_per_client``).

Public record bounds. How many records the largest client holds sets public things (the
central message size, the multi-message allowance, the auto-s message cap), but under
``dirichlet`` it is a function of the private labels (changing one label can move it). So
the bound is public: declared, or derived from public counts
(:func:`public_record_bound`), and a client's records beyond it are dropped
(:func:`held_within_bound`, the driver's count and its non-private reference). The client
shards pick the records they send themselves (:func:`sender_order`): at most the bound per
client, in an order drawn from the shard's secret, so no record's value moves a sender.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from rknn_ray.errors import ConfigError, DataError
from rknn_ray.rng import chacha_generator, seeded_generator

SCHEMES = ("iid", "dirichlet", "one_per_client")


def _check_labels(labels) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"labels must be a 1-D integer array, got {y.dtype} {y.shape}. "
                        "Fix: pass class indices (int), one per record.")
    if len(y) and y.min() < 0:
        first = int(np.flatnonzero(y < 0)[0])
        raise DataError(f"{int((y < 0).sum())} negative labels (first at index {first}). "
                        "Fix: map labels to 0..num_classes-1.")
    return y


def partition(labels: np.ndarray, num_clients: int | None, scheme: str = "iid",
              alpha: float = 0.5, seed: int = 0, ensure_nonempty: bool = True) -> np.ndarray:
    """Client id (0..num_clients-1, int64) of every record; see the module docstring."""
    y = _check_labels(labels)
    m = len(y)
    if scheme not in SCHEMES:
        raise ConfigError("partition.scheme", f"unknown scheme {scheme!r}", f"use one of {SCHEMES}")
    if m == 0:
        raise DataError("no records to partition. Fix: check the private split is non-empty.")
    rng = seeded_generator(seed)
    if scheme == "one_per_client":
        if num_clients is not None and int(num_clients) != m:
            raise ConfigError("partition.num_clients",
                              f"one_per_client needs num_clients == number of records ({m}), "
                              f"got {num_clients}",
                              f"set num_clients to {m} (or null), or use scheme 'iid'")
        return rng.permutation(m).astype(np.int64)
    if num_clients is None or int(num_clients) != num_clients or num_clients < 1:
        raise ConfigError("partition.num_clients", f"must be a positive integer, got {num_clients!r}",
                          "set num_clients >= 1")
    n = int(num_clients)
    if n > m:
        raise ConfigError("partition.num_clients",
                          f"{n} clients but only {m} records: some clients would hold nothing",
                          f"set num_clients <= {m}, or use scheme 'one_per_client'")
    if scheme == "iid":
        ids = np.empty(m, dtype=np.int64)
        ids[rng.permutation(m)] = np.arange(m, dtype=np.int64) % n
        return ids
    if not (np.isfinite(alpha) and alpha > 0):
        raise ConfigError("partition.alpha", f"must be a finite number > 0, got {alpha!r}",
                          "use e.g. 0.1 (strong skew) .. 100 (nearly IID)")
    ids = dirichlet_ids(y, n, float(alpha), rng)
    if ensure_nonempty:
        fill_empty_clients(ids, n, rng)
    return ids


def public_record_bound(scheme: str, num_records: int, num_clients: int,
                        declared: int | None = None) -> int:
    """The public bound on records per client: ``declared``, else ceil(m / n) for ``iid``
    (exactly what it deals) or 1 for ``one_per_client``. Reads counts only (m, n are public
    under replace-one neighbours); ``dirichlet`` needs a declared bound."""
    if declared is not None:
        if int(declared) != declared or declared < 1:
            raise ConfigError("data.max_records_per_client",
                              f"must be a positive integer, got {declared!r}",
                              "set data.max_records_per_client >= 1")
        return int(declared)
    if scheme == "one_per_client":
        return 1
    if scheme == "iid":
        return -(-int(num_records) // max(1, int(num_clients)))
    raise ConfigError("data.max_records_per_client",
                      f"partition {scheme!r} deals records by their private labels, so its "
                      "largest client is private and cannot set a public bound",
                      "declare data.max_records_per_client; records beyond it are dropped")


_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)


def _mix(h: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, vectorized (uint64 arithmetic wraps)."""
    h = (h ^ (h >> np.uint64(30))) * _M1
    h = (h ^ (h >> np.uint64(27))) * _M2
    return h ^ (h >> np.uint64(31))


def row_hashes(raw: np.ndarray, labels: np.ndarray, key: bytes,
               holders: np.ndarray | None = None) -> np.ndarray:
    """A keyed 64-bit hash of each record: its features (as float32, the fingerprint's
    precision), its label and, where given, its holder's keyed id hash. Vectorized over rows,
    a loop over columns; the per-column multipliers come from ``key``."""
    with np.errstate(over="ignore"):    # beyond float32's range: +-inf (no warning on a console)
        a = np.ascontiguousarray(np.asarray(raw, dtype="<f4").reshape(len(raw), -1))
    words = a.view("<u4")
    extra = [np.asarray(labels, np.int64).astype(np.uint64)]
    if holders is not None:
        extra.append(np.asarray(holders, np.uint64))
    width = words.shape[1] + len(extra)
    mult = np.frombuffer(hashlib.shake_256(key).digest(8 * (width + 1)), "<u8").astype(np.uint64)
    h = np.full(len(a), mult[0], np.uint64)
    t = np.empty_like(h)

    def step(col, m):           # h = _mix(h ^ (col + m)), in place (no array per operation)
        np.add(col, m, out=t, casting="unsafe")
        np.bitwise_xor(h, t, out=h)
        for shift, mult_by in ((_S30, _M1), (_S27, _M2), (_S31, None)):
            np.right_shift(h, shift, out=t)
            np.bitwise_xor(h, t, out=h)
            if mult_by is not None:
                np.multiply(h, mult_by, out=h)
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):
            step(words[:, j].astype(np.uint64), mult[j + 1])
        for j, col in enumerate(extra, start=words.shape[1]):
            step(col, mult[j + 1])
    return h


def keep_key(seed: int) -> bytes:
    """The key a holder's kept records are chosen by (:func:`kept_within_bound`): the job's
    seed only, so the choice is a function of the holder's own records and the seed."""
    return hashlib.sha256(f"rknn-ray kept records, seed {int(seed)}".encode()).digest()


def kept_within_bound(holder: np.ndarray, content: np.ndarray, bound: int) -> np.ndarray:
    """Mask of the records holders keep: each holder's ``bound`` records of smallest
    ``content`` (a 64-bit key per record: a secret priority in :func:`sender_order`, a value
    hash in :func:`held_within_bound`); never a function of other holders' records."""
    holder = np.asarray(holder)
    keep = np.ones(holder.size, bool)
    if holder.size == 0:
        return keep
    order = np.lexsort((np.asarray(content, np.uint64), holder))
    h = holder[order]
    first = np.empty(h.size, bool)          # where each holder's run starts, in sorted order
    first[0] = True
    np.not_equal(h[1:], h[:-1], out=first[1:])
    del h
    # each record's rank within its holder (positions minus their run's start), in the
    # smallest integer type that holds them: a shard's open peaks here (issue 46)
    pos = np.arange(first.size, dtype=np.int32 if first.size < 2 ** 31 else np.int64)
    start = np.where(first, pos, 0)
    del first
    np.maximum.accumulate(start, out=start)
    pos -= start
    del start
    keep[order[pos >= bound]] = False
    return keep


def sender_order(owner: np.ndarray, bound: int, order_key: bytes | None = None) -> np.ndarray:
    """Row indices of the records the owners keep (at most ``bound`` each) in the order they
    become senders: grouped by owner (ascending), and within an owner by a priority drawn
    from ``order_key`` (a key derived from the client shard's secret; None: a fresh key from
    the OS CSPRNG). Which records an owner keeps, and which sender each becomes, are then a
    function of the rows' positions and the shard's secret, never of a record's value or a
    public key: replacing one record's value in place changes the input of at most one sender
    (issue 55; in the local model the server sees every report beside its sender). Over the
    secret, an owner's kept records are a uniformly random subset in a uniformly random order,
    whatever order its rows come in, so the view depends on the owner's multiset only."""
    owner = np.asarray(owner)
    if owner.size == 0:
        return np.zeros(0, np.int64)
    priority = chacha_generator(order_key or os.urandom(32)).bit_generator.random_raw(owner.size)
    held = np.flatnonzero(kept_within_bound(owner, priority, bound))
    order = held[np.lexsort((priority[held], owner[held]))]
    del priority, held
    return order


def held_within_bound(client_ids: np.ndarray, bound: int, seed: int = 0,
                      features: np.ndarray | None = None,
                      labels: np.ndarray | None = None) -> np.ndarray:
    """The driver's mask of the records clients keep (its count and the non-private
    reference): at most ``bound`` per client, by a keyed hash of each record's own value
    under the seed. The shards choose the records they send themselves (:func:`sender_order`)."""
    ids = np.asarray(client_ids, dtype=np.int64)
    if ids.size == 0 or np.bincount(ids).max() <= bound:
        return np.ones(ids.size, dtype=bool)
    x = np.zeros((ids.size, 0)) if features is None else np.asarray(features).reshape(ids.size, -1)
    y = np.zeros(ids.size, np.int64) if labels is None else labels
    return kept_within_bound(ids, row_hashes(x, y, keep_key(seed)), bound)


def dirichlet_ids(y: np.ndarray, n: int, alpha: float, rng) -> np.ndarray:
    """Per-class Dirichlet(alpha) proportions over clients, cut at cumulative shares."""
    m = len(y)
    perm = rng.permutation(m)
    grouped = perm[np.argsort(y[perm], kind="stable")]   # records by class, random within class
    counts = np.bincount(y)
    ids = np.empty(m, dtype=np.int64)
    start = 0
    for m_c in counts:                                    # loop over classes, not clients
        if m_c == 0:
            continue
        log_g = np.log(rng.standard_gamma(alpha + 1.0, size=n)) - rng.standard_exponential(n) / alpha
        p = np.exp(log_g - log_g.max())
        cuts = np.rint(np.cumsum(p) * (m_c / p.sum())).astype(np.int64)
        cuts[-1] = m_c
        per_client = np.diff(cuts, prepend=0)
        ids[grouped[start:start + m_c]] = np.repeat(np.arange(n, dtype=np.int64), per_client)
        start += m_c
    return ids


def fill_empty_clients(ids: np.ndarray, n: int, rng) -> None:
    """Give each empty client one record taken from a client that holds >= 2 (in place)."""
    sizes = np.bincount(ids, minlength=n)
    empty = np.flatnonzero(sizes == 0)
    if empty.size == 0:
        return
    order = np.argsort(ids, kind="stable")
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    rank = np.arange(len(ids)) - offsets[ids[order]]
    spare = order[rank >= 1]            # all but the first record of every client
    donors = rng.choice(spare, size=empty.size, replace=False)
    ids[donors] = rng.permutation(empty)


def order_by_client(client_ids: np.ndarray) -> np.ndarray:
    """Permutation that groups records by client (stable: record order kept within a client)."""
    return np.argsort(np.asarray(client_ids), kind="stable")


def client_offsets(client_ids: np.ndarray, num_clients: int) -> np.ndarray:
    """(num_clients + 1,) offsets: after ``order_by_client``, client i is ``[off[i], off[i+1])``."""
    sizes = np.bincount(np.asarray(client_ids), minlength=num_clients)
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def label_skew(labels: np.ndarray, client_ids: np.ndarray, num_classes: int) -> float:
    """Record-weighted mean total-variation distance of client label mixes from the global mix.

    0 for perfectly IID clients; approaches 1 - max_c(global share) when every
    client holds a single class. Used to check and report how skewed a partition is.
    """
    y, c = np.asarray(labels, dtype=np.int64), np.asarray(client_ids, dtype=np.int64)
    n = int(c.max()) + 1
    joint = np.bincount(c * num_classes + y, minlength=n * num_classes).reshape(n, num_classes)
    sizes = joint.sum(axis=1)
    keep = sizes > 0
    local = joint[keep] / sizes[keep, None]
    glob = np.bincount(y, minlength=num_classes) / len(y)
    tv = 0.5 * np.abs(local - glob).sum(axis=1)
    return float((tv * sizes[keep]).sum() / len(y))

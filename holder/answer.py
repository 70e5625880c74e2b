"""A holder's answer to a round: its rows featurized, voted, randomized, sealed.

Every step is the library's own: the published encoder (rknn_ray.published_encoder, no
pickle), reverse k-NN to the specification's queries (rknn_ray.labeling.rknn, faiss), the
mechanism the specification names (holder.accountant.mechanism_of), HPKE sealing for the
server then each shuffler (sealing.hpke_report). The randomness and the report ids come
from the holder's secret and the specification's hash, so the same holder answering the
same specification makes the same bytes.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from holder.accountant import SpecRefused
from holder.identity import Identity
from rknn_ray.errors import first_line
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.labeling.connection import RULES, Connection
from rknn_ray.labeling.rknn import build_answers
from rknn_ray.published_encoder import PublishedEncoder
from rknn_ray.rng import GeneratorPool
from sealing.hpke_report import seal_reports
from sealing.round_spec import RoundSpec


class DataFileError(ValueError):
    """The holder's own data file cannot be read as the specification needs (one line)."""


def read_rows(path: str | Path, label: str | None, encoder: PublishedEncoder):
    """(raw feature table, class indices) of the holder's CSV or Parquet file."""
    import pyarrow as pa  # defers pyarrow's readers to the one call that needs them
    from pyarrow import csv, parquet
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"--data: no file at {path}; give this holder's own CSV or Parquet file")
    try:
        table = parquet.read_table(path) if path.suffix == ".parquet" else csv.read_csv(path)
        table.column_names          # decoded here: a header that is not UTF-8 fails now
    except (pa.ArrowInvalid, OSError, UnicodeDecodeError) as exc:
        raise DataFileError(f"--data: {path} does not read as "
                            f"{'Parquet' if path.suffix == '.parquet' else 'CSV'} "
                            f"({first_line(exc) or type(exc).__name__}); give "
                            "this holder's rows as a UTF-8 CSV with a header, or Parquet") from None
    if table.num_rows == 0:
        raise DataFileError(f"--data: {path} holds no rows; a holder answers with its records "
                            "(at least one)")
    label = label or (encoder.table or {}).get("label")
    if not label or label not in table.column_names:
        raise DataFileError(f"--data: {path} has no label column {label!r}; name it with --label "
                            f"(columns: {', '.join(table.column_names[:10])})")
    names = [str(v) for v in table.column(label).to_pylist()]
    index = {c: i for i, c in enumerate(encoder.classes)}
    unknown = sorted(set(names) - set(index))
    if unknown:
        raise DataFileError(f"--data: labels {unknown[:5]} are not among the published classes "
                            f"{list(encoder.classes)}; map them to those class names")
    return table.drop_columns([label]), np.array([index[n] for n in names], np.int64)


def payloads(spec: RoundSpec, mech, identity: Identity, encoder: PublishedEncoder,
             rows, labels: np.ndarray, inputs: np.ndarray | None = None) -> np.ndarray:
    """(M, payload_len) uint8: this holder's randomized messages (one virtual client).
    ``inputs``: ``encoder.inputs(rows)`` where the caller has it already."""
    inputs = encoder.inputs(rows) if inputs is None else inputs
    return payloads_many(spec, mech, [identity], inputs, labels, [0, len(labels)])[0]


def inputs_many(encoder: PublishedEncoder, rows, bounds) -> np.ndarray:
    """``encoder.inputs`` of many holders' rows (holder j: rows ``bounds[j]:bounds[j+1]``),
    each row's values exactly what that holder alone computes: one call where the encoder is
    the featurizer only or a row-wise one after it (element by element: ``raw``), one per
    holder where a learned transform follows it (a matrix product may round otherwise for
    another number of rows)."""
    if encoder.encoder is None or encoder.encoder.row_wise:
        return encoder.inputs(rows)
    return np.concatenate([encoder.inputs(rows.slice(lo, hi - lo))
                           for lo, hi in zip(bounds[:-1], bounds[1:])])


def payloads_many(spec: RoundSpec, mech, identities: list[Identity], inputs: np.ndarray,
                  labels: np.ndarray, bounds) -> list[np.ndarray]:
    """Holder j's messages (rows ``bounds[j]:bounds[j+1]`` of ``inputs``, its own secret):
    the same bytes as each holder answering alone, with the queries' search shared. Each
    shared search covers whole holders and few enough rows for faiss's row-by-row path
    (:func:`row_by_row`, the one a holder of a few rows takes alone); a larger holder is
    searched alone, as it would search."""
    connection = connection_of(spec)
    emb = np.asarray(inputs).reshape(len(labels), -1)
    queries = np.asarray(spec.queries, np.float32)
    if emb.shape[1] != queries.shape[1]:
        raise SpecRefused(f"the published encoder makes {emb.shape[1]} features but the "
                          f"specification's queries have {queries.shape[1]}: inconsistent")
    labels = np.asarray(labels, np.int64)
    hot = labels if labels.ndim == 2 else labels[:, None]      # (rows, r) class indices
    num_classes = mech.params.num_classes
    neighbors = np.empty((len(labels), spec.k), np.int64)
    with _one_thread():
        for lo, hi in _searches(bounds, row_by_row(emb.shape[1] + 1)):
            neighbors[lo:hi] = build_answers(emb[lo:hi], labels[lo:hi],
                                             np.zeros(hi - lo, np.int64), queries, spec.k,
                                             num_classes, connection).neighbors
    spec_hash = spec.content_hash()
    answers = [RecordAnswers(neighbors[lo:hi], hot[lo:hi], np.zeros(hi - lo, np.int64),
                             len(queries), num_classes) for lo, hi in zip(bounds[:-1], bounds[1:])]
    # each holder's own stream (Identity.generator, from its secret), re-keyed in place
    coins = _pool().keyed([identity.generator_key(spec_hash) for identity in identities])
    many = getattr(mech, "randomize_many", None)       # Collision: each holder's same draws
    batches = (many(answers, coins) if many is not None else
               [mech.randomize(a, rng) for a, rng in zip(answers, coins)])
    for msgs in batches:
        if len(msgs) > spec.allowance:
            raise SpecRefused(f"the mechanism makes {len(msgs)} messages, above the "
                              f"specification's allowance of {spec.allowance}: inconsistent, "
                              "not answered")
    return [msgs.payloads for msgs in batches]


_POOLS = threading.local()


def _pool() -> GeneratorPool:
    """This thread's generators (payloads_many's coins live only inside one call)."""
    pool = getattr(_POOLS, "pool", None)
    if pool is None:
        pool = _POOLS.pool = GeneratorPool()
    return pool


def row_by_row(d: int) -> int:
    """The most rows of d features that faiss searches one by one (the same distances and
    neighbors for each row as searched alone): under 20 rows (its older rule, rows < the
    threshold) and under its ``distance_compute_blas_threshold`` values (the newer rule,
    rows * d < it); at least 1."""
    import faiss  # defers faiss to the holders that search (rknn_ray.labeling.rknn loads it)
    threshold = int(faiss.cvar.distance_compute_blas_threshold)
    return max(1, min(19, threshold - 1, (threshold - 1) // max(1, d)))


@contextmanager
def _one_thread():
    """faiss on one OpenMP thread: its row-by-row search of a few rows starts a thread per
    row otherwise (each row's result is the same either way), which costs more than it
    saves on a busy machine."""
    import faiss  # defers faiss to the holders that search (rknn_ray.labeling.rknn loads it)
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(threads)


def _searches(bounds, limit: int) -> list[tuple[int, int]]:
    """Row ranges of whole holders of at most ``limit`` rows together (a larger holder alone)."""
    out, start = [], None
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if start is not None and hi - start > limit:
            out.append((start, lo))
            start = None
        if hi - lo > limit:
            out.append((lo, hi))
        elif start is None:
            start = lo
    if start is not None:
        out.append((start, bounds[-1]))
    return [(lo, hi) for lo, hi in out if hi > lo]


def connection_of(spec: RoundSpec):
    """Which k queries a row votes for: reverse k-NN (``rknn``), or the balanced rule the
    specification names with its public per-query prices (rknn_ray.labeling.connection: a
    row's choice depends on that row and public data only)."""
    if spec.connection_rule == "rknn":
        if spec.connection_prices is not None:
            raise SpecRefused("the specification gives connection prices for reverse k-NN, "
                              "which has none: inconsistent, not answered")
        return None
    if spec.connection_rule not in RULES or spec.connection_rule == "reverse_knn":
        raise SpecRefused(f"connection rule {spec.connection_rule!r} is not one this holder "
                          f"program implements (rknn, {', '.join(r for r in RULES if r != 'reverse_knn')})")
    if spec.connection_prices is None:
        raise SpecRefused(f"the balanced connection rule {spec.connection_rule!r} needs one "
                          "price per query in the specification: not answered")
    return Connection(spec.connection_rule, np.asarray(spec.connection_prices, np.float64))


def seal(spec: RoundSpec, identity: Identity, messages: np.ndarray) -> list[bytes]:
    """The reports, sealed for the server then each shuffler, ids from the holder's secret."""
    spec_hash = spec.content_hash()
    sealed = seal_reports(spec.server_key, messages, spec_hash,
                          identity.report_ids(spec_hash, len(messages)), list(spec.shuffler_keys))
    return [row.tobytes() for row in sealed]

"""A holder's answer to a round: its rows featurized, voted, randomized, sealed.

Every step is the library's own: the published encoder (rknn_ray.published_encoder, no
pickle), reverse k-NN to the specification's queries (rknn_ray.labeling.rknn, faiss), the
mechanism the specification names (holder.accountant.mechanism_of), HPKE sealing for the
server then each shuffler (sealing.hpke_report). The randomness and the report ids come
from the holder's secret and the specification's hash, so the same holder answering the
same specification makes the same bytes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from holder.accountant import SpecRefused
from holder.identity import Identity
from rknn_ray.labeling.connection import RULES, Connection
from rknn_ray.labeling.rknn import build_answers
from rknn_ray.published_encoder import PublishedEncoder
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
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataFileError(f"--data: {path} does not read as "
                            f"{'Parquet' if path.suffix == '.parquet' else 'CSV'} ({exc})") from None
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
             rows, labels: np.ndarray) -> np.ndarray:
    """(M, payload_len) uint8: this holder's randomized messages (one virtual client)."""
    connection = connection_of(spec)
    emb = encoder.inputs(rows).reshape(len(labels), -1)
    queries = np.asarray(spec.queries, np.float32)
    if emb.shape[1] != queries.shape[1]:
        raise SpecRefused(f"the published encoder makes {emb.shape[1]} features but the "
                          f"specification's queries have {queries.shape[1]}: inconsistent")
    answers = build_answers(emb, labels, np.zeros(len(labels), np.int64), queries, spec.k,
                            mech.params.num_classes, connection)
    msgs = mech.randomize(answers, identity.generator(spec.content_hash()))
    if len(msgs) > spec.allowance:
        raise SpecRefused(f"the mechanism makes {len(msgs)} messages, above the specification's "
                          f"allowance of {spec.allowance}: inconsistent, not answered")
    return msgs.payloads


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

"""labels.parquet and the accuracy figures, on the user's rows.

One row per public row, keyed by the user's id under the user's own column name (the public
table's ``data.public.id``, as predict's output keeps it; ``id`` for row numbers, or when
the user's name is one of the file's other columns; the schema's ``id_column`` metadata
names it either way), with the released label, its class name and the released vote margin
of the row's query: everything in it is a function of the released counts and public data.
The public truth (``true_label``) is written only where the public rows carry labels (the
built-in sets do, a user's public table does not: ``public_y`` < 0 marks an unlabelled row).
An accuracy that cannot be measured is None in report.json, with the reason beside it,
never a number measured against placeholder labels.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from rknn_ray.data.splits import has_evaluation, has_public_labels

NO_EVALUATION = "no labelled evaluation set was given"
NO_PUBLIC_LABELS = "the public rows carry no labels"


def vote_margins(counts: np.ndarray) -> np.ndarray:
    """Per query: its released count of the top class minus that of the runner-up (the
    whole top count with a single class)."""
    c = np.asarray(counts, dtype=np.float64)
    if c.shape[1] < 2:
        return c[:, 0].copy()
    top2 = np.sort(c, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def class_name_list(splits, num_classes: int) -> list[str]:
    """The class names in label-index order: the declared ones, else the indices as text."""
    names = getattr(splits, "class_names", None)
    return [str(c) for c in names] if names is not None else [str(i) for i in range(num_classes)]


def public_ids(splits) -> pa.Array:
    """The user's public row ids (any type pyarrow takes), else the row numbers."""
    ids = getattr(splits, "public_ids", None)
    n = len(splits.public_y)
    if ids is None:
        return pa.array(np.arange(n, dtype=np.int64))
    arr = pa.array(ids.tolist() if isinstance(ids, np.ndarray) and ids.dtype == object else ids)
    if len(arr) != n:
        raise ValueError(f"{len(arr)} public ids for {n} public rows")
    return arr


#: labels.parquet's columns beside the id
OWN_COLUMNS = ("label", "class", "margin", "query", "weight", "soft", "true_label")


def id_column(splits) -> str:
    """The id column's name in labels.parquet: the user's public id column, else ``id``."""
    name = ((getattr(splits, "table_input", None) or {}).get("id")
            if getattr(splits, "public_ids", None) is not None else None)
    return name if name and name not in OWN_COLUMNS else "id"


def labels_table(splits, num_classes: int, counts: np.ndarray, queries, lab) -> pa.Table:
    """labels.parquet: the id (:func:`id_column`), ``label``, ``class``, ``margin``,
    ``query``, ``weight``, ``soft`` and, only when the public rows carry labels,
    ``true_label`` (null where a row has none)."""
    assignment = np.asarray(queries.assignment)
    names = np.asarray(class_name_list(splits, num_classes), dtype=object)
    hard = np.asarray(lab.public_hard)
    name = id_column(splits)
    cols = {
        name: public_ids(splits), "label": hard, "class": pa.array(names[hard].tolist(),
                                                                   type=pa.string()),
        "margin": vote_margins(counts)[assignment], "query": assignment,
        "weight": lab.public_weight,
        "soft": pa.array(list(lab.query_soft[assignment]), type=pa.list_(pa.float32())),
    }
    if has_public_labels(splits):
        y = np.asarray(splits.public_y, dtype=np.int64)
        cols["true_label"] = pa.array(y, mask=y < 0)
    return pa.table(cols, metadata={"id_column": name})


def measured(value) -> float | None:
    """An accuracy for report.json: None when it was not measured (NaN or absent)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def accuracy_section(splits, labels: float, query_labels: float, student: float) -> dict:
    """report.json's ``accuracy``: the measured figures, None where there is nothing to
    measure against, and ``not_measured`` saying why (only when something was not)."""
    out = {"labels": measured(labels), "student": measured(student), "nonprivate_labels": None,
           "query_labels": measured(query_labels)}
    why = {}
    if not has_evaluation(splits):
        out["student"], why["student"] = None, NO_EVALUATION
    if not has_public_labels(splits):
        out["labels"] = out["query_labels"] = None
        why["labels"] = why["query_labels"] = NO_PUBLIC_LABELS
    if why:
        out["not_measured"] = why
    return out


def accuracy_words(acc: dict, key: str, digits: int = 4) -> str:
    """One accuracy figure as text: the number, or why there is none."""
    v = acc.get(key)
    if v is not None and not (isinstance(v, float) and math.isnan(v)):
        return f"{v:.{digits}f}"
    why = (acc.get("not_measured") or {}).get(key)
    return f"not measured ({why})" if why else "n/a"

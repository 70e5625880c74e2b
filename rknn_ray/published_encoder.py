"""The published encoder: what turns a raw row into the model's input, loaded without pickle.

``predictor.json`` (the fitted table featurizer, the input shape, a ``raw``/``pca``/``hog``
encoder's parameters) and ``encoder.npz`` (that encoder's arrays, read with
``allow_pickle=False``) are the run's public files. The run's predictor
(rknn_ray.predictor) and a holder off the cluster (holder/, which featurizes its own rows
with the files a round specification names) both load them here, so a holder never needs
the job layer, Ray or torch, and never runs code it was sent.
"""
from __future__ import annotations

import json
import os
import re
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rknn_ray.data.tables import Featurizer, Part, as_table, feature_matrix
from rknn_ray.errors import DataError
from rknn_ray.representation.represent import HOGEncoder, PCAEncoder, RawEncoder

PREDICTOR_FILE = "predictor.json"
ENCODER_ARRAYS = "encoder.npz"
FORMAT = 1

__all__ = ["ENCODER_ARRAYS", "FORMAT", "PREDICTOR_FILE", "PublishedEncoder",
           "encoder_from_state", "encoder_state", "read_predictor_spec"]


def read_predictor_spec(path: str) -> dict:
    """predictor.json as a dict (plain JSON; DataError unless it is a predictor file)."""
    try:
        with open(path, encoding="utf-8") as fh:
            spec = json.load(fh)
    except ValueError as exc:
        raise DataError(f"{path} is not valid JSON ({exc}). Fix: use the file the run "
                        "wrote, unchanged") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise DataError(f"{path}: not a predictor file of format {FORMAT}. Fix: use the "
                        "file the run wrote, unchanged")
    return spec


def _pca_state(pca, prefix: str) -> tuple[dict, dict]:
    d_in, d_out, a, b = pca.__getstate__()["matrix"]
    return ({"dim": int(pca.dim), "whiten": bool(pca.whiten), "d_in": int(d_in),
             "d_out": int(d_out)}, {f"{prefix}A": np.asarray(a), f"{prefix}b": np.asarray(b)})


def _pca_from(meta: dict, arrays, prefix: str):
    pca = PCAEncoder.__new__(PCAEncoder)
    pca.__setstate__({"_dim": int(meta["dim"]), "whiten": bool(meta["whiten"]),
                      "matrix": (int(meta["d_in"]), int(meta["d_out"]),
                                 np.asarray(arrays[f"{prefix}A"], np.float32),
                                 np.asarray(arrays[f"{prefix}b"], np.float32))})
    return pca


def encoder_state(encoder) -> tuple[dict, dict] | None:
    """(JSON parameters, numpy arrays) of a fitted ``raw``, ``pca`` or ``hog`` encoder; None
    for another kind (its pickle is the only copy)."""
    name = getattr(encoder, "name", None)
    if name == "raw":
        return {"name": "raw", "dim": int(encoder.dim)}, {}
    if name == "pca" and encoder.matrix is not None:
        meta, arrays = _pca_state(encoder, "")
        return {"name": "pca", **meta}, arrays
    if name == "hog":
        meta = {"name": "hog", "out_dim": int(encoder.out_dim),
                "orientations": int(encoder.orientations),
                "cell": None if encoder.cell is None else int(encoder.cell),
                "dim": int(encoder.dim), "pca": None}
        arrays = {}
        if encoder.pca is not None:
            meta["pca"], arrays = _pca_state(encoder.pca, "pca_")
        return meta, arrays
    return None


def encoder_from_state(meta: dict, path: str):
    """The encoder :func:`encoder_state` saved (``path``: its encoder.npz, read without pickle)."""
    try:
        arrays = dict(np.load(path, allow_pickle=False)) if os.path.exists(path) else {}
        if meta["name"] == "raw":
            enc = RawEncoder()
            enc._dim = int(meta["dim"])
            return enc
        if meta["name"] == "pca":
            return _pca_from(meta, arrays, "")
        if meta["name"] == "hog":
            enc = HOGEncoder(int(meta["out_dim"]), int(meta["orientations"]), meta["cell"])
            enc._dim = int(meta["dim"])
            enc.pca = _pca_from(meta["pca"], arrays, "pca_") if meta["pca"] else None
            return enc
    except (KeyError, TypeError, ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"the saved encoder is malformed ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''}). Fix: use the "
                        f"{PREDICTOR_FILE} and {ENCODER_ARRAYS} the run wrote") from None
    raise DataError(f"unknown saved encoder {meta.get('name')!r}. Fix: use the files the run wrote")


class PublishedEncoder:
    """Raw rows -> model inputs (the table featurizer, then the fitted public encoder)."""

    def __init__(self, spec: dict, encoder=None):
        self.spec, self.encoder = spec, encoder
        self.classes = tuple(spec["classes"])
        self.table = spec.get("table")
        self.featurizer = None
        if self.table:
            self.featurizer = Featurizer.from_dict(self.table["featurizer"])

    @classmethod
    def from_files(cls, predictor_json: str, encoder_npz: str | None = None) -> "PublishedEncoder":
        """From a predictor.json and its encoder.npz; refuses an encoder saved only as a pickle."""
        spec = read_predictor_spec(predictor_json)
        encoder = None
        if spec.get("student_input") == "features":
            if not spec.get("encoder"):
                raise DataError(f"{predictor_json}: the encoder was saved only as a pickle, "
                                "which can run code. Fix: publish a raw, pca or hog encoder "
                                f"({PREDICTOR_FILE} and {ENCODER_ARRAYS})")
            encoder = encoder_from_state(spec["encoder"], encoder_npz or "")
        return cls(spec, encoder)

    # ------------------------------------------------------------------ inputs
    def inputs(self, data) -> np.ndarray:
        """The model inputs (float32, (N, *input_shape)) of ``data`` (class docstring)."""
        shape = tuple(self.spec["input_shape"])
        if self.featurizer is None:          # a built-in data set: images as given
            if not isinstance(data, np.ndarray):
                raise DataError(f"this run's student takes images of shape {list(shape)} (a "
                                f"built-in data set, {self.spec.get('dataset')!r}), not a table's "
                                "columns. Fix: pass the images as a numpy array, or predict "
                                "with a run on your table (data.dataset: table)")
            x = np.ascontiguousarray(np.asarray(data, dtype=np.float32))
            if x.ndim < 1 or x.size != len(x) * int(np.prod(shape)):
                raise DataError(f"images of shape {x.shape[1:]} for a student that takes "
                                f"{list(shape)}. Fix: pass an array of shape (N, "
                                f"{', '.join(map(str, shape))}) or flattened")
            x = x.reshape(len(x), *shape)
        else:
            with np.errstate(over="ignore", invalid="ignore"):     # checked just below
                x = self.featurizer(self._raw(data))
            if not np.isfinite(x).all():
                # a finite value is clipped to the run's domain (predictor.json's bounds):
                # only NaN / inf, or a huge value for a run saved before bounds, end here
                raise DataError("the input holds a NaN or infinite value, or one too large for "
                                "the student's input (not finite once featurized). Fix: give "
                                "finite values of the public part's range")
        if self.encoder is not None:
            x = np.ascontiguousarray(self.encoder.transform(x), dtype=np.float32)
        return x

    def _raw(self, data) -> np.ndarray:
        f = self.featurizer
        cols = f.columns
        width = (int(np.prod(f.shape)) if f.shape is not None else len(f.mean)) \
            if cols.list_column else None
        if isinstance(data, np.ndarray):
            raw = data.reshape(len(data), -1) if data.ndim > 2 else data
            want = width if cols.list_column else len(cols.names)
            if raw.ndim != 2 or raw.shape[1] != want:
                raise DataError(f"an array of shape {data.shape}: the student takes {want} raw "
                                f"feature values per row ({', '.join(cols.names[:8])}"
                                f"{', ...' if len(cols.names) > 8 else ''}). Fix: pass a "
                                "DataFrame with those columns, or an array in that order")
            return raw if raw.dtype == object or not cols.categorical else raw.astype(object)
        try:
            table = as_table(data)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:      # pandas: mixed types
            found = re.search(r"for column (\S+) with type", str(exc))
            name = found.group(1) if found else "?"
            raise DataError(f"the input's column {name!r} holds text where the student takes "
                            f"numbers (a value of another type). Fix: give numbers in "
                            f"{name!r}, as the run's public part did") from None
        absent = [n for n in cols.names if n not in table.column_names]
        if absent:
            raise DataError(f"column {absent[0]!r} not found in the input: a feature the "
                            f"student takes ({len(absent)} of the {len(cols.names)} missing; it "
                            f"has {', '.join(repr(n) for n in table.column_names[:8])}"
                            f"{', ...' if table.num_columns > 8 else ''}). Fix: give the input "
                            f"the run's feature columns: {', '.join(cols.names[:12])}"
                            f"{', ...' if len(cols.names) > 12 else ''}")
        table = _numbers(table, cols)
        # named as what it is: no config key names a predict input or a holder's rows
        return feature_matrix(table, cols, Part("input", shown="the input"), width)


def _numbers(table: pa.Table, cols) -> pa.Table:
    """The numeric feature columns as float64: a column of text whose values are not all
    numbers is a DataError naming it (RunResult.predict raised a bare ValueError)."""
    for name in cols.names:
        if name in cols.categorical:
            continue
        col = table.column(name)
        t = col.type.value_type if pa.types.is_list(col.type) or \
            pa.types.is_fixed_size_list(col.type) else col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
            continue
        try:
            cast = pc.cast(col, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):      # text that is no number
            raise DataError(f"the input's column {name!r} holds text where the student takes "
                            f"numbers ({_not_numbers(col)} value(s) are not numbers). Fix: give "
                            f"numbers in {name!r}, as the run's public part did") from None
        table = table.set_column(table.column_names.index(name), name, cast)
    return table


def _not_numbers(col) -> int:
    """How many of a text column's values do not parse as numbers."""
    def number(text: str) -> bool:
        try:
            float(text)
            return True
        except ValueError:
            return False
    return sum(1 for v in col.to_pylist() if v is not None and not number(str(v)))

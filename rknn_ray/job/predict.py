"""The student applied to new rows: ``predictor.json`` (written beside student.pt) and
:class:`Predictor`, behind ``RunResult.predict`` and ``rknn-ray predict``.

``predictor.json`` holds only public facts, as plain JSON: the class names in label order,
the student's input shape, and for a user's table the featurizer fitted on the public rows
(the feature columns in order, each numeric column's mean and std, each text column's
categories, an image's shape and pixel scale, each numeric column's clipping bounds, the
values' domain (data.clip: a row is clipped as the job's scan and shards clipped it):
rknn_ray.data.tables.Featurizer.to_dict) with the id and label column names. Loading it runs no code (no pickle); the student's weights
load with ``torch.load(weights_only=True)``. A student trained on the encoder's features
(``student.input: features``) also needs the fitted public encoder: for ``raw``, ``pca`` and
``hog`` its parameters are saved the same safe way (predictor.json's ``encoder``, its arrays
in ``encoder.npz``, read with ``allow_pickle=False``); any other encoder only as the pickle
the run writes (``encoder.pkl``), which can run code when loaded, so :class:`Predictor` loads
that one only when asked (``allow_pickle=True``, ``rknn-ray predict --allow-pickle``), for a
run folder one trusts.
"""
from __future__ import annotations

import json
import os
import pickle
import re
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rknn_ray.data.tables import Featurizer, Part, as_table, feature_matrix
from rknn_ray.errors import DataError
from rknn_ray.job.predictor_check import check_digests, check_model, check_spec, file_digests
from rknn_ray.representation.represent import HOGEncoder, PCAEncoder, RawEncoder
from rknn_ray.runio import atomic_path, write_json

PREDICTOR_FILE = "predictor.json"
ENCODER_FILE = "encoder.pkl"
ENCODER_ARRAYS = "encoder.npz"
FORMAT = 1

__all__ = ["PREDICTOR_FILE", "Predictor", "encoder_from_state", "encoder_state",
           "predictor_spec", "write_predictor"]


def predictor_spec(cfg, data, student_input: dict | None, encoder_meta: dict | None = None) -> dict:
    """What predictor.json holds for this job (module docstring): public facts only."""
    sp = data.splits
    names = getattr(sp, "class_names", None) or tuple(range(int(data.num_classes)))
    features = bool(student_input and student_input.get("input") == "features")
    return {"format": FORMAT, "dataset": cfg.data.dataset,
            "classes": [str(c) for c in names],
            "input_shape": [int(s) for s in data.image_shape],
            "student_input": "features" if features else "images",
            "encoder": encoder_meta if features else None,
            "encoder_file": ENCODER_FILE if features else None,
            "table": getattr(sp, "table_input", None),
            "method": cfg.student.method}


def write_predictor(out_dir: str, cfg, data, student_input: dict | None, encoder=None) -> str:
    """predictor.json (and, for a student on features, encoder.npz: the public encoder's
    fitted arrays) into the run folder, atomically; returns its path."""
    meta = None
    if student_input and student_input.get("input") == "features" and encoder is not None:
        state = encoder_state(encoder)
        if state is not None:
            meta, arrays = state
            with atomic_path(os.path.join(out_dir, ENCODER_ARRAYS)) as tmp:
                with open(tmp, "wb") as fh:
                    np.savez(fh, **arrays)
    path = os.path.join(out_dir, PREDICTOR_FILE)
    # the student's and the encoder's digests: a folder mixed or cut short is refused
    write_json(path, {**predictor_spec(cfg, data, student_input, meta),
                      "files": file_digests(out_dir)})
    return path


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


class Predictor:
    """A run's student with what turns a raw row into its input. ``predict(data)``: a pandas
    DataFrame with the id column (when the data has the table's), ``class`` and
    ``probability``; ``predict_proba(data)``: the (N, classes) probabilities.

    ``data``: for a table run, a pandas DataFrame, an Arrow table or a dict of column ->
    numpy array with the public part's feature columns (others, e.g. the label, are left
    out), or a numpy array of raw feature values in the saved column order; for a built-in
    data set, images as the reader gives them (float32, scaled to [0, 1]), (N, *shape) or
    flattened."""

    def __init__(self, spec: dict, model, encoder=None):
        self.spec, self.model, self.encoder = spec, model, encoder
        self.classes = tuple(spec["classes"])
        self.table = spec.get("table")
        self.featurizer = None
        if self.table:
            self.featurizer = Featurizer.from_dict(self.table["featurizer"])

    @classmethod
    def from_run(cls, run_dir: str, allow_pickle: bool = False) -> "Predictor":
        """The predictor of the finished run in ``run_dir`` (its predictor.json and student.pt)."""
        path = os.path.join(run_dir, PREDICTOR_FILE)
        if not os.path.isdir(run_dir):
            raise DataError(f"{run_dir} is not a folder. Fix: point at a finished run folder")
        if not os.path.isfile(path) and not os.path.isfile(os.path.join(run_dir, "release.npz")):
            raise DataError(f"{run_dir} has no {PREDICTOR_FILE} and no release.npz: the run "
                            "released nothing, so there is no student to resume. Fix: run the "
                            "job again (rknn-ray run), then predict with its run folder")
        if not os.path.isfile(path):
            raise DataError(f"{run_dir} has no {PREDICTOR_FILE}: the run did not finish, or it "
                            "was made before students were saved with their featurizer. Fix: "
                            f"rknn-ray run --resume {run_dir} after deleting report.json "
                            "retrains the student from the saved release (no budget spent), or "
                            "run the job again")
        try:
            with open(path, encoding="utf-8") as fh:
                spec = json.load(fh)
        except ValueError as exc:
            raise DataError(f"{path} is not valid JSON ({exc}). Fix: use the file the run "
                            "wrote, unchanged") from None
        if not isinstance(spec, dict) or spec.get("format") != FORMAT:
            raise DataError(f"{path}: not a predictor file of format {FORMAT}. Fix: use the "
                            "file the run wrote, unchanged")
        check_spec(path, spec)
        check_digests(run_dir, spec)
        encoder = None
        if spec.get("student_input") == "features" and spec.get("encoder"):     # no pickle
            encoder = encoder_from_state(spec["encoder"], os.path.join(run_dir, ENCODER_ARRAYS))
        elif spec.get("student_input") == "features":
            enc_path = os.path.join(run_dir, spec.get("encoder_file") or ENCODER_FILE)
            if not allow_pickle:
                raise DataError(f"the student takes encoder features; its encoder is only a pickle "
                                f"({os.path.basename(enc_path)}), which can run code. Fix: "
                                "--allow-pickle (allow_pickle=True) for a folder you trust")
            with open(enc_path, "rb") as fh:
                encoder = pickle.load(fh)   # noqa: S301 - the caller trusts the folder
        predictor = cls(spec, _load_model(run_dir, spec), encoder)
        check_model(path, spec, predictor.model, encoder, predictor.featurizer)
        return predictor

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
        return feature_matrix(table, cols, Part("input"), width)

    # ------------------------------------------------------------------ outputs
    def predict_proba(self, data, batch_size: int = 1024) -> np.ndarray:
        """Each row's class probabilities (softmax of the student's logits), (N, classes)."""
        import torch  # defers torch
        x = torch.as_tensor(self.inputs(data))
        out = []
        with torch.no_grad():
            for i in range(0, len(x), batch_size):
                out.append(torch.softmax(self.model(x[i:i + batch_size]).float(), 1))
        return torch.cat(out).numpy() if out else np.zeros((0, len(self.classes)), np.float32)

    def predict(self, data, batch_size: int = 1024, id_column: str | None = None):
        """A pandas DataFrame: the id column (``id_column``, else the table's public id
        column, when ``data`` has it), ``class`` (the class name) and ``probability``."""
        import pandas as pd  # defers pandas (only predictions need it)
        proba = self.predict_proba(data, batch_size)
        best = proba.argmax(1) if len(proba) else np.zeros(0, np.int64)
        frame = pd.DataFrame({"class": np.asarray(self.classes, dtype=object)[best],
                              "probability": proba[np.arange(len(proba)), best]})
        key = id_column or (self.table or {}).get("id")
        ids = _column(data, key) if key else None
        if ids is not None:
            frame.insert(0, key, ids)
        elif id_column:
            raise DataError(f"the input has no column {id_column!r}. Fix: name its id column")
        return frame


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
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            try:
                values = pc.cast(col, pa.string()).to_pylist()
                bad = sum(1 for v in values if v is not None and not _is_number(v))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                bad = "some"
            raise DataError(f"the input's column {name!r} holds text where the student takes "
                            f"numbers ({bad} value(s) are not numbers). Fix: give numbers in "
                            f"{name!r}, as the run's public part did") from None
        table = table.set_column(table.column_names.index(name), name, cast)
    return table


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _column(data, name: str):
    """Column ``name`` of ``data`` as a numpy array, or None when it has none."""
    if isinstance(data, np.ndarray):
        return None
    if hasattr(data, "columns") and hasattr(data, "to_dict"):              # pandas
        return data[name].to_numpy() if name in data.columns else None
    if isinstance(data, dict):
        return np.asarray(data[name]) if name in data else None
    names = getattr(data, "column_names", None)                           # Arrow
    return data.column(name).to_numpy(zero_copy_only=False) if names and name in names else None


def _load_model(run_dir: str, spec: dict):
    import torch  # defers torch
    path = os.path.join(run_dir, "student.pt")
    if not os.path.isfile(path):
        raise DataError(f"{run_dir} holds no student.pt. Fix: point at a finished run folder")
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if "encoder_dim" in payload:                 # the semi student's checkpoint
        from rknn_ray.student.semi import load_semi_student  # torch
        return load_semi_student(path)
    from rknn_ray.student import load_student  # torch
    return load_student(path)

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

import os
import pickle

import numpy as np

from rknn_ray.errors import DataError
from rknn_ray.predictor_check import check_digests, check_model, check_spec, file_digests
from rknn_ray.published_encoder import (ENCODER_ARRAYS, FORMAT, PREDICTOR_FILE, PublishedEncoder,
                                        encoder_from_state, encoder_state, read_predictor_spec)
from rknn_ray.runio import atomic_path, write_json

ENCODER_FILE = "encoder.pkl"

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


class Predictor(PublishedEncoder):
    """A run's student with what turns a raw row into its input. ``predict(data)``: a pandas
    DataFrame with the id column (when the data has the table's), ``class`` and
    ``probability``; ``predict_proba(data)``: the (N, classes) probabilities.

    ``data``: for a table run, a pandas DataFrame, an Arrow table or a dict of column ->
    numpy array with the public part's feature columns (others, e.g. the label, are left
    out), or a numpy array of raw feature values in the saved column order; for a built-in
    data set, images as the reader gives them (float32, scaled to [0, 1]), (N, *shape) or
    flattened."""

    def __init__(self, spec: dict, model, encoder=None):
        super().__init__(spec, encoder)
        self.model = model

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
        spec = read_predictor_spec(path)
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

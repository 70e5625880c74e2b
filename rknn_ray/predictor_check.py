"""A run folder's predictor checked before use: its files' digests, its shapes, its class count.

``rknn-ray predict`` and ``RunResult.predict`` read predictor.json, encoder.npz and student.pt
from a folder that may have been copied, cut short or mixed with another run's files. Each
way those go wrong used to surface as a traceback (a BadZipFile, a faiss or torch shape
error) or, worse, as predictions that looked fine (3 class names on a 2-class student). Here
each is one DataError naming the file and the fix, raised before any input is read:

* predictor.json's ``files``: the SHA-256 of student.pt and encoder.npz as the run wrote them
  (runs from before the digests were recorded skip this check);
* its fields and their types: the class list, the input shape, the featurizer's arrays (one
  mean and std per numeric column, one category list per text column);
* the student's shapes: a dry row of the saved input shape runs through the encoder (when the
  student takes its features) and the student, which must answer one logit per class.
"""
from __future__ import annotations

import hashlib
import os

import numpy as np

from rknn_ray.errors import DataError

#: the files predictor.json's ``files`` digests (student.pt always; encoder.npz when saved)
DIGESTED = ("student.pt", "encoder.npz")


def file_digests(run_dir: str) -> dict:
    """``{name: sha256 hex}`` of the run's DIGESTED files that exist (predictor.json's files)."""
    return {name: sha256_of(os.path.join(run_dir, name)) for name in DIGESTED
            if os.path.isfile(os.path.join(run_dir, name))}


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def check_digests(run_dir: str, spec: dict) -> None:
    """The files predictor.json names are the ones the run wrote (byte for byte)."""
    for name, want in (spec.get("files") or {}).items():
        path = os.path.join(run_dir, name)
        if not os.path.isfile(path):
            raise DataError(f"{path} is missing: predictor.json names it. Fix: use the run "
                            "folder as the run wrote it (copy every file)")
        if sha256_of(path) != want:
            raise DataError(f"{path} is not the file the run wrote (its SHA-256 differs from "
                            "predictor.json's): changed, cut short or from another run. Fix: "
                            "use the run folder as the run wrote it")


def check_spec(path: str, spec: dict) -> None:
    """predictor.json's fields have the types and sizes a predictor needs."""
    def bad(what: str) -> DataError:
        return DataError(f"{path}: {what}. Fix: use the predictor.json the run wrote, unchanged")

    classes, shape = spec.get("classes"), spec.get("input_shape")
    if not isinstance(classes, list) or len(classes) < 2 or \
            not all(isinstance(c, str) for c in classes):
        raise bad("'classes' is not a list of at least two class names")
    if not isinstance(shape, list) or not shape or \
            not all(isinstance(s, int) and s > 0 for s in shape):
        raise bad("'input_shape' is not a list of positive integers")
    if spec.get("dataset") == "table" and not isinstance(spec.get("table"), dict):
        raise bad("a table run's predictor has no 'table' section (its featurizer)")
    table = spec.get("table")
    if table is None:
        return
    feat = table.get("featurizer") if isinstance(table, dict) else None
    if not isinstance(feat, dict):
        raise bad("'table' holds no featurizer")
    cols = feat.get("columns") or {}
    names = cols.get("names") if isinstance(cols, dict) else None
    if not isinstance(names, list) or not names:
        raise bad("the featurizer names no feature column")
    categorical = cols.get("categorical") or []
    numeric = len(names) - len(categorical) if not cols.get("list_column") else None
    for key in ("mean", "std"):
        values = feat.get(key)
        if values is not None and not isinstance(values, list):
            raise bad(f"the featurizer's {key!r} is not a list")
        if values is not None and numeric is not None and len(values) != numeric:
            raise bad(f"the featurizer's {key!r} has {len(values)} values for {numeric} "
                      "numeric columns")


def check_model(path: str, spec: dict, model, encoder, featurizer) -> None:
    """A dry row through the featurizer's output, the encoder and the student: the shapes
    agree and the student answers one logit per class."""
    import torch  # defers torch
    shape = tuple(spec["input_shape"])
    try:
        if featurizer is not None:
            x = np.zeros((1, *featurizer.output_shape), np.float32)
            if encoder is not None:
                x = np.asarray(encoder.transform(x), np.float32)
            if x.shape[1:] != shape:
                raise ValueError(f"the featurizer and encoder give rows of shape "
                                 f"{list(x.shape[1:])}, predictor.json's input_shape is "
                                 f"{list(shape)}")
        with torch.no_grad():
            out = model(torch.zeros((1, *shape), dtype=torch.float32))
    except Exception as exc:  # noqa: BLE001 - any mismatch is the folder's, in one line
        raise DataError(f"{path} does not fit the run's student.pt ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:160] if str(exc) else ''}). Fix: use the "
                        "run folder as the run wrote it") from None
    if tuple(out.shape) != (1, len(spec["classes"])):
        raise DataError(f"{path} names {len(spec['classes'])} classes, the run's student.pt "
                        f"answers {out.shape[-1]}. Fix: use the run folder as the run wrote it")

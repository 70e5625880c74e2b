"""The student stage read from a run config: its training set from the labels (public images
or the public encoder's features; propagated labels or the queries only), and the configured
student trained on it (Ray Train, in this process, or the semi-supervised loop). Imports
no torch until a student is trained."""
from __future__ import annotations

import dataclasses
import os
import pickle
from dataclasses import dataclass

import numpy as np

from rknn_ray.student.config import SemiConfig, StudentConfig


def _semi_init(cfg, encoder):
    """The encoder whose backbone starts the semi student (``student.init: encoder`` and a
    contrastive encoder), else None (from scratch)."""
    simclr = getattr(encoder, "name", "") == "simclr"
    return encoder if (cfg.student.init == "encoder" and simclr) else None


def train_semi(cfg, data: "PreparedData", encoder, lab: "Labeling", info: dict, out_dir: str | None,
               progress=None):
    """The semi-supervised student (rknn_ray.student.semi) on every public sample, with the
    released (smoothed) labels weighted by their confidence (``info["confidence"]`` from
    :func:`rknn_ray.job.stages.finish_labels`, read only); initialized from the contrastive
    encoder's backbone when there is one and ``student.init: encoder``."""
    from rknn_ray.student.semi import train_semi_student      # torch
    st = cfg.student
    sp = data.splits
    init = _semi_init(cfg, encoder)
    scfg = SemiConfig.from_config(cfg)
    targets = lab.public_targets if st.target == "soft" else lab.public_hard
    say = progress.say if progress is not None else None
    result = train_semi_student(
        sp.public_x, targets, info.get("confidence"), sp.eval_x, sp.eval_y, data.num_classes,
        scfg, encoder=init, checkpoint_dir=out_dir,
        progress=(lambda row: say("  epoch " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float)
                                                         else f"{k} {v}" for k, v in row.items())))
        if say else None)
    return result


def student_description(cfg, data: "PreparedData", encoder, inputs: "StudentInputs") -> dict | None:
    """report.json's ``utility.student``: how the configured student learns (the semi
    student, or an MLP on the encoder's features), None for the plain student on images."""
    st = cfg.student
    if st.method == "semi":
        return {"method": "semi", "target": st.target, "threshold": st.threshold,
                "init": "encoder" if _semi_init(cfg, encoder) is not None else "scratch",
                "train_samples": int(len(data.splits.public_x))}
    return inputs.described


def feature_inputs(encoder: "Encoder", splits, public_emb: np.ndarray, out_dir: str | None):
    """The student's inputs when it learns on the encoder's features (``student.input:
    features``): public and evaluation images mapped by the public encoder. Returns a
    view of ``splits`` whose public_x are the features, the evaluation features and the
    feature shape; the fitted encoder is pickled to ``out_dir/encoder.pkl`` so the
    student (encoder -> MLP) can be used on new images."""
    eval_emb = encoder.transform(splits.eval_x)
    if out_dir:
        with open(os.path.join(out_dir, "encoder.pkl"), "wb") as fh:
            pickle.dump(encoder, fh)
    view = dataclasses.replace(splits, public_x=np.ascontiguousarray(public_emb, dtype=np.float32))
    return view, eval_emb, (int(public_emb.shape[1]),)


@dataclass
class StudentInputs:
    """What the student trains and is evaluated on, as ``cfg.student`` / ``cfg.labels`` say."""
    train_x: np.ndarray
    targets: np.ndarray
    weight: np.ndarray | None
    eval_x: np.ndarray
    eval_y: np.ndarray
    image_shape: tuple
    config: object                  # rknn_ray.student.StudentConfig
    described: dict | None = None   # the input, when it is not the public images


def student_inputs(cfg, data: "PreparedData", encoder, lab: "Labeling", qs: "QuerySet",
                   public_emb: np.ndarray, info: dict | None, out_dir: str | None,
                   config=None) -> StudentInputs:
    """The student's training set from a Labeling: public images (or the public encoder's
    features, ``student.input: features``), labelled by propagation (``labels.train_on:
    public``) or only the queries (``queries``). Used by jobs.distill on released labels,
    by rknn_ray.job.reference on the non-private ones and by the baselines, so all train the
    same student. ``config``: a StudentConfig in place of the config's (the baselines')."""
    scfg = StudentConfig.from_config(cfg) if config is None else config
    sp, eval_x, image_shape = data.splits, data.splits.eval_x, data.image_shape
    described = None
    if cfg.student.input == "features":     # encoder -> MLP; the encoder is public (issue 11)
        sp, eval_x, image_shape = feature_inputs(encoder, sp, public_emb, out_dir)
        described = {"input": "features", "encoder": cfg.represent.encoder,
                     "dim": int(image_shape[0])}
    if cfg.labels.train_on == "queries":
        soft = scfg.label_type == "soft"
        return StudentInputs(sp.public_x[qs.public_index],
                             lab.query_soft if soft else lab.query_labels,
                             lab.query_weight if soft else None, eval_x, sp.eval_y,
                             image_shape, scfg, described)
    return StudentInputs(sp.public_x, lab.public_targets, lab.public_weight, eval_x, sp.eval_y,
                         image_shape, scfg, described)


def fit_student(cfg, data: "PreparedData", encoder, lab: "Labeling", info: dict, inputs: StudentInputs,
                out_dir: str | None, progress=None, on_epoch=None):
    """Train the configured student: Ray Train (``student.trainer: ray``) or the same loop in
    this process (``local``; ``auto``: by size, StudentSection.chosen_trainer); ``student.method: semi`` -> train_semi."""
    from rknn_ray.student import train_student, train_student_local     # torch
    if cfg.student.method == "semi":
        return train_semi(cfg, data, encoder, lab, info, out_dir, progress)
    trainer, _ = cfg.student.chosen_trainer(len(inputs.train_x), inputs.image_shape)  # auto
    fit = train_student if trainer == "ray" else train_student_local
    return fit(inputs.train_x, inputs.targets, inputs.eval_x, inputs.eval_y,
               inputs.image_shape, data.num_classes, inputs.config,
               storage_path=out_dir, checkpoint_dir=out_dir,
               sample_weight=inputs.weight, progress=on_epoch)


def train_on_labels(cfg, data: "PreparedData", encoder, lab: "Labeling", info: dict | None,
                    qs: "QuerySet", public_emb: np.ndarray, out_dir: str | None = None,
                    progress=None, on_epoch=None, student=None) -> tuple[StudentInputs, object]:
    """student inputs -> student, the sequence every labelling ends with; returns (the
    inputs, the training result). ``student``: a StudentConfig for the plain student trained
    in this process (the baselines: their epochs and seed, one CPU worker), else the
    configured one (:func:`fit_student`: Ray Train, in this process, or the semi student)."""
    inputs = student_inputs(cfg, data, encoder, lab, qs, public_emb, info, out_dir, student)
    if student is None:
        return inputs, fit_student(cfg, data, encoder, lab, info, inputs, out_dir, progress,
                                   on_epoch)
    from rknn_ray.student import train_student_local        # torch
    return inputs, train_student_local(inputs.train_x, inputs.targets, inputs.eval_x,
                                       inputs.eval_y, inputs.image_shape, data.num_classes,
                                       inputs.config, sample_weight=inputs.weight)

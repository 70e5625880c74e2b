"""DP-DFD's selective randomized response (paper 004) as a labeling mechanism.

A teacher is trained on all private records (trusted holder: central model). The
public queries (standing in for the paper's generator output; the data-free
generator is not needed here) are labelled in ``stages``: at each stage the current
student (a small classifier trained on the labels released so far; uniform before
the first) gives a prior ``y_s`` for each query, the candidate set is
``I = {i : y_s[i] > 1/(2|Y|)}``, replaced by the student's top two classes when
``|I| < 2``, and the label is drawn by randomized response within ``I``:

* teacher's argmax in I: keep it w.p. ``e^eps / (e^eps + |I| - 1)``, else one of the
  other ``|I| - 1`` candidates uniformly;
* otherwise: a uniformly random candidate (prob ``1/|I|`` each).

Guarantee: eps-LABEL-DP per query: neighbouring inputs differ in the teacher's
label of ONE query (``change-one-query-label``); the candidate set depends only on
public data and earlier outputs. Each query's label is released once, so queries
compose in parallel: the release is eps-label-DP. This is NOT record-level DP: one
private record can change the teacher and with it every query's label; the table's
unit column says ``label``.
"""
from __future__ import annotations

import math
import time

import numpy as np

from rknn_ray.baselines.common import (privacy_generator, NEIGHBOUR_LABEL, BaselineRow, BaselineSetup,
                                       baseline_row, fit_classifiers, new_ledger, one_hot, record,
                                       student_from_query_counts)
from rknn_ray.baselines.common import DEFAULT_COSTING
from rknn_ray.baselines.events import selective_rr_event
from rknn_ray.baselines.private_knn import raw_upload_bytes


def candidate_set(prior: np.ndarray, threshold: float | None = None) -> np.ndarray:
    """Boolean (C,) mask: classes with prior > threshold (default 1/(2|Y|)), else the top two."""
    prior = np.asarray(prior, dtype=np.float64)
    c = prior.shape[-1]
    t = 1.0 / (2 * c) if threshold is None else threshold
    mask = prior > t
    if mask.sum() < 2:
        top2 = np.argsort(-prior, kind="stable")[:2]
        mask = np.zeros(c, bool)
        mask[top2] = True
    return mask


def selective_rr_distribution(teacher_label: int, mask: np.ndarray, eps: float) -> np.ndarray:
    """Output distribution over classes of Algorithm 1's function R."""
    k = int(mask.sum())
    p = np.zeros(mask.shape[0], np.float64)
    if mask[teacher_label]:
        p[mask] = 1.0 / (math.exp(eps) + k - 1)
        p[teacher_label] = math.exp(eps) / (math.exp(eps) + k - 1)
    else:
        p[mask] = 1.0 / k
    return p


def selective_rr(teacher_labels: np.ndarray, priors: np.ndarray, eps: float,
                 rng: np.random.Generator, threshold: float | None = None):
    """Randomize each query's teacher label; returns (labels, candidate-set sizes)."""
    out = np.empty(len(teacher_labels), np.int64)
    sizes = np.empty(len(teacher_labels), np.int64)
    for i, (t, pr) in enumerate(zip(teacher_labels, priors)):
        mask = candidate_set(pr, threshold)
        p = selective_rr_distribution(int(t), mask, eps)
        out[i] = rng.choice(len(p), p=p)
        sizes[i] = int(mask.sum())
    return out, sizes


def run_dpdfd(setup: BaselineSetup, target_eps: float, stages: int = 2, seed: int | None = None,
              hidden: int = 0, prior_weight_decay: float = 0.05, ledger=None) -> BaselineRow:
    """Label the run's queries in ``stages`` with selective RR at ``target_eps`` (label DP)."""
    t0 = time.perf_counter()
    seed = setup.cfg.run.seed if seed is None else seed
    C = setup.num_classes
    sp = setup.splits
    teacher = fit_classifiers([setup.private_emb], [sp.private_y], C, hidden=hidden, steps=300,
                              seed=seed)
    qx = setup.query_emb
    teacher_labels = teacher.predict_proba(qx)[0].argmax(-1)
    rng = privacy_generator(setup, 31, seed)
    order = rng.permutation(len(qx))
    chunks = np.array_split(order, max(1, min(stages, len(qx))))
    labels = np.empty(len(qx), np.int64)
    sizes = np.empty(len(qx), np.int64)
    done: list[int] = []
    for chunk in chunks:
        if done:
            student = fit_classifiers([qx[done]], [labels[done]], C, steps=150,
                                      weight_decay=prior_weight_decay, seed=seed)
            priors = student.predict_proba(qx[chunk])[0]
        else:
            priors = np.full((len(chunk), C), 1.0 / C)
        labels[chunk], sizes[chunk] = selective_rr(teacher_labels[chunk], priors, target_eps, rng)
        done.extend(chunk.tolist())
    ledger = ledger or new_ledger()
    record(ledger, selective_rr_event(target_eps, len(qx), int(sizes.min()), int(sizes.max())),
           DEFAULT_COSTING, "central", "selective_rr", "label", NEIGHBOUR_LABEL,
           f"label DP per query (parallel over {len(qx)} queries); not record-level",
           stages=len(chunks))
    acc, lab_acc, _ = student_from_query_counts(setup, one_hot(labels, C))
    return baseline_row(
        setup, ledger, "dpdfd_selective_rr", target_eps, t0, unit="label",
        neighbour=NEIGHBOUR_LABEL, accuracy=acc, label_accuracy=lab_acc, rounds=len(chunks),
        bytes_per_client=raw_upload_bytes(setup),
        details={"stages": len(chunks), "mean_candidates": float(sizes.mean())},
        diagnostics={"teacher_query_accuracy":      # NOT PRIVATE: the teachers' exact labels
                     float(np.mean(teacher_labels == setup.query_truth))})

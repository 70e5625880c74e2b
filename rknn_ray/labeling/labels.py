"""Labels from (noisy) counts, propagation to the public set, label accuracy.

Hard labels: argmax of each query's noisy count vector (paper 000, Algorithm 1).
Soft labels: counts clipped at 0 and normalized; a query whose clipped counts are
all zero carries no information and gets weight 0 (it is left out of training
rather than given a made-up label).
"""
from __future__ import annotations

import numpy as np


def hard_labels(counts: np.ndarray) -> np.ndarray:
    """(s,) int64 argmax labels (ties: the lowest class index)."""
    return np.argmax(counts, axis=1).astype(np.int64)


def soft_labels(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((s, |Y|) float32 distributions, (s,) float32 weights: 0 where no signal)."""
    clipped = np.clip(counts, 0, None).astype(np.float64)
    total = clipped.sum(axis=1, keepdims=True)
    weights = (total[:, 0] > 0).astype(np.float32)
    uniform = np.full_like(clipped, 1.0 / counts.shape[1])
    dist = np.where(total > 0, clipped / np.where(total > 0, total, 1), uniform)
    return dist.astype(np.float32), weights


def propagate(per_query: np.ndarray, assignment: np.ndarray) -> np.ndarray:
    """Give every public sample the label (or distribution) of its query's cluster."""
    return per_query[assignment]


def accuracy(predicted: np.ndarray, truth: np.ndarray) -> float:
    """Fraction of equal entries (Acc_pl when applied to propagated public labels) among the
    rows with a truth: a negative truth marks an unlabelled row (a user's public table has
    no labels), and with none labelled the accuracy is NaN (not measured), never a 0."""
    predicted, truth = np.asarray(predicted), np.asarray(truth)
    known = truth >= 0
    if predicted.shape[0] == 0 or not known.any():
        return float("nan")
    return float(np.mean(predicted[known] == truth[known]))

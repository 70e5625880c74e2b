"""The labelling stages read from a run config: the exact answers and counts (the non-private
reference only), labels derived from released counts (propagated, or smoothed over the public
graph), the rounds plan (new queries and the (eps, delta) share per round), and a round's
connection plan (public data only)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.labeling.connection import plan_connection
from rknn_ray.labeling.denoise import public_knn_graph, smooth_counts
from rknn_ray.labeling.labels import accuracy, hard_labels, propagate, soft_labels
from rknn_ray.labeling.queries import QuerySet
from rknn_ray.labeling.rknn import build_answers


def exact_answers(encoder: "Encoder", data: "PreparedData", qs: QuerySet, k: int,
                  connection=None) -> RecordAnswers:
    """All held records' answers in one place: only for the non-private reference.
    ``connection``: the round's plan (:mod:`rknn_ray.labeling.connection`), None: reverse k-NN."""
    data.require_private_rows("the non-private reference (exact counts)")
    rows = data.held_rows()
    rows = rows[np.argsort(data.client_ids[rows], kind="stable")]
    emb = encoder.transform(data.splits.private_x[rows])
    return build_answers(emb, data.splits.private_y[rows], data.client_ids[rows],
                         qs.features, k, data.num_classes, connection)


def exact_counts(encoder: "Encoder", data: "PreparedData", query_sets: list[QuerySet],
                 k: int, connection=None) -> np.ndarray:
    """NOT private: the exact (s, |Y|) counts of every round's queries, stacked in round order.
    ``connection``: None (reverse k-NN), one Connection (one query set), or one per set."""
    plans = (connection if isinstance(connection, (list, tuple))
             else [connection] * len(query_sets))
    if len(plans) != len(query_sets):
        raise ValueError(f"{len(plans)} connection plans for {len(query_sets)} query sets")
    return np.concatenate([exact_answers(encoder, data, q, k, c).counts()
                           for q, c in zip(query_sets, plans)])


@dataclass
class Labeling:
    query_labels: np.ndarray        # (s,) hard labels
    query_soft: np.ndarray          # (s, |Y|) soft labels
    query_weight: np.ndarray        # (s,) 0 where the query got no signal
    public_targets: np.ndarray      # (N_pub,) hard or (N_pub, |Y|) soft training targets
    public_weight: np.ndarray       # (N_pub,)
    public_hard: np.ndarray         # (N_pub,) propagated hard labels
    label_accuracy: float           # Acc_pl on the public set
    query_accuracy: float           # accuracy of the s query labels vs. their public truth


def derive_labels(counts: np.ndarray, qs: QuerySet, public_truth: np.ndarray,
                  label_type: str) -> Labeling:
    """Hard/soft labels per query, propagated to every public sample of its cluster."""
    hard = hard_labels(counts)
    soft, weight = soft_labels(counts)
    public_hard = propagate(hard, qs.assignment)
    targets = propagate(soft, qs.assignment) if label_type == "soft" else public_hard
    pub_weight = propagate(weight, qs.assignment) if label_type == "soft" \
        else np.ones(public_hard.shape[0], dtype=np.float32)
    return Labeling(hard, soft, weight, targets, pub_weight, public_hard,
                    accuracy(public_hard, public_truth),
                    accuracy(hard, public_truth[qs.public_index]))


def round_query_counts(cfg) -> list[int]:
    """New queries per round: ``queries.s`` every round, or with ``rounds.split_queries`` the
    s queries divided over the rounds (s // T each, the remainder to the first rounds), so
    T = 1, 2, 3 can be compared at equal total eps *and* equal total queries."""
    s, count = int(cfg.queries.s), int(cfg.rounds.count)
    if not cfg.rounds.split_queries:
        return [s] * count
    return [s // count + (1 if t < s % count else 0) for t in range(count)]


def round_budgets(eps: float, delta: float, count: int, split) -> list[tuple[float, float]]:
    """(eps_t, delta_t) per round: ``split`` 'even' or fractions (sum <= 1) of the job's eps and delta.

    With basic composition the rounds then add up to at most (eps, delta); the ledger
    checks it again before every round.
    """
    fractions = [1.0 / count] * count if split == "even" else [float(f) for f in split]
    if len(fractions) != count or min(fractions) <= 0 or sum(fractions) > 1 + 1e-12:
        raise ValueError(f"rounds.budget_split {split!r} must be 'even' or {count} positive "
                         "fractions summing to at most 1")
    return [(eps * f, delta * f) for f in fractions]


def smoothed_labels(counts: np.ndarray, qs: QuerySet, public_emb: np.ndarray, public_truth,
                    label_type: str, neighbours: int, noise_std: float) -> tuple[Labeling, np.ndarray]:
    """Labels from released counts smoothed over the public k-NN graph (rknn_ray.labeling.denoise).

    Post-processing of the release: reads only the noisy ``counts``, the query assignment
    and public embeddings (public truth is used for the accuracy figures only). Returns
    the Labeling (public targets from the smoothed vectors) and the (N, |Y|) smoothed counts.
    """
    lab = derive_labels(counts, qs, public_truth, label_type)
    graph = public_knn_graph(public_emb, neighbours)
    sm = smooth_counts(counts, qs.assignment, graph)
    hard = hard_labels(sm)
    soft, weight = soft_labels(sm)
    targets = soft if label_type == "soft" else hard
    pub_weight = weight if label_type == "soft" else np.ones(len(hard), np.float32)
    return Labeling(lab.query_labels, lab.query_soft, lab.query_weight, targets, pub_weight, hard,
                    accuracy(hard, public_truth), lab.query_accuracy), sm


def connection_plan(cfg, public_emb: np.ndarray, query_features: np.ndarray,
                    rule: str | None = None, sample_weight: np.ndarray | None = None):
    """The round's :class:`~rknn_ray.labeling.connection.Connection` for ``rule`` (default
    ``rknn.connection``; ``auto`` must be resolved first), from public data only (and, with
    ``sample_weight``, released counts: :func:`rknn_ray.job.stages.released_weights`): the server ships it with
    the queries to every client, in every trust model."""
    rule = cfg.rknn.connection if rule is None else rule
    return plan_connection(rule, public_emb, query_features, int(cfg.rknn.k),
                           sample_weight=sample_weight)

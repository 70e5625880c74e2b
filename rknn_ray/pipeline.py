"""The pure stages of one distillation round, wired from a validated config.

No Ray here: ``jobs/distill.py`` runs these stages around the actors
(ClientShard, Shuffler, Server) and Ray Train. Each stage is a plain function so
tests and notebooks can run the method without a cluster.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rknn_ray.answers import RecordAnswers
from rknn_ray.data import load_dataset, make_splits, partition, validate_features
from rknn_ray.labels import accuracy, hard_labels, propagate, soft_labels
from rknn_ray.mechanisms.base import MechanismParams
from rknn_ray.queries import QuerySet, select_queries
from rknn_ray.represent import Encoder, make_encoder
from rknn_ray.rknn import build_answers


@dataclass
class PreparedData:
    splits: object              # rknn_ray.data.Splits
    client_ids: np.ndarray      # (m,) virtual client of each private record
    num_classes: int
    image_shape: tuple
    dataset: str

    @property
    def num_clients(self) -> int:
        return int(np.unique(self.client_ids).size)

    @property
    def max_records_per_client(self) -> int:
        return int(np.bincount(self.client_ids).max(initial=0))


def prepare_data(cfg) -> PreparedData:
    """Load the dataset, make the split, check it, partition private records."""
    from rknn_ray.config import validate_with_data
    d = cfg.data
    ds = load_dataset(d.dataset, d.data_root, **(d.synthetic or {})) \
        if d.dataset == "synthetic" else load_dataset(d.dataset, d.data_root)
    splits = make_splits(ds, rule=d.split, seed=cfg.run.seed)
    validate_features(splits.private_x, splits.private_y, ds.num_classes, what="private data")
    validate_features(splits.public_x, splits.public_y, ds.num_classes, what="public data")
    validate_with_data(cfg, len(splits.public_x), len(splits.private_x), ds.num_classes)
    clients = len(splits.private_y) if d.partition == "one_per_client" else d.clients
    client_ids = partition(splits.private_y, clients, scheme=d.partition,
                           alpha=d.alpha, seed=cfg.run.seed)
    return PreparedData(splits, np.asarray(client_ids, dtype=np.int64), ds.num_classes,
                        tuple(ds.image_shape), ds.name)


def fit_queries(cfg, data: PreparedData) -> tuple[Encoder, np.ndarray, QuerySet]:
    """Fit the encoder on public data and pick the s queries (k-means centres)."""
    r = cfg.represent
    encoder = make_encoder(r.encoder, dim=r.dim, whiten=r.whiten) \
        if r.encoder == "pca" else make_encoder(r.encoder)
    encoder.fit(data.splits.public_x)
    public_emb = encoder.transform(data.splits.public_x)
    q = cfg.queries
    qs = select_queries(public_emb, q.s, restarts=q.restarts, niter=q.niter,
                        seed=cfg.run.seed, use_nearest_public=q.use_nearest_public)
    return encoder, public_emb, qs


def exact_answers(encoder: Encoder, data: PreparedData, qs: QuerySet, k: int) -> RecordAnswers:
    """All records' answers in one place: only for the non-private reference."""
    emb = encoder.transform(data.splits.private_x)
    order = np.argsort(data.client_ids, kind="stable")
    return build_answers(emb[order], data.splits.private_y[order], data.client_ids[order],
                         qs.features, k, data.num_classes)


def mechanism_params(cfg, data: PreparedData, eps: float | None = None,
                     num_clients: int | None = None, delta: float | None = None) -> MechanismParams:
    p = cfg.privacy
    options = {"noise": p.noise, "multi_record": p.multi_record,
               "bound": p.amplification_bound, **(p.options or {})}
    return MechanismParams(num_queries=cfg.queries.s, num_classes=data.num_classes,
                           k=cfg.rknn.k, r=cfg.rknn.r,
                           eps=float(p.eps if eps is None else eps),
                           delta=float(p.delta if delta is None else delta),
                           num_clients=int(num_clients or data.num_clients),
                           max_records_per_client=data.max_records_per_client, options=options)


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


def dataset_sources(cfg, data: PreparedData, shards: int | None = None) -> list:
    """One source spec per client shard: contiguous client-id ranges of the run's partition.

    Each shard re-derives the same seeded split and partition from ``cfg`` and keeps
    its own range (rknn_ray.data.sources), so no private record is shipped to it.
    """
    from rknn_ray.data.sources import DatasetShardSource
    n = int(data.client_ids.max()) + 1 if data.client_ids.size else 0
    count = max(1, min(int(shards or cfg.cluster.shards), n))
    cuts = np.linspace(0, n, count + 1).astype(np.int64)
    return [DatasetShardSource(cfg, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


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

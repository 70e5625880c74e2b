"""FedMD-NFDP (paper 003): federated model distillation with "noise-free" DP.

Each party draws ONE k-subsample of its n private records (with or without
replacement), trains its local model only on that subsample, and in each of R
rounds (communicate / aggregate / digest / revisit) uploads its predictions on the
public queries (argmax, softmax or logits); the server averages them into a
consensus, every party digests the consensus on the public queries and revisits
its subsample. Everything after the subsample is post-processing of the
subsample, so the rounds cost nothing extra.

Guarantee (record level, add/remove-one record neighbours, per party; the parties
hold disjoint records, so the job's guarantee is the worst party's):

* with replacement (Theorem 2): ``(k ln((n+1)/n), 1 - ((n-1)/n)^k)``
* without replacement (Theorem 1): ``(ln((n+1)/(n+1-k)), k/n)``

with the NATURAL log. The paper's Table 2 prints ``k log10((n+1)/n)`` (about 2.3x
too small) and its "k=16" rows are k=18 (see ../shared/papers/README.md);
:func:`table2_printed_eps` reproduces the printed numbers for the tests only.
delta is about k/n: far above the usual 1/n whenever k >= 1, i.e. the mechanism
may reveal a whole record with probability ~k/n. Rows whose delta exceeds 1/n are
flagged (``details['delta_exceeds_1_over_n']``). The trust model is "local": the
server sees every party's upload and needs no trust.
"""
from __future__ import annotations

import math
import time

import numpy as np

from rknn_ray.baselines.common import (NEIGHBOUR_ADD_REMOVE, BaselineRow, BaselineSetup,
                                       baseline_row, fit_models, init_models, new_ledger, pad_groups, record,
                                       student_from_query_counts)
from rknn_ray.accounting.accountants import DEFAULT_COSTING, subsample_epsilon_delta
from rknn_ray.baselines.events import nfdp_event
from rknn_ray.rng import make_generator

MODES = ("softmax", "logits", "argmax")


#: (eps, delta) of a k-subsample of n records: Theorem 2 (replacement) or Theorem 1 (the
#: accountant's closed form for SubsampleDpEvent)
nfdp_epsilon_delta = subsample_epsilon_delta


def table2_printed_eps(k: int, n: int) -> float:
    """The epsilon 003's Table 2 prints: k log10((n+1)/n) (base-10 slip)."""
    return k * math.log10((n + 1) / n)


def largest_k(target_eps: float, n: int, replacement: bool = True) -> int:
    """Largest subsample size whose Theorem 1/2 eps is <= target_eps (0 if none)."""
    if replacement:
        return max(0, int(math.floor(target_eps / math.log((n + 1) / n) + 1e-12)))
    # ln((n+1)/(n+1-k)) <= t  <=>  k <= (n+1)(1 - e^-t)
    return max(0, min(n, int(math.floor((n + 1) * (1.0 - math.exp(-target_eps)) + 1e-12))))


def subsample(n: int, k: int, replacement: bool, rng: np.random.Generator) -> np.ndarray:
    """Indices of the k-subsample (drawn once per party, before any training)."""
    if replacement:
        return rng.integers(0, n, size=k)
    return rng.choice(n, size=k, replace=False)


class NfdpParties:
    """Several parties' local models (hosted together; one row of the batch per party).

    Holds each party's subsample only: the rest of its records are dropped at
    construction, so nothing after it can depend on them.
    """

    def __init__(self, xs: list, ys: list, k: int, replacement: bool, num_classes: int,
                 seed: int, hidden: int = 0, lr: float = 0.05, weight_decay: float = 1e-3,
                 rng_kind: str = "secure"):
        rng = make_generator(rng_kind, seed)     # the subsample is NFDP's privacy randomness
        picks = [subsample(len(y), k, replacement, rng) for y in ys]
        self.sub_x = [np.asarray(x)[p] for x, p in zip(xs, picks)]
        self.sub_y = [np.asarray(y)[p] for y, p in zip(ys, picks)]
        self.num_classes = num_classes
        self.lr, self.weight_decay = lr, weight_decay
        self._X, self._T, self._M = pad_groups(self.sub_x, self.sub_y, num_classes)
        self.models = init_models(len(xs), self._X.shape[2], num_classes, hidden, seed)

    def revisit(self, steps: int) -> None:
        """Train (again) on the private subsample."""
        fit_models(self.models, self._X, self._T, self._M, steps, self.lr, self.weight_decay)

    def predict(self, queries: np.ndarray, mode: str = "softmax") -> np.ndarray:
        """(G, s, C) uploads: softmax probabilities, logits, or one-hot argmax."""
        if mode == "logits":
            return self.models.predict_logits(queries)
        p = self.models.predict_proba(queries)
        if mode == "argmax":
            return np.eye(self.num_classes, dtype=np.float32)[p.argmax(-1)]
        return p

    def digest(self, queries: np.ndarray, consensus: np.ndarray, steps: int,
               mode: str = "softmax") -> None:
        """Fit the consensus on the public queries (soft targets; logits are softmaxed)."""
        target = consensus
        if mode == "logits":
            e = np.exp(consensus - consensus.max(-1, keepdims=True))
            target = e / e.sum(-1, keepdims=True)
        g = len(self.sub_x)
        X = np.broadcast_to(queries[None], (g,) + queries.shape).astype(np.float32)
        T = np.broadcast_to(target[None], (g,) + target.shape).astype(np.float32)
        M = np.ones(X.shape[:2], np.float32)
        fit_models(self.models, X, T, M, steps, self.lr, self.weight_decay)


class InProcessParties:
    """Party groups held in this process: the default host of :func:`run_nfdp`.

    A host takes one keyword dict of :class:`NfdpParties` arguments per group, answers
    ``call(method, *args)`` with one result per group and ``close()``; the Ray host with
    the same shape is ``actors.nfdp_shard.RayParties`` (the job injects it, so this
    library never imports Ray)."""

    def __init__(self, groups: list[dict]):
        self.groups = [NfdpParties(**g) for g in groups]

    def call(self, method: str, *args) -> list:
        return [getattr(g, method)(*args) for g in self.groups]

    def close(self) -> None:
        self.groups = []


def run_nfdp(setup: BaselineSetup, target_eps: float, parties: int = 10, replacement: bool = True,
             rounds: int = 3, mode: str = "softmax", shards: int = 2, hosts=InProcessParties,
             local_steps: int = 150, digest_steps: int = 50, seed: int | None = None,
             ledger=None) -> BaselineRow:
    """FedMD-NFDP at the largest k whose Theorem 1/2 eps is <= ``target_eps``.

    Parties: the run's clients grouped into ``parties`` silos (client id mod parties;
    FedMD is cross-silo, the paper uses 10), the silos split over ``shards`` groups,
    each held by a host ``hosts(group_kwargs)`` (:class:`InProcessParties`, or the job's
    ``actors.nfdp_shard.RayParties``: Ray actors).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    t0 = time.perf_counter()
    cfg, sp = setup.cfg, setup.splits
    seed = cfg.run.seed if seed is None else seed
    owner = setup.data.client_ids % parties
    xs = [setup.private_emb[owner == i] for i in range(parties)]
    ys = [sp.private_y[owner == i] for i in range(parties)]
    sizes = [len(y) for y in ys]
    n_min = min(sizes)
    k = largest_k(target_eps, n_min, replacement)
    if k < 1:
        raise ValueError(f"NFDP: even k=1 costs eps={nfdp_epsilon_delta(1, n_min, replacement)[0]:.4g}"
                         f" > target {target_eps} with n={n_min} records per party")
    # every party's (eps, delta) is largest at the fewest records: that party's event
    ledger = ledger or new_ledger()
    entry = record(ledger, nfdp_event(k, n_min, replacement), DEFAULT_COSTING, "local",
                   f"nfdp_{'with' if replacement else 'without'}_replacement", "record",
                   NEIGHBOUR_ADD_REMOVE, f"k={k} of n>={n_min} per party; delta ~ k/n", n=n_min,
                   parties=parties)
    delta = entry.guarantee.delta
    queries = setup.query_emb
    C = setup.num_classes
    groups = np.array_split(np.arange(parties), max(1, min(shards, parties)))
    host = hosts([dict(xs=[xs[i] for i in g], ys=[ys[i] for i in g], k=k, replacement=replacement,
                       num_classes=C, seed=seed * 1000 + j, rng_kind=cfg.run.rng)
                  for j, g in enumerate(groups)])
    try:
        host.call("revisit", local_steps)
        consensus = None
        for _ in range(rounds):
            uploads = np.concatenate(host.call("predict", queries, mode))      # (parties, s, C)
            consensus = uploads.mean(0)
            host.call("digest", queries, consensus, digest_steps, mode)
            host.call("revisit", local_steps // 3)
    finally:
        host.close()
    scores = consensus if mode != "logits" else np.exp(consensus - consensus.max(-1, keepdims=True))
    acc, lab_acc, _ = student_from_query_counts(setup, scores)
    per_upload = queries.shape[0] * (4 * C if mode != "argmax" else 4)
    return baseline_row(
        setup, ledger, f"fedmd_nfdp{'' if replacement else '_wor'}", target_eps, t0,
        unit="record", neighbour=NEIGHBOUR_ADD_REMOVE, accuracy=acc, label_accuracy=lab_acc,
        rounds=rounds, bytes_per_client=2.0 * per_upload * rounds,
        details={"k": k, "party_sizes": sizes, "parties": parties, "mode": mode,
                 "replacement": replacement,
                 "delta_exceeds_1_over_n": bool(delta > 1.0 / n_min),
                 "warning": (f"delta={delta:.3g} >> 1/n={1.0 / n_min:.3g}: the subsample may "
                             "expose whole records" if delta > 1.0 / n_min else "")})

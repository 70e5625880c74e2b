"""Adaptive rounds (paper 000, Algorithm 1 with T > 1): round t's queries go where the
current student is least certain.

Paper 000 describes T > 1 rounds whose queries adapt to the student but never
specifies the rule (every experiment there uses T = 1). Ours, for round t >= 1
(``rounds.query_selection: uncertain``; the driver's step is
``rknn_ray.job.rounds.next_round_uncertain``):

1. Label the public set from every count released so far, exactly as the job's final
   labels are made (``rknn_ray.job.stages.finish_labels``: cluster propagation over the
   union of the rounds' queries, smoothed over the public k-NN graph).
2. Fit an *interim student* on those labels: the MLP of ``rknn_ray.student`` trained
   in this process (``train_student_local``) on the public encoder's embeddings. Not
   Ray Train: a Train start-up per fit costs more than the whole fit of a small MLP on a
   few thousand public embeddings; the final student is still trained
   by Ray Train.
3. Score every public sample that is not yet a query by the interim student's
   uncertainty: ``margin`` (1 - (p1 - p2), the gap between its two most probable
   classes) or ``entropy`` (of its predicted distribution, divided by log |Y|).
4. Keep the ``pool_factor * s`` least certain of them and spread the ``s`` new
   queries over that pool (k-means on the pool, each centre replaced by its nearest
   pool member), so they do not all land in one confusing region.

Privacy: steps 1-4 read the released (noisy) counts, the public embeddings and the
indices of earlier queries -- nothing else. No private record, no exact count and no
public label enters the selection (:func:`select_uncertain` takes only those inputs;
public labels are used, after the fact, only to *measure* the interim student, like
every accuracy figure of the run). By the post-processing property of differential
privacy the selection costs nothing; each round's release spends its own share of
``privacy.eps`` (``rounds.budget_split``; under the pld accountant single-message shuffle
rounds are calibrated together for their composition) and is its own ledger event, so T
rounds at total eps compose to at most eps, as for ``farthest``.
"""
from __future__ import annotations

import math
import os
import tempfile

import numpy as np

from rknn_ray.labeling.queries import QuerySet, nearest, select_queries

UNCERTAINTY_RULES = ("margin", "entropy")


def uncertainty(probs: np.ndarray, rule: str) -> np.ndarray:
    """(N,) uncertainty in [0, 1] of each row of class probabilities (higher: less certain)."""
    p = np.asarray(probs, dtype=np.float64)
    if rule == "margin":
        top2 = -np.sort(-p, axis=1)[:, :2]
        return 1.0 - (top2[:, 0] - top2[:, 1])
    if rule == "entropy":
        q = np.clip(p, 1e-12, 1.0)
        return -(p * np.log(q)).sum(axis=1) / math.log(p.shape[1])
    raise ValueError(f"unknown uncertainty rule {rule!r}; use one of {UNCERTAINTY_RULES}")


def interim_student_probs(public_emb: np.ndarray, targets: np.ndarray, weight: np.ndarray,
                          num_classes: int, label_type: str, seed: int,
                          epochs: int = 30) -> np.ndarray:
    """(N, |Y|) class probabilities of an MLP fitted in-process on released-derived labels.

    ``targets`` (hard (N,) or soft (N, |Y|)) and ``weight`` come from the released counts
    (``Labeling.public_targets`` / ``public_weight``); the inputs are the public
    embeddings. Same training loop as the final student, one worker, no Ray.
    """
    import torch  # defers torch: only adaptive rounds train an interim student

    from rknn_ray.student.train import StudentConfig, load_student, train_student_local
    x = np.ascontiguousarray(public_emb, dtype=np.float32)
    dim = (int(x.shape[1]),)
    config = StudentConfig(epochs=epochs, batch_size=64, lr=2e-3, num_workers=1, use_gpu=False,
                           label_type=label_type, seed=seed, arch="mlp")
    with tempfile.TemporaryDirectory(prefix="rknn-interim-") as tmp:
        result = train_student_local(x, targets, np.zeros((0, dim[0]), np.float32),
                                     np.zeros(0, np.int64), dim, num_classes, config,
                                     checkpoint_dir=tmp, sample_weight=weight)
        model = load_student(result.checkpoint_path or os.path.join(tmp, "student.pt"))
    with torch.no_grad():
        logits = torch.cat([model(torch.as_tensor(x[i:i + 4096]))
                            for i in range(0, x.shape[0], 4096)])
    return torch.softmax(logits, dim=1).numpy().astype(np.float64)


def select_uncertain(public_emb: np.ndarray, probs: np.ndarray, taken: np.ndarray, s: int,
                     seed: int, rule: str = "margin",
                     pool_factor: float = 2.0) -> tuple[QuerySet, dict]:
    """``s`` new queries among the least certain public samples that are not yet queries.

    Inputs are public or post-processed only: public embeddings, the interim student's
    probabilities on them (``interim_student_probs``), the public indices of earlier
    queries. The pool is the ceil(pool_factor * s) least certain free samples (ties
    broken by a seeded permutation); k-means (seeded) spreads the picks over it. Returns
    the QuerySet (features = the picked public embeddings) and what was chosen, for the
    report.
    """
    x = np.ascontiguousarray(public_emb, dtype=np.float32)
    taken = np.asarray(taken, dtype=np.int64)
    free = np.ones(x.shape[0], bool)
    free[taken] = False
    n_free = int(free.sum())
    if not 1 <= s <= n_free:
        raise ValueError(f"only {n_free} public samples are not yet queries; cannot pick {s} "
                         "more (lower queries.s or rounds.count)")
    u = uncertainty(probs, rule)
    candidates = np.flatnonzero(free)
    order = np.random.default_rng(seed).permutation(candidates.size)     # seeded tie-break
    candidates = candidates[order]
    candidates = candidates[np.argsort(-u[candidates], kind="stable")]
    pool = candidates[:min(n_free, max(s, int(math.ceil(pool_factor * s))))]
    if pool.size == s:
        picks = pool.copy()
    else:
        km = select_queries(x[pool], s, restarts=1, seed=seed, use_nearest_public=True)
        picks = pool[np.unique(km.public_index)]       # two centres may share a nearest member
        if picks.size < s:                             # fill with the least certain left over
            rest = pool[~np.isin(pool, picks)]
            picks = np.concatenate([picks, rest[:s - picks.size]])
    picks = np.sort(picks).astype(np.int64)
    _, assign = nearest(x[picks], x, 1)
    info = {"rule": f"uncertain/{rule}", "pool": int(pool.size), "free": n_free,
            "pool_factor": float(pool_factor),
            "uncertainty_chosen": float(u[picks].mean()),
            "uncertainty_free": float(u[free].mean()), "uncertainty_all": float(u.mean())}
    return QuerySet(np.ascontiguousarray(x[picks]), picks, assign[:, 0].astype(np.int64),
                    float("nan")), info

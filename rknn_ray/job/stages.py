"""The sequences of stages, each written once, that run across several stage packages.

Each stage reads its own config in its own package (``rknn_ray/<package>/stage.py``: the
encoder, the mechanism, the labels and the connection plan, the student;
``rknn_ray.data.sources`` the shards' sources); the rounds loop is
:func:`rknn_ray.job.rounds.planned_rounds`. Here: :func:`fit_queries` (encoder -> queries),
:func:`prepare_stages` (prepare -> auto s, k -> encoder and queries), :func:`resolve_auto`
(s and k from the mechanism's noise), :func:`resolve_connection` and
:func:`released_weights` (the connection rule from public data and the mechanism's noise),
:func:`finish_labels` (released counts -> labels and their confidence),
:func:`nonprivate_labels` (the one non-private reference: exact counts -> labels). The
job, its diagnostics, the non-private reference (:mod:`.reference`), the baselines' setup
(:mod:`.baselines`) and the benchmarks call them instead of re-listing the steps. They
chain stage packages that sit side by side below the job, so they are the job layer's; no
Ray here.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rknn_ray.data.prepared import PreparedData, prepare_data
from rknn_ray.data.splits import has_public_labels
from rknn_ray.labeling.autotune import choose_s_k
from rknn_ray.labeling.connection import choose_rule, release_weights
from rknn_ray.labeling.denoise import choose_neighbours
from rknn_ray.labeling.queries import QuerySet, select_queries
from rknn_ray.labeling.stage import (Labeling, connection_plan, exact_counts, round_budgets,
                                     round_query_counts, smoothed_labels)
from rknn_ray.mechanisms.composed_rounds import composes_jointly, round_shares
from rknn_ray.mechanisms.stage import (free_dlap_shares, multi_message_s_cap,
                                       noise_std_per_count)
from rknn_ray.representation.represent import Encoder
from rknn_ray.representation.stage import encoder_from_config, encoder_info


def fit_queries(cfg, data: PreparedData, progress=None,
                s: int | None = None) -> tuple[Encoder, np.ndarray, QuerySet]:
    """Fit the encoder on public data and pick the first round's queries (k-means centres):
    ``s`` of them, by default ``round_query_counts(cfg)[0]`` (= queries.s unless
    rounds.split_queries divides s over the rounds)."""
    encoder = encoder_from_config(cfg, progress)
    encoder.fit(data.splits.public_x)          # public inputs only: never private records
    public_emb = encoder.transform(data.splits.public_x)
    q = cfg.queries
    s = round_query_counts(cfg)[0] if s is None else int(s)
    if s == len(public_emb):        # every public sample is a query: k-means would return them
        idx = np.arange(len(public_emb), dtype=np.int64)
        return encoder, public_emb, QuerySet(np.ascontiguousarray(public_emb, dtype=np.float32),
                                             idx, idx.copy(), 0.0)
    qs = select_queries(public_emb, s, restarts=q.restarts, niter=q.niter,
                        seed=cfg.run.seed, use_nearest_public=q.use_nearest_public)
    return encoder, public_emb, qs


@dataclass
class Stages:
    """What every run of the method starts from: its data, the public encoder, the public
    embeddings and the first round's queries (``cfg`` with ``auto`` s and k resolved when
    :func:`prepare_stages` was asked to)."""
    cfg: object
    data: PreparedData
    encoder: Encoder
    public_emb: np.ndarray
    queries: QuerySet
    auto: dict | None = None        # resolve_auto's choice, None when nothing was resolved


def votes_counted(cfg, data) -> int:
    """How many records' votes the released counts hold (public): a local randomizer's client
    that samples one of its records (privacy.multi_record sample / normalize) adds one vote's
    mass, so the clients; else every record kept within the bound (a table's count, public
    under its relation), or the private records of a built-in set."""
    p = cfg.privacy
    one_per_client = p.model == "local" or (p.model == "shuffle" and p.mechanism != "multi")
    if one_per_client and p.multi_record != "each" and data.max_records_per_client > 1:
        return int(data.num_clients)
    kept = getattr(data, "kept_records", None)
    return int(kept) if kept is not None else len(data.splits.private_y)


def prepare_stages(cfg, data: PreparedData | None = None, *, resolve: bool = False,
                   s: int | None = None, progress=None) -> Stages:
    """prepare -> (``resolve``: auto s and k) -> encoder and queries, the one place this
    sequence is written. ``data``: an already prepared run's (a benchmark reusing one
    dataset), else prepared here; ``s`` as :func:`fit_queries` takes it."""
    data = prepare_data(cfg) if data is None else data
    choice = None
    if resolve:
        cfg, choice = resolve_auto(cfg, data)
    encoder, public_emb, qs = fit_queries(cfg, data, progress, s=s)
    return Stages(cfg, data, encoder, public_emb, qs, choice)


def nonprivate_labels(cfg, data: PreparedData, encoder: Encoder, query_sets: list[QuerySet],
                      all_qs: QuerySet, public_emb: np.ndarray, rounds=(),
                      progress=None, connection=None) -> tuple[np.ndarray, "Labeling", dict]:
    """The non-private reference's labels, the one place they are made (rknn_ray.job.reference
    and a run's diagnostics): exact counts of ``query_sets``, labelled as a private run's
    released counts are (:func:`finish_labels`, ``all_qs`` their union) with no noise.
    ``connection``: as :func:`exact_counts` takes it; None: planned per query set as
    ``rknn.connection`` says (:func:`~rknn_ray.labeling.stage.connection_plan`, public data
    only).
    NOT private: returns (exact counts, Labeling, label info)."""
    if connection is None:
        rule = resolve_connection(cfg, data, public_emb, query_sets[0])[0]
        connection = [connection_plan(cfg, public_emb, q.features, rule) for q in query_sets]
    exact = exact_counts(encoder, data, query_sets, cfg.rknn.k, connection)
    lab, info = finish_labels(cfg, data, exact.astype(float), all_qs, public_emb, list(rounds),
                              progress, noise_std=0.0)
    return exact, lab, info


# ------------------------------------------------------------ the connection rule

def released_weights(cfg, data: PreparedData, public_emb: np.ndarray, rounds, query_sets,
                     plans) -> np.ndarray:
    """``rknn.reweight: released``: one weight per public sample, the mean over the rounds
    released so far of :func:`rknn_ray.labeling.connection.release_weights` (each from that
    round's released counts, its queries and the plan its clients used, and the noise std
    of one count at its eps). Post-processing of released counts: no privacy cost."""
    out = np.zeros(len(public_emb))
    for r, qs, plan in zip(rounds, query_sets, plans):
        sigma = noise_std_per_count(cfg, data, k=int(cfg.rknn.k), s=qs.size,
                                    eps=float(r.guarantee.eps))
        out += release_weights(public_emb, qs.features, r.counts, int(cfg.rknn.k),
                               int(cfg.rknn.r), len(data.splits.private_y), sigma, plan)
    return out / max(1, len(rounds))


def noisiest_round_share(cfg, data: PreparedData) -> tuple[float, float]:
    """(eps, delta) of the round with the smallest share: what the noisiest round's counts
    carry, for choices made before the rounds run (s, k, the connection rule). With the
    rounds calibrated together (rknn_ray.mechanisms.composed_rounds) a round's share is the
    cost of its planned eps0, larger than eps/T; with ``rknn.k: auto`` that plan is made at
    k = 1, as the noise figures these choices compare are."""
    if not composes_jointly(cfg):
        p = cfg.privacy
        return min(round_budgets(p.eps, p.delta, int(cfg.rounds.count), cfg.rounds.budget_split))
    plan_cfg = cfg if cfg.rknn.k != "auto" else cfg.with_overrides(["rknn.k=1"])
    share = min(round_shares(plan_cfg, data), key=lambda sh: sh.eps)
    return share.eps, share.delta


def resolve_connection(cfg, data: PreparedData, public_emb: np.ndarray,
                       qs: QuerySet) -> tuple[str, dict | None]:
    """``rknn.connection`` as a rule, and for ``auto`` what it chose and why
    (:func:`rknn_ray.labeling.connection.choose_rule`: public embeddings and queries, the
    number of private records, and the noise std of one count from public parameters at the
    smallest round's eps). Returns (rule, choice dict or None)."""
    rule = cfg.rknn.connection
    if rule != "auto":
        return rule, None
    eps = noisiest_round_share(cfg, data)[0]
    sigma = noise_std_per_count(cfg, data, k=int(cfg.rknn.k), s=qs.size, eps=eps)
    return choose_rule(public_emb, qs.features, qs.assignment, int(cfg.rknn.k),
                       len(data.splits.private_y), sigma)


# ------------------------------------------------------------ s and k, labels


def resolve_auto(cfg, data: PreparedData):
    """Replace ``queries.s: auto`` / ``rknn.k: auto`` by values chosen from public information
    (rknn_ray.labeling.autotune); returns (cfg, choice dict or None). The choice is made for one
    round's share of eps (the smallest, with rounds.count > 1; s per round, times T with
    rounds.split_queries). For the multi-message shuffle protocol s is also capped by the
    messages a client may send in a round (multi_message_s_cap)."""
    if cfg.queries.s != "auto" and cfg.rknn.k != "auto":
        return cfg, None
    # T > 1 rounds: each round releases with its own share of the budget; choose for the
    # noisiest (smallest) share, which is what that round's counts will carry
    count = int(cfg.rounds.count)
    eps_t, delta_t = noisiest_round_share(cfg, data)
    per_round = cfg if count == 1 else cfg.with_overrides([f"privacy.eps={eps_t}",
                                                            f"privacy.delta={delta_t}"])
    split = count > 1 and cfg.rounds.split_queries
    fixed_s = None if cfg.queries.s == "auto" else (
        max(1, cfg.queries.s // count) if split else cfg.queries.s)
    fixed_k = None if cfg.rknn.k == "auto" else cfg.rknn.k

    n_pub = len(data.splits.public_y)
    pool_cap = None                 # every round picks s public samples that are not yet queries
    if count > 1 and not split:
        pool_cap = (max(1, n_pub // count), f"{count} rounds of s new public samples: "
                    f"s <= {n_pub} // {count}")

    def choose_at(run_cfg):
        sigma = noise_std_per_count(run_cfg, data, k=1)

        def choose(k_for_cap: int):
            caps = [] if fixed_s is not None else [
                c for c in (pool_cap, multi_message_s_cap(run_cfg, data, k_for_cap)) if c]
            return choose_s_k(votes_counted(cfg, data), n_pub, data.num_classes, sigma,
                              r=cfg.rknn.r, fixed_s=fixed_s, fixed_k=fixed_k,
                              max_s=min(caps) if caps else None)
        choice = choose(fixed_k or 1)
        if choice.k > (fixed_k or 1) and fixed_s is None:  # a larger k costs more noise messages
            choice = choose(choice.k)
        return choice, sigma

    shares, share_info = free_dlap_shares(cfg), {}
    if shares:          # the most queries; on a tie the larger share (less noise)
        tried = [(share, *choose_at(per_round.with_overrides(
            [f"privacy.options.dlap_share={share}"]))) for share in shares]
        share, choice, sigma = max(tried, key=lambda t: t[1].s)
        cfg = cfg.with_overrides([f"privacy.options.dlap_share={share}"])
        share_info = {"dlap_share": share, "dlap_share_tried": {str(sh): int(c.s)
                                                                for sh, c, _ in tried}}
    else:
        choice, sigma = choose_at(per_round)
    s_total = cfg.queries.s if fixed_s is not None else (
        min(n_pub, choice.s * count) if split else choice.s)
    reason = choice.reason
    if count > 1 and fixed_s is None:
        joint = (f" (the rounds calibrated together for their pld composition to "
                 f"eps = {cfg.privacy.eps:g})" if composes_jointly(cfg) else "")
        reason += f"; chosen for one round's eps = {eps_t:.4g} of {count}{joint}" + (
            f"; s = {choice.s} per round x {count} rounds (rounds.split_queries) -> {s_total}"
            if split else "")
    if share_info:
        reason += (f"; privacy.options.dlap_share = {share_info['dlap_share']:g}, of "
                   + ", ".join(f"{sh} (s = {v})" for sh, v in share_info["dlap_share_tried"].items())
                   + ": the most queries under the message cap")
    cfg = cfg.with_overrides([f"queries.s={s_total}", f"rknn.k={choice.k}"])
    extra = {"per_round_eps": eps_t, "rounds": count} if count > 1 else {}
    return cfg, {**choice.to_dict(), "s": int(s_total), "reason": reason, "noise_std_k1": sigma,
                 **share_info, **extra}


def finish_labels(cfg, data: PreparedData, counts: np.ndarray, qs: QuerySet, public_emb: np.ndarray,
                  rounds, progress=None, noise_std: float | None = None) -> tuple[Labeling, dict]:
    """Labels for the student from the released counts, smoothed over the public graph when
    ``labels.smooth`` != 1 (post-processing; rknn_ray.labeling.denoise). Returns (Labeling, info)
    where info records the noise std, the number of neighbours and why, and per-sample
    confidences (``info["confidence"]``, dropped from the report)."""
    from rknn_ray.student.semi import label_confidence       # defers torch
    if noise_std is None:        # the noisiest round's per-count std (its share of eps)
        eps = min(float(r.guarantee.eps) for r in rounds) if rounds else cfg.privacy.eps
        noise_std = noise_std_per_count(cfg, data, k=cfg.rknn.k, s=qs.size, eps=eps)
    n_pub = len(data.splits.public_y)
    if cfg.labels.smooth == "auto":
        choice = choose_neighbours(votes_counted(cfg, data), cfg.rknn.k, cfg.rknn.r, qs.size,
                                   n_pub, noise_std, data.num_classes)
        m, why = choice.neighbours, choice.reason
    else:
        m = int(cfg.labels.smooth)
        why = ("labels.smooth = 1, the default; labels.smooth: auto chooses" if m == 1
               else f"labels.smooth = {m}")
    lab, sm = smoothed_labels(counts, qs, public_emb, data.splits.public_y, cfg.labels.type, m,
                              noise_std)
    q_eff = max(1.0, m * qs.size / n_pub)
    conf = label_confidence(sm, noise_std / np.sqrt(q_eff))
    if progress is not None:     # an accuracy only where public rows carry labels to measure
        measured = (f"; label accuracy {lab.label_accuracy:.4f}"
                    if has_public_labels(data.splits) else "")
        what = "off" if m == 1 else f"{m} public neighbours"
        progress.say(f"denoising: {what} ({why}){measured}")
    info = {"noise_std": noise_std, "denoise": {"neighbours": m, "reason": why,
                                                "post_processing": True},
            "encoder": encoder_info(cfg), "confidence": conf}
    return lab, info

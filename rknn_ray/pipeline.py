"""The pure stages of one distillation round, wired from a validated config.

No Ray here: ``jobs/distill.py`` runs these stages around the actors
(ClientShard, Shuffler, Server) and Ray Train. Each stage is a plain function so
tests and notebooks can run the method without a cluster.

The sequences of stages are assembled here once: :func:`prepare_stages` (prepare ->
auto s, k -> encoder and queries), :func:`nonprivate_labels` (the one non-private
reference: exact counts -> labels) and :func:`train_on_labels` (student inputs ->
student). The non-private reference, a run's diagnostics, the baselines and the
benchmarks call them instead of re-listing the steps (the job's runner and finish keep
their own order, with budget checks and progress stages between the same stages).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.data.prepared import PreparedData, partitioned, prepare_data  # noqa: F401 - the stages' entry
from rknn_ray.labeling.labels import accuracy, hard_labels, propagate, soft_labels
from rknn_ray.mechanisms.base import Mechanism, MechanismParams
from rknn_ray.labeling.queries import QuerySet, select_queries
from rknn_ray.representation.represent import Encoder, make_encoder
from rknn_ray.labeling.rknn import build_answers


def encoder_from_config(cfg, progress=None) -> Encoder:
    """An unfitted encoder as ``cfg.represent`` describes it."""
    r = cfg.represent
    if r.encoder == "pca":
        return make_encoder("pca", dim=r.dim, whiten=r.whiten)
    if r.encoder == "hog":
        return make_encoder("hog", dim=r.dim)
    if r.encoder == "simclr":
        return make_encoder("simclr", dim=r.dim, epochs=r.epochs, batch_size=r.batch_size,
                            flip=r.flip, backbone=r.backbone, seed=cfg.run.seed, trainer=r.trainer,
                            cache_dir=r.cache_dir, use_gpu=cfg.student.use_gpu, progress=progress)
    return make_encoder(r.encoder)


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


def exact_answers(encoder: Encoder, data: PreparedData, qs: QuerySet, k: int,
                  connection=None) -> RecordAnswers:
    """All held records' answers in one place: only for the non-private reference.
    ``connection``: the round's plan (:mod:`rknn_ray.labeling.connection`), None: reverse k-NN."""
    data.require_private_rows("the non-private reference (exact counts)")
    rows = data.held_rows()
    rows = rows[np.argsort(data.client_ids[rows], kind="stable")]
    emb = encoder.transform(data.splits.private_x[rows])
    return build_answers(emb, data.splits.private_y[rows], data.client_ids[rows],
                         qs.features, k, data.num_classes, connection)


def exact_counts(encoder: Encoder, data: PreparedData, query_sets: list[QuerySet],
                 k: int, connection=None) -> np.ndarray:
    """NOT private: the exact (s, |Y|) counts of every round's queries, stacked in round order.
    ``connection``: None (reverse k-NN), one Connection (one query set), or one per set."""
    plans = (connection if isinstance(connection, (list, tuple))
             else [connection] * len(query_sets))
    if len(plans) != len(query_sets):
        raise ValueError(f"{len(plans)} connection plans for {len(query_sets)} query sets")
    return np.concatenate([exact_answers(encoder, data, q, k, c).counts()
                           for q, c in zip(query_sets, plans)])


def nonprivate_labels(cfg, data: PreparedData, encoder: Encoder, query_sets: list[QuerySet],
                      all_qs: QuerySet, public_emb: np.ndarray, rounds=(),
                      progress=None, connection=None) -> tuple[np.ndarray, "Labeling", dict]:
    """The non-private reference's labels, the one place they are made (rknn_ray.reference
    and a run's diagnostics): exact counts of ``query_sets``, labelled as a private run's
    released counts are (:func:`finish_labels`, ``all_qs`` their union) with no noise.
    ``connection``: as :func:`exact_counts` takes it; None: planned per query set as
    ``rknn.connection`` says (:func:`connection_plan`, public data only).
    NOT private: returns (exact counts, Labeling, label info)."""
    if connection is None:
        rule = resolve_connection(cfg, data, public_emb, query_sets[0])[0]
        connection = [connection_plan(cfg, public_emb, q.features, rule) for q in query_sets]
    exact = exact_counts(encoder, data, query_sets, cfg.rknn.k, connection)
    lab, info = finish_labels(cfg, data, exact.astype(float), all_qs, public_emb, list(rounds),
                              progress, noise_std=0.0)
    return exact, lab, info


# ------------------------------------------------------------ the connection rule (issue 37)

def connection_plan(cfg, public_emb: np.ndarray, query_features: np.ndarray,
                    rule: str | None = None, sample_weight: np.ndarray | None = None):
    """The round's :class:`~rknn_ray.labeling.connection.Connection` for ``rule`` (default
    ``rknn.connection``; ``auto`` must be resolved first), from public data only (and, with
    ``sample_weight``, released counts: :func:`released_weights`): the server ships it with
    the queries to every client, in every trust model."""
    from rknn_ray.labeling.connection import plan_connection
    rule = cfg.rknn.connection if rule is None else rule
    return plan_connection(rule, public_emb, query_features, int(cfg.rknn.k),
                           sample_weight=sample_weight)


def released_weights(cfg, data: PreparedData, public_emb: np.ndarray, rounds, query_sets,
                     plans) -> np.ndarray:
    """``rknn.reweight: released``: one weight per public sample, the mean over the rounds
    released so far of :func:`rknn_ray.labeling.connection.release_weights` (each from that
    round's released counts, its queries and the plan its clients used, and the noise std
    of one count at its eps). Post-processing of released counts: no privacy cost."""
    from rknn_ray.labeling.connection import release_weights
    out = np.zeros(len(public_emb))
    for r, qs, plan in zip(rounds, query_sets, plans):
        sigma = noise_std_per_count(cfg, data, k=int(cfg.rknn.k), s=qs.size,
                                    eps=float(r.guarantee.eps))
        out += release_weights(public_emb, qs.features, r.counts, int(cfg.rknn.k),
                               int(cfg.rknn.r), len(data.splits.private_y), sigma, plan)
    return out / max(1, len(rounds))


def resolve_connection(cfg, data: PreparedData, public_emb: np.ndarray,
                       qs: QuerySet) -> tuple[str, dict | None]:
    """``rknn.connection`` as a rule, and for ``auto`` what it chose and why
    (:func:`rknn_ray.labeling.connection.choose_rule`: public embeddings and queries, the
    number of private records, and the noise std of one count from public parameters at the
    smallest round's eps). Returns (rule, choice dict or None)."""
    rule = cfg.rknn.connection
    if rule != "auto":
        return rule, None
    from rknn_ray.labeling.connection import choose_rule
    p = cfg.privacy
    eps = min(round_budgets(p.eps, p.delta, int(cfg.rounds.count), cfg.rounds.budget_split))[0]
    sigma = noise_std_per_count(cfg, data, k=int(cfg.rknn.k), s=qs.size, eps=eps)
    return choose_rule(public_emb, qs.features, qs.assignment, int(cfg.rknn.k),
                       len(data.splits.private_y), sigma)


def mechanism_params(cfg, data: PreparedData, eps: float | None = None,
                     num_clients: int | None = None, delta: float | None = None) -> MechanismParams:
    p = cfg.privacy
    options = {"noise": p.noise, "multi_record": p.multi_record,
               "bound": p.amplification_bound, **(p.options or {})}
    if p.honest_fraction is not None:          # else the mechanism's default (shuffle only)
        options["honest_fraction"] = p.honest_fraction
    return MechanismParams(num_queries=cfg.queries.s, num_classes=data.num_classes,
                           k=cfg.rknn.k, r=cfg.rknn.r,
                           eps=float(p.eps if eps is None else eps),
                           delta=float(p.delta if delta is None else delta),
                           num_clients=int(num_clients or data.num_clients),
                           max_records_per_client=data.max_records_per_client, options=options)


def mechanism_for(cfg, data: PreparedData, *, eps: float | None = None,
                  delta: float | None = None, num_queries: int | None = None,
                  k: int | None = None, model: str | None = None,
                  name: str | None = None) -> Mechanism:
    """The one place a mechanism is built from a config: ``privacy.model``/``mechanism``
    (or ``model``/``name``) calibrated by :func:`mechanism_params`; ``eps``/``delta`` a
    round's share, ``num_queries`` a round's s, ``k`` a what-if (public parameters only)."""
    import dataclasses

    from rknn_ray.mechanisms import build
    params = mechanism_params(cfg, data, eps=eps, delta=delta)
    changes = {key: int(v) for key, v in (("num_queries", num_queries), ("k", k)) if v is not None}
    if changes:
        params = dataclasses.replace(params, **changes)
    return build(model or cfg.privacy.model, name or cfg.privacy.mechanism, params)


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
    """One source per client shard: contiguous client-id ranges of the run's partition.

    Each source holds only its shard's records, cut from ``data`` (the partition this
    job prepared once), so no shard loads, splits and partitions the whole dataset
    again, and none holds another shard's records (rknn_ray.data.sources).
    """
    from rknn_ray.data.sources import PreparedShardSource
    if data.shard_sources is not None:      # the kind deals its own (each shard reads its part)
        return data.shard_sources(cfg, int(shards or cfg.cluster.shards))
    n = data.num_clients
    count = max(1, min(int(shards or cfg.cluster.shards), n))
    cuts = np.linspace(0, n, count + 1).astype(np.int64)
    return [PreparedShardSource.of(data, int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


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


# ---------------------------------------------------------------------- utility (issue 11)

def noise_std_per_count(cfg, data: PreparedData, k: int = 1, s: int | None = None,
                        eps: float | None = None) -> float:
    """Standard deviation of the mechanism's error on one count, from its error bound:
    the bound at beta = 1/2 read as a Laplace union bound over |Y| cells,
    eta = b*ln(2|Y|), gives the equivalent scale b and std sqrt(2)*b. Public parameters only."""
    import math

    mech = mechanism_for(cfg, data, eps=eps, k=k, num_queries=s or len(data.splits.public_y))
    eta = float(mech.error_bound(0.5, data.num_clients))
    return math.sqrt(2.0) * eta / math.log(2 * data.num_classes)


def multi_message_s_cap(cfg, data: PreparedData, k: int = 1) -> tuple[int, str] | None:
    """The largest s whose multi-message round costs a client at most
    ``shuffle.max_messages_per_client`` expected messages (its k*r*R real ones plus noise
    and flooding messages, which grow linearly in the s*|Y| cells), or None when the
    mechanism is not multi-message or no cap is set. Public parameters only."""
    cap = cfg.shuffle.max_messages_per_client
    if cfg.privacy.model != "shuffle" or cfg.privacy.mechanism != "multi" or cap is None:
        return None
    mech = mechanism_for(cfg, data, k=k, num_queries=1)
    per_cell = mech.cal.noise_messages_per_client / mech.cal.num_cells
    real = mech.cal.true_messages_per_record * data.max_records_per_client
    s_cap = max(1, int((cap - real) // (per_cell * data.num_classes)))
    return s_cap, (f"shuffle.max_messages_per_client = {cap}: {real} real + "
                   f"{per_cell:.4g} noise messages per cell x s x {data.num_classes} classes")


def free_dlap_shares(cfg) -> tuple[float, ...]:
    """The DLap shares :func:`resolve_auto` chooses from, or () where the share is not free:
    another mechanism, s fixed, no message cap, or ``privacy.options.dlap_share`` set.

    Under the cap a smaller share means fewer flooding messages per cell, so more queries
    for the same messages per client; query count is what bounds the labels there (on
    Fashion-MNIST at eps = 1 the release at the capped s is as accurate as the exact counts,
    docs/results.md), so the share that allows the most queries is chosen."""
    from rknn_ray.mechanisms.shuffle_multi import AUTO_DLAP_SHARES
    p = cfg.privacy
    if (p.model != "shuffle" or p.mechanism != "multi" or cfg.queries.s != "auto"
            or cfg.shuffle.max_messages_per_client is None or "dlap_share" in (p.options or {})):
        return ()
    return AUTO_DLAP_SHARES


def resolve_auto(cfg, data: PreparedData):
    """Replace ``queries.s: auto`` / ``rknn.k: auto`` by values chosen from public information
    (rknn_ray.labeling.autotune); returns (cfg, choice dict or None). The choice is made for one
    round's share of eps (the smallest, with rounds.count > 1; s per round, times T with
    rounds.split_queries). For the multi-message shuffle protocol s is also capped by the
    messages a client may send in a round (multi_message_s_cap)."""
    if cfg.queries.s != "auto" and cfg.rknn.k != "auto":
        return cfg, None
    from rknn_ray.labeling.autotune import choose_s_k
    # T > 1 rounds: each round releases with its own share of the budget; choose for the
    # noisiest (smallest) share, which is what that round's counts will carry
    p, count = cfg.privacy, int(cfg.rounds.count)
    eps_t, delta_t = min(round_budgets(p.eps, p.delta, count, cfg.rounds.budget_split))
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
            return choose_s_k(len(data.splits.private_y), n_pub, data.num_classes, sigma,
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
        reason += f"; chosen for one round's eps = {eps_t:.4g} of {count}" + (
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


def smoothed_labels(counts: np.ndarray, qs: QuerySet, public_emb: np.ndarray, public_truth,
                    label_type: str, neighbours: int, noise_std: float) -> tuple[Labeling, np.ndarray]:
    """Labels from released counts smoothed over the public k-NN graph (rknn_ray.labeling.denoise).

    Post-processing of the release: reads only the noisy ``counts``, the query assignment
    and public embeddings (public truth is used for the accuracy figures only). Returns
    the Labeling (public targets from the smoothed vectors) and the (N, |Y|) smoothed counts.
    """
    from rknn_ray.labeling.denoise import public_knn_graph, smooth_counts
    lab = derive_labels(counts, qs, public_truth, label_type)
    graph = public_knn_graph(public_emb, neighbours)
    sm = smooth_counts(counts, qs.assignment, graph)
    hard = hard_labels(sm)
    soft, weight = soft_labels(sm)
    targets = soft if label_type == "soft" else hard
    pub_weight = weight if label_type == "soft" else np.ones(len(hard), np.float32)
    return Labeling(lab.query_labels, lab.query_soft, lab.query_weight, targets, pub_weight, hard,
                    accuracy(hard, public_truth), lab.query_accuracy), sm


def finish_labels(cfg, data: PreparedData, counts: np.ndarray, qs: QuerySet, public_emb: np.ndarray,
                  rounds, progress=None, noise_std: float | None = None) -> tuple[Labeling, dict]:
    """Labels for the student from the released counts, smoothed over the public graph when
    ``labels.smooth`` != 1 (post-processing; rknn_ray.labeling.denoise). Returns (Labeling, info)
    where info records the noise std, the number of neighbours and why, and per-sample
    confidences (``info["confidence"]``, dropped from the report)."""
    from rknn_ray.labeling.denoise import choose_neighbours
    from rknn_ray.student.semi import label_confidence
    if noise_std is None:        # the noisiest round's per-count std (its share of eps)
        eps = min(float(r.guarantee.eps) for r in rounds) if rounds else cfg.privacy.eps
        noise_std = noise_std_per_count(cfg, data, k=cfg.rknn.k, s=qs.size, eps=eps)
    n_pub = len(data.splits.public_y)
    if cfg.labels.smooth == "auto":
        choice = choose_neighbours(len(data.splits.private_y), cfg.rknn.k, cfg.rknn.r, qs.size,
                                   n_pub, noise_std, data.num_classes)
        m, why = choice.neighbours, choice.reason
    else:
        m, why = int(cfg.labels.smooth), "labels.smooth fixed by the config"
    lab, sm = smoothed_labels(counts, qs, public_emb, data.splits.public_y, cfg.labels.type, m,
                              noise_std)
    q_eff = max(1.0, m * qs.size / n_pub)
    conf = label_confidence(sm, noise_std / np.sqrt(q_eff))
    if progress is not None:     # an accuracy only where public rows carry labels to measure
        from rknn_ray.data.splits import has_public_labels
        measured = (f"; label accuracy {lab.label_accuracy:.4f}"
                    if has_public_labels(data.splits) else "")
        progress.say(f"denoising: {m} public neighbours ({why}){measured}")
    info = {"noise_std": noise_std, "denoise": {"neighbours": m, "reason": why,
                                                "post_processing": True},
            "encoder": encoder_info(cfg), "confidence": conf}
    return lab, info


def encoder_info(cfg) -> dict:
    return {"encoder": cfg.represent.encoder, "dim": cfg.represent.dim}


def _semi_init(cfg, encoder):
    """The encoder whose backbone starts the semi student (``student.init: encoder`` and a
    contrastive encoder), else None (from scratch)."""
    simclr = getattr(encoder, "name", "") == "simclr"
    return encoder if (cfg.student.init == "encoder" and simclr) else None


def train_semi(cfg, data: PreparedData, encoder, lab: Labeling, info: dict, out_dir: str | None,
               progress=None):
    """The semi-supervised student (rknn_ray.student.semi) on every public sample, with the
    released (smoothed) labels weighted by their confidence (``info["confidence"]`` from
    :func:`finish_labels`, read only); initialized from the contrastive encoder's backbone
    when there is one and ``student.init: encoder``."""
    from rknn_ray.student.semi import SemiConfig, train_semi_student
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


def student_description(cfg, data: PreparedData, encoder, inputs: "StudentInputs") -> dict | None:
    """report.json's ``utility.student``: how the configured student learns (the semi
    student, or an MLP on the encoder's features), None for the plain student on images."""
    st = cfg.student
    if st.method == "semi":
        return {"method": "semi", "target": st.target, "threshold": st.threshold,
                "init": "encoder" if _semi_init(cfg, encoder) is not None else "scratch",
                "train_samples": int(len(data.splits.public_x))}
    return inputs.described


def feature_inputs(encoder: Encoder, splits, public_emb: np.ndarray, out_dir: str | None):
    """The student's inputs when it learns on the encoder's features (``student.input:
    features``): public and evaluation images mapped by the public encoder. Returns a
    view of ``splits`` whose public_x are the features, the evaluation features and the
    feature shape; the fitted encoder is pickled to ``out_dir/encoder.pkl`` so the
    student (encoder -> MLP) can be used on new images."""
    import dataclasses
    import os
    import pickle
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


def student_inputs(cfg, data: PreparedData, encoder, lab: Labeling, qs: QuerySet,
                   public_emb: np.ndarray, info: dict | None, out_dir: str | None,
                   config=None) -> StudentInputs:
    """The student's training set from a Labeling: public images (or the public encoder's
    features, ``student.input: features``), labelled by propagation (``labels.train_on:
    public``) or only the queries (``queries``). Used by jobs.distill on released labels,
    by rknn_ray.reference on the non-private ones and by the baselines, so all train the
    same student. ``config``: a StudentConfig in place of the config's (the baselines')."""
    from rknn_ray.student import StudentConfig
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


def fit_student(cfg, data: PreparedData, encoder, lab: Labeling, info: dict, inputs: StudentInputs,
                out_dir: str | None, progress=None, on_epoch=None):
    """Train the configured student: Ray Train (``student.trainer: ray``) or the same loop in
    this process (``local``); ``student.method: semi`` -> train_semi."""
    from rknn_ray.student import train_student, train_student_local
    if cfg.student.method == "semi":
        return train_semi(cfg, data, encoder, lab, info, out_dir, progress)
    fit = train_student if cfg.student.trainer == "ray" else train_student_local
    return fit(inputs.train_x, inputs.targets, inputs.eval_x, inputs.eval_y,
               inputs.image_shape, data.num_classes, inputs.config,
               storage_path=out_dir, checkpoint_dir=out_dir,
               sample_weight=inputs.weight, progress=on_epoch)


def train_on_labels(cfg, data: PreparedData, encoder, lab: Labeling, info: dict | None,
                    qs: QuerySet, public_emb: np.ndarray, out_dir: str | None = None,
                    progress=None, on_epoch=None, student=None) -> tuple[StudentInputs, object]:
    """student inputs -> student, the sequence every labelling ends with; returns (the
    inputs, the training result). ``student``: a StudentConfig for the plain student trained
    in this process (the baselines: their epochs and seed, one CPU worker), else the
    configured one (:func:`fit_student`: Ray Train, in this process, or the semi student)."""
    inputs = student_inputs(cfg, data, encoder, lab, qs, public_emb, info, out_dir, student)
    if student is None:
        return inputs, fit_student(cfg, data, encoder, lab, info, inputs, out_dir, progress,
                                   on_epoch)
    from rknn_ray.student import train_student_local
    return inputs, train_student_local(inputs.train_x, inputs.targets, inputs.eval_x,
                                       inputs.eval_y, inputs.image_shape, data.num_classes,
                                       inputs.config, sample_weight=inputs.weight)


def next_round_uncertain(cfg, data, rounds, query_sets: list[QuerySet], public_emb: np.ndarray,
                         seed: int, s: int | None = None) -> tuple[QuerySet, dict]:
    """Round t >= 1's queries for the driver: labels from the counts released so far
    (``finish_labels``, as the job's final labels), the interim student, then
    :func:`rknn_ray.labeling.adaptive.select_uncertain` (the stage; this is its orchestration). ``data`` is read for public quantities only (public
    labels to *measure* the interim student; n, clients and |Y| as the final labels use
    them); the selection itself sees only public embeddings and released-derived labels.
    ``s``: how many new queries (default queries.s; the driver passes this round's share)."""
    from rknn_ray.labeling.adaptive import interim_student_probs, select_uncertain
    from rknn_ray.labeling.queries import union_of_rounds
    all_qs = union_of_rounds(public_emb, query_sets)
    counts = np.concatenate([r.counts for r in rounds])
    lab, _ = finish_labels(cfg, data, counts, all_qs, public_emb, rounds, None)
    probs = interim_student_probs(public_emb, lab.public_targets, lab.public_weight,
                                  data.num_classes, cfg.labels.type, seed)
    taken = np.concatenate([q.public_index for q in query_sets])
    qs, info = select_uncertain(public_emb, probs, taken, cfg.queries.s if s is None else s, seed,
                                cfg.rounds.uncertainty, cfg.rounds.pool_factor)
    predicted = probs.argmax(axis=1)
    info.update({
        "interim_student": "mlp, in-process, on public embeddings and released-derived labels",
        "interim_agreement_released": accuracy(predicted, lab.public_hard),
        # measurement only (like every accuracy figure): public labels never reach select_uncertain
        "interim_accuracy_public_labels": accuracy(predicted, data.splits.public_y),
        "labels_accuracy_before": lab.label_accuracy,
        "post_processing": True})
    return qs, info

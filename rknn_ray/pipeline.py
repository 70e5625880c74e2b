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

from rknn_ray.data.prepared import PreparedData, partitioned, prepare_data  # noqa: F401 - the stages' entry
from rknn_ray.labeling.labels import accuracy
from rknn_ray.labeling.queries import QuerySet, select_queries
from rknn_ray.labeling.stage import (Labeling, exact_counts, round_budgets, round_query_counts,
                                     smoothed_labels)
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
                      progress=None) -> tuple[np.ndarray, "Labeling", dict]:
    """The non-private reference's labels, the one place they are made (rknn_ray.reference
    and a run's diagnostics): exact counts of ``query_sets``, labelled as a private run's
    released counts are (:func:`finish_labels`, ``all_qs`` their union) with no noise.
    NOT private: returns (exact counts, Labeling, label info)."""
    exact = exact_counts(encoder, data, query_sets, cfg.rknn.k)
    lab, info = finish_labels(cfg, data, exact.astype(float), all_qs, public_emb, list(rounds),
                              progress, noise_std=0.0)
    return exact, lab, info


# ---------------------------------------------------------------------- utility (issue 11)


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

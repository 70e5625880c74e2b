"""The multi-round loop: the only phase of a job that touches private data.

``rounds.count`` rounds on one :class:`~rknn_ray.job.session.ProtocolSession`; each round
picks its queries (:func:`select_round_queries`: k-means for the first, then
``rounds.query_selection``), spends its share of ``privacy.eps`` (rounds calibrated
together for their pld composition: rknn_ray.mechanisms.composed_rounds), is saved to
``release.npz`` (fsync'd) the moment it is released, then written once to the one ledger:
the job's rows of the persistent store, which its :class:`PrivacyLedger` is a view of
(:func:`job_ledger`). The reservation is marked *started* (a state in the ledger) before
the first client may randomize. A job that fails settles its reservation itself (nothing
is left for ``rknn-ray budget settle``, which is for a driver killed from outside): once a
report of the failed round may have reached the server (a report it opened is a release to
it), whoever died, what is left of the reservation is counted as spent; before that (a shard
lost while the shuffler collects, a shuffler's refusal, a failure between rounds) no one
could open a report of the round, and what no committed round used is returned.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.budget_store import mark_started
from rknn_ray.accounting.guarantee import guarantee_of
from rknn_ray.data.sources import dataset_sources
from rknn_ray.errors import ConfigError, RknnError, first_line
from rknn_ray.job.context import JobContext
from rknn_ray.job.release_file import release_tag_key, save_release
from rknn_ray.job.resources import shard_count
from rknn_ray.job.session import CoverShortfall, ProtocolSession
from rknn_ray.labeling.adaptive import interim_student_probs, select_uncertain
from rknn_ray.labeling.connection import Connection
from rknn_ray.labeling.labels import accuracy
from rknn_ray.labeling.queries import NEXT_ROUND_SELECTORS, QuerySet, union_of_rounds
from rknn_ray.labeling.stage import round_query_counts
from rknn_ray.mechanisms.base import Mechanism
from rknn_ray.mechanisms.composed_rounds import composes_jointly, reservation_after, round_shares
from rknn_ray.mechanisms.stage import mechanism_for
from rknn_ray.job.stages import finish_labels, released_weights, resolve_connection
from rknn_ray.labeling.stage import connection_plan
from rknn_ray.rng import NOT_PRIVATE


class ReleaseNotSaved(RknnError):
    """A round was released (and counted in the ledger) but release.npz could not be written."""


def check_dropout(cfg, data) -> None:
    """Refuse, before any budget is reserved, a simulated dropout that leaves fewer senders
    (on average) than the first round's shuffle needs: the shuffler would refuse the round
    only after every client had worked."""
    if cfg.privacy.model != "shuffle" or not cfg.shuffle.dropout:
        return
    first = round_shares(cfg, data)[0]
    mechanism = mechanism_for(cfg, data, eps=first.eps, delta=first.delta,
                              num_queries=round_query_counts(cfg)[0], eps0=first.eps0)
    floor = max(mechanism.min_senders(), cfg.shuffle.min_senders or 0)
    n = data.num_clients
    expected = int(n * (1 - cfg.shuffle.dropout))
    if expected < floor:
        raise ConfigError("shuffle.dropout", f"{cfg.shuffle.dropout:g} leaves about {expected} "
                          f"of {n} clients sending, but the round needs {floor} distinct senders "
                          "(its guarantee is calibrated for them): the shuffler would refuse it "
                          "after the whole client round",
                          "set shuffle.dropout=0, or use privacy.mechanism=multi with "
                          f"privacy.options.expected_dropout>={cfg.shuffle.dropout:g} (calibrated "
                          "for the senders that remain)")


def select_round_queries(cfg, data, t: int, public_emb: np.ndarray, rounds: list,
                         query_sets: list, size: int, first, progress=None) -> tuple:
    """Round ``t``'s queries and how they were chosen (a public record for report.json):
    ``first`` (the k-means queries) for round 0, then ``rounds.query_selection``:
    ``farthest`` from the queries taken, or ``uncertain`` (post-processing of the rounds
    released so far: an interim student's least certain public samples)."""
    if t == 0:
        return first, {"round": 0, "rule": "kmeans", "queries": first.size}
    rule = cfg.rounds.query_selection
    if rule in NEXT_ROUND_SELECTORS:
        taken = np.concatenate([q.public_index for q in query_sets])
        qs = NEXT_ROUND_SELECTORS[rule](public_emb, taken, size, cfg.run.seed + t)
        return qs, {"round": t, "rule": rule, "queries": qs.size}
    stage = (progress.stage(f"select_{t}", f"round {t + 1}: interim student, queries where it "
                            f"is least certain ({cfg.rounds.uncertainty})")
             if progress is not None else contextlib.nullcontext())
    with stage:
        qs, info = next_round_uncertain(cfg, data, rounds, query_sets, public_emb,
                                        cfg.run.seed + t, size)
    if progress is not None:
        progress.say(f"round {t + 1} queries: {qs.size} among the {info['pool']} least "
                     f"certain; uncertainty chosen {info['uncertainty_chosen']:.3f} vs "
                     f"all {info['uncertainty_all']:.3f}; interim student agrees with "
                     f"the released labels on {info['interim_agreement_released']:.3f}")
    return qs, {"round": t, "queries": qs.size, **info}


def next_round_uncertain(cfg, data, rounds, query_sets: list[QuerySet], public_emb: np.ndarray,
                         seed: int, s: int | None = None) -> tuple[QuerySet, dict]:
    """Round t >= 1's queries for the driver: labels from the counts released so far
    (``finish_labels``, as the job's final labels), the interim student, then
    :func:`rknn_ray.labeling.adaptive.select_uncertain` (the stage; this is its
    orchestration). ``data`` is read for public quantities only (public labels to *measure*
    the interim student; n, clients and |Y| as the final labels use them); the selection
    itself sees only public embeddings and released-derived labels.
    ``s``: how many new queries (default queries.s; the driver passes this round's share)."""
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



def holder_records(cfg, data) -> dict:
    """The ledger's note of a holder's reports under privacy.multi_record=each: at most
    ``holder_records`` reports per holder (the public bound), so a holder of m kept records
    is protected at m x the round's eps (``rknn-ray budget`` says so beside the round)."""
    holders = getattr(data, "holders", None) or {}
    if cfg.privacy.multi_record == "each" and holders.get("column"):
        return {"holder_records": int(holders["bound"])}
    return {}


@dataclass
class RoundPlan:
    """One round as the loop plans it: its share of the budget, its new queries and how
    they were chosen (report.json's record), and its mechanism, calibrated for both."""
    t: int
    eps: float
    delta: float
    queries: QuerySet
    selection: dict
    mechanism: Mechanism
    connection: Connection          # which k queries each record votes for (public data only)


def planned_rounds(cfg, data, public_emb: np.ndarray, first, rounds: list, query_sets: list,
                   progress=None) -> Iterator[RoundPlan]:
    """The rounds loop, written once (the job's :func:`private_rounds` and
    benchmarks/adaptive_rounds.py run it): for each of ``rounds.count`` rounds, its
    (eps, delta) share (:func:`rknn_ray.mechanisms.composed_rounds.round_shares`: under the
    pld accountant a single-message shuffle job's rounds are calibrated together), its
    queries (:func:`select_round_queries`; ``first`` for round 0), its mechanism and its
    connection plan (``rknn.connection``, resolved once from round 0's
    queries; with ``rknn.reweight: released`` priced from the rounds released so far).
    ``rounds`` and ``query_sets`` are the caller's lists: it releases each plan and appends
    the released round and the plan's queries before asking for the next, whose selection
    reads them."""
    shares = round_shares(cfg, data)
    if progress is not None and shares[0].together:
        eps0 = ("local eps0 " + ", ".join(f"{s.eps0:.4g}" for s in shares) + ", "
                if shares[0].eps0 is not None else "")
        progress.say(f"rounds calibrated together (pld accountant): {eps0}each round's own eps "
                     f"{', '.join(f'{s.eps:.4g}' for s in shares)}; their composition is at most "
                     f"eps={cfg.privacy.eps:g} at delta={cfg.privacy.delta:g}")
    elif progress is not None and composes_jointly(cfg):
        progress.say(f"rounds not calibrated together: at T={len(shares)} and delta="
                     f"{cfg.privacy.delta:g} their pld composition is about their sum, so each "
                     "round is calibrated for its share")
    sizes = round_query_counts(cfg)
    rule, auto, plans = None, None, []
    for t, share in enumerate(shares):
        if len(rounds) != t or len(query_sets) != t:
            raise RuntimeError(f"round {t + 1} planned with {len(rounds)} released rounds and "
                               f"{len(query_sets)} query sets: append each released round and "
                               "its queries before the next plan")
        qs, selection = select_round_queries(cfg, data, t, public_emb, rounds, query_sets,
                                             sizes[t], first, progress)
        if t == 0:      # rknn.connection (auto: public information only), once
            rule, auto = resolve_connection(cfg, data, public_emb, qs)
            if auto is not None and progress is not None:
                progress.say(f"auto connection: {rule} ({auto['reason']})")
        weights = (released_weights(cfg, data, public_emb, rounds, query_sets, plans)
                   if t and rule != "reverse_knn" and cfg.rknn.reweight == "released"
                   else None)       # post-processing of the rounds released so far
        connection = connection_plan(cfg, public_emb, qs.features, rule, weights)
        plans.append(connection)
        selection["connection"] = {**connection.describe(), "configured": cfg.rknn.connection,
                                   "reweight": "released" if weights is not None else "public",
                                   **({"auto": auto} if auto is not None else {}),
                                   **({"prices": connection.prices.tolist()}
                                      if connection.prices is not None else {})}
        yield RoundPlan(t, share.eps, share.delta, qs, selection,
                        mechanism_for(cfg, data, eps=share.eps, delta=share.delta,
                                      num_queries=qs.size, eps0=share.eps0),
                        connection)


def job_ledger(ctx: JobContext) -> PrivacyLedger:
    """The job's ledger: a view over its rows of the persistent store (each release is
    committed into its reservation), bounded by privacy.budget_* when set (else the job's
    eps), checked before every release."""
    p = ctx.cfg.privacy
    budget_eps = p.eps if p.budget_eps is None else min(p.budget_eps, p.eps)
    budget_delta = p.delta if p.budget_delta is None else min(p.budget_delta, p.delta)
    return PrivacyLedger(budget_eps=budget_eps, budget_delta=budget_delta or None,
                         accountant=p.accountant, store=ctx.store, identity=ctx.identity,
                         job_id=ctx.job_id)


def private_rounds(ctx: JobContext) -> tuple[list, list, PrivacyLedger, list]:
    """Every private round of the job on one ProtocolSession; returns (rounds, their
    QuerySets, the job's ledger, the rounds' mechanisms)."""
    cfg, store, progress = ctx.cfg, ctx.store, ctx.progress
    p = cfg.privacy
    ledger = job_ledger(ctx)
    count = cfg.rounds.count
    rounds, query_sets, selections, mechanisms = [], [], [], []
    in_round = None       # the round whose clients may have randomized, until it is committed
    session = None
    tag_key = release_tag_key(store)           # release.npz is tagged under the ledger's key
    try:
        mark_started(store, ctx.identity, ctx.job_id)       # from here a release may happen
        if cfg.cluster.holders == "remote":     # holders off the cluster: the server only
            # loaded only for cluster.holders: remote (the holder program's accountant, HTTPS)
            from rknn_ray.job.remote_session import RemoteSession
            with progress.stage("actors", "starting the server (holders run off the cluster)"):
                session = RemoteSession(cfg, ctx.data, ctx.job_id, ctx.out_dir, ctx.key_file,
                                        progress, ctx.parties)
        else:
            with progress.stage("actors", f"starting {shard_count(cfg)} client shards and the server"):
                session = ProtocolSession(cfg, dataset_sources(cfg, ctx.data), ctx.job_id,
                                          ctx.key_file, progress, ctx.parties)
        with session:
            for plan in planned_rounds(cfg, ctx.data, ctx.public_emb, ctx.first_queries, rounds,
                                       query_sets, progress):
                t, qs, mechanism = plan.t, plan.queries, plan.mechanism
                selections.append(plan.selection)
                with progress.stage(f"round_{t}", f"round {t + 1}/{count}: "
                                    f"{p.model}/{p.mechanism} at eps={plan.eps:.4g}"):
                    ledger.check(guarantee_of(mechanism))  # refused: none worked
                    in_round = t    # from here every failure keeps the round counted: a report
                    try:            # the server opened, or may open, is a release to it
                        rounds.append(session.run_round(t, mechanism, ctx.encoder, qs.features,
                                                        ledger, record_release=False,
                                                        connection=plan.connection))
                    except CoverShortfall:          # recorded at its true cost, not labelled
                        in_round = None
                        raise
                query_sets.append(qs)
                mechanisms.append(mechanism)
                note = NOT_PRIVATE if cfg.run.rng != "secure" else "released"
                lost = None
                try:        # durable (fsync'd) on disk before the ledger commits the round
                    save_release(ctx.out_dir, ctx.job_id, ctx.release_key or ctx.identity,
                                 rounds, query_sets, selections, key=tag_key)
                except OSError as exc:
                    lost = exc
                    note = (f"released, but release.npz could not be saved ({first_line(exc)}): "
                            "the counts are lost; their eps stays counted")
                done = rounds[-1]       # the round's one ledger write, into the reservation
                ledger.record_spent(done.guarantee, round_id=t, note=note,
                                    messages=done.messages, clients=done.clients,
                                    reserve_left=reservation_after(cfg, ctx.data, t),
                                    **holder_records(cfg, ctx.data))
                in_round = None
                if lost is None and t + 1 < count:
                    session.prepare_next_round()    # the shards' keys, while queries are picked
                if lost is not None:
                    raise ReleaseNotSaved(f"round {t + 1} was released and its eps={rounds[-1].guarantee.eps:g} "
                                          f"is counted in the ledger, but it could not be saved: "
                                          f"{str(lost).strip().splitlines()[0]}") from None
    except BaseException as exc:
        what = f"job failed ({type(exc).__name__}: {first_line(exc)})"
        # a report the server may have opened is a release to it; until one reached it, the
        # round's reports were sealed for a server that never saw them
        seen = in_round is not None and (session is None or session.reached_server)
        if seen:
            with contextlib.suppress(AttributeError, TypeError):
                exc.budget_kept = True      # incomplete.json says the eps stays counted
        try:
            if seen:
                store.spend_job(ctx.identity, ctx.job_id, what + f"; round {in_round + 1}'s "
                                "reports may have reached the server: the reservation is counted "
                                "as spent (a release may have happened), settled by the job")
            elif in_round is not None:
                store.close_job(ctx.identity, ctx.job_id, what + f"; no report of round "
                                f"{in_round + 1} reached the server: nothing was released; "
                                f"{len(rounds)} round(s) released, the rest of the reservation "
                                "returned")
            else:               # every round so far is committed; nothing else can be out
                store.close_job(ctx.identity, ctx.job_id, what + f"; {len(rounds)} round(s) "
                                "released, the rest of the reservation returned (no client of "
                                "a later round randomized)")
        except Exception:       # a ledger that cannot be written keeps the reservation counted
            pass
        raise
    store.close_job(ctx.identity, ctx.job_id, f"job finished: {len(rounds)} round(s) released")
    return rounds, query_sets, ledger, mechanisms

"""The multi-round loop: the only phase of a job that touches private data.

``rounds.count`` rounds on one :class:`~rknn_ray.job.session.ProtocolSession`; each round
picks its queries (:func:`select_round_queries`: k-means for the first, then
``rounds.query_selection``), spends its share of ``privacy.eps``, is saved to
``release.npz`` (fsync'd) the moment it is released, then written once to the one ledger:
the job's rows of the persistent store, which its :class:`PrivacyLedger` is a view of
(:func:`job_ledger`). The reservation is marked *started* (a state in the ledger) before
the first client may randomize. A failure once a round's clients may have randomized keeps
the reservation counted, whoever died (a report the server opened is a release to it);
one between rounds, or before the first, returns what no round has used.
"""
from __future__ import annotations

import contextlib

import numpy as np

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.budget_store import mark_started
from rknn_ray.errors import ConfigError, RknnError, first_line
from rknn_ray.job.context import JobContext
from rknn_ray.job.release_file import release_tag_key, save_release
from rknn_ray.job.session import CoverShortfall, ProtocolSession
from rknn_ray.pipeline import (connection_plan, dataset_sources, mechanism_for,
                               next_round_uncertain, released_weights, resolve_connection,
                               round_budgets, round_query_counts)
from rknn_ray.labeling.queries import NEXT_ROUND_SELECTORS
from rknn_ray.rng import NOT_PRIVATE


class ReleaseNotSaved(RknnError):
    """A round was released (and counted in the ledger) but release.npz could not be written."""


def check_dropout(cfg, data) -> None:
    """Refuse, before any budget is reserved, a simulated dropout that leaves fewer senders
    (on average) than the first round's shuffle needs: the shuffler would refuse the round
    only after every client had worked."""
    if cfg.privacy.model != "shuffle" or not cfg.shuffle.dropout:
        return
    p = cfg.privacy
    eps0, delta0 = round_budgets(p.eps, p.delta, cfg.rounds.count, cfg.rounds.budget_split)[0]
    mechanism = mechanism_for(cfg, data, eps=eps0, delta=delta0,
                              num_queries=round_query_counts(cfg)[0])
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
    budgets = ctx.round_budgets()
    sizes = ctx.round_sizes()                  # new queries per round
    rounds, query_sets, selections, mechanisms, plans = [], [], [], [], []
    in_round = None       # the round whose clients may have randomized, until it is committed
    tag_key = release_tag_key(store)           # release.npz is tagged under the ledger's key
    try:
        mark_started(store, ctx.identity, ctx.job_id)       # from here a release may happen
        with progress.stage("actors", f"starting {cfg.cluster.shards} client shards and the server"):
            session = ProtocolSession(cfg, dataset_sources(cfg, ctx.data), ctx.job_id,
                                      ctx.key_file, progress, ctx.parties,
                                      declared_clients=(ctx.data.num_clients if getattr(
                                          ctx.data, "holders_declared", False) else None))
        with session:
            for t, (eps_t, _delta_t) in enumerate(budgets):
                qs, selection = select_round_queries(cfg, ctx.data, t, ctx.public_emb, rounds,
                                                     query_sets, sizes[t], ctx.first_queries,
                                                     progress)
                if t == 0:      # rknn.connection (auto: public information only), once
                    rule, auto = resolve_connection(cfg, ctx.data, ctx.public_emb, qs)
                    if auto is not None:
                        progress.say(f"auto connection: {rule} ({auto['reason']})")
                weights = (released_weights(cfg, ctx.data, ctx.public_emb, rounds, query_sets,
                                            plans)
                           if t and rule != "reverse_knn" and cfg.rknn.reweight == "released"
                           else None)       # post-processing of the rounds released so far
                plan = connection_plan(cfg, ctx.public_emb, qs.features, rule, weights)
                plans.append(plan)
                selection["connection"] = {**plan.describe(), "configured": cfg.rknn.connection,
                                           "reweight": "released" if weights is not None
                                           else "public",
                                           **({"auto": auto} if auto is not None else {}),
                                           **({"prices": plan.prices.tolist()}
                                              if plan.prices is not None else {})}
                selections.append(selection)
                mechanism = ctx.round_mechanism(t, qs.size)
                with progress.stage(f"round_{t}", f"round {t + 1}/{len(budgets)}: "
                                    f"{p.model}/{p.mechanism} at eps={eps_t:.4g}"):
                    ledger.check(mechanism.guarantee(), mechanism.event())  # refused: none worked
                    in_round = t    # from here every failure keeps the round counted: a report
                    try:            # the server opened, or may open, is a release to it
                        rounds.append(session.run_round(t, mechanism, ctx.encoder, qs.features,
                                                        ledger, record_release=False,
                                                        connection=plan))
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
                ledger.record_spent(done.guarantee, round_id=t, event=done.event, note=note,
                                    messages=done.messages, clients=done.clients)
                in_round = None
                if lost is None and t + 1 < len(budgets):
                    session.prepare_next_round()    # the shards' keys, while queries are picked
                if lost is not None:
                    raise ReleaseNotSaved(f"round {t + 1} was released and its eps={rounds[-1].guarantee.eps:g} "
                                          f"is counted in the ledger, but it could not be saved: "
                                          f"{str(lost).strip().splitlines()[0]}") from None
    except BaseException as exc:
        what = f"job failed ({type(exc).__name__}: {first_line(exc)})"
        if in_round is not None:
            with contextlib.suppress(AttributeError, TypeError):
                exc.budget_kept = True      # incomplete.json says the eps stays counted
        try:
            if in_round is not None:
                store.mark_failed(ctx.identity, ctx.job_id, what + f"; round {in_round + 1}'s "
                                  "clients may have randomized: reservation kept, counted as spent "
                                  "(a release may have happened)")
            else:               # every round so far is committed; nothing else can be out
                store.close_job(ctx.identity, ctx.job_id, what + f"; {len(rounds)} round(s) "
                                "released, the rest of the reservation returned (no client of "
                                "a later round randomized)")
        except Exception:       # a ledger that cannot be written keeps the reservation counted
            pass
        raise
    store.close_job(ctx.identity, ctx.job_id, f"job finished: {len(rounds)} round(s) released")
    return rounds, query_sets, ledger, mechanisms

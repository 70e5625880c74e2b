"""Record-level private knowledge distillation, end to end on Ray.

    python -m jobs.distill --config jobs/configs/digits_central.yaml \
        [--set privacy.eps=0.5 ...] [--out runs/my-run] [--overwrite]

Works locally (starts a loopback Ray instance) and under ``ray job submit`` (joins
the cluster through RAY_ADDRESS). Writes a run folder: config.yaml, report.json,
ledger.json, labels.parquet, student.pt and summary.png. ``rounds.count`` > 1 runs
several private rounds on the same actors (see ``run``); rounds after the first pick
their queries by ``rounds.query_selection`` (``farthest``, or ``uncertain``: where an
interim student fitted on the labels released so far is least certain, rknn_ray/adaptive.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa
import yaml

from rknn_ray import __version__
from rknn_ray.config import load_config, validate_resources
from rknn_ray.errors import PrivacyBudgetError, RknnError
from rknn_ray.errors import ConfigError
from rknn_ray.runio import (mark_incomplete, prepare_run_dir, remove_train_storage, write_json,
                            write_parquet, write_text)

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "digits_central.yaml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (jobs/configs/*.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set privacy.eps=0.5 (repeatable)")
    ap.add_argument("--out", default=None, help="run folder (default runs/<name>-<time>)")
    ap.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    ap.add_argument("--discard-release", action="store_true",
                    help="with --overwrite: also delete an unfinished run's saved release.npz "
                         "(its budget stays spent; --resume RUN would have finished it)")
    ap.add_argument("--resume", metavar="RUN", default=None,
                    help="finish a run folder whose release.npz exists (labels, student, report) "
                         "with its own config.yaml: no new private round, no budget spent; "
                         "--set may change student.*, labels.*, cluster.*, run.progress only")
    ap.add_argument("--key-file", default=None,
                    help="server X25519 key file (default: a fresh key pair per job)")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bars: plain stage lines, at most one progress line per 5 s "
                         "(without a terminal this is the default; run.progress=false: silent)")
    ap.add_argument("--insecure-seeded", action="store_true",
                    help="allow run.rng=seeded: a reproducible simulation that is NOT private "
                         "(every secret and the noise follow from run.seed)")
    ap.add_argument("--ledger", default=None,
                    help="privacy ledger (SQLite) that keeps each dataset's budget across jobs "
                         "(default: $RKNN_RAY_LEDGER or ~/.local/share/rknn-ray/ledger.sqlite)")
    return ap.parse_args(argv)


def run(cfg, out_dir: str, key_file: str | None = None, progress=None,
        shard_faults: dict | None = None, ledger_path: str | None = None,
        resume: bool = False, party_faults: dict | None = None) -> dict:
    """Run the job for a validated ``cfg`` into the prepared ``out_dir``; returns the report.

    ``cfg.rounds.count`` rounds on one set of actors (shards, server key, shufflers live
    for the whole job); each round spends its share of ``privacy.eps``, is one ledger
    entry, and is saved to ``release.npz`` the moment it is released. ``resume=True``
    finishes labels, student and report from the saved release without a new private
    round (and without touching the budget). A failure leaves ``incomplete.json``.
    """
    import ray

    from jobs.progress import Progress
    from jobs.release_file import load_release
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.accounting.budget_store import BudgetStore, job_default_budget
    from rknn_ray.accounting.source_identity import job_source, legacy_release_name
    from rknn_ray.errors import DataError
    from rknn_ray.pipeline import fit_queries, prepare_data, resolve_auto, round_query_counts

    progress = progress or Progress(cfg.run.progress)
    with progress.stage("data", f"loading {cfg.data.dataset} and partitioning"):
        data = prepare_data(cfg)         # fails fast on missing files / bad data, writes nothing
    cfg, auto_choice = resolve_auto(cfg, data)     # queries.s / rknn.k: auto (public info only)
    if auto_choice:
        progress.say(f"auto: s = {auto_choice['s']}, k = {auto_choice['k']} ({auto_choice['reason']})")
    sp = data.splits
    store = BudgetStore(ledger_path)
    # the budget is the records' source's (any split / seed / partition); the release is this
    # job's private part as split and partitioned (resume must find the same one)
    identity, described, release_key = job_source(store, cfg, data)
    fit_s = round_query_counts(cfg)[0]
    if resume:
        encoder, public_emb, _ = fit_queries(cfg, data, progress.say)   # public only, deterministic
        job_id, saved_identity, rounds, query_sets = load_release(out_dir, public_emb)
        # run folders from before keyed names hold the bare digest: still recognized
        if saved_identity not in (release_key, legacy_release_name(cfg, data)):
            raise DataError(f"{out_dir}/release.npz was released from other private data than "
                            f"this config loads, or recorded in another ledger ({saved_identity} vs "
                            f"{release_key}). Fix: resume with the run folder's own config.yaml, "
                            "unchanged, and the ledger the job ran with (--ledger)")
        ledger = PrivacyLedger(accountant=cfg.privacy.accountant)
        for t, r in enumerate(rounds):
            ledger.record(r.guarantee, round_id=t, event=r.event, messages=r.messages,
                          clients=r.clients)
        budget = store.budget(identity) or (float("nan"), float("nan"))
        progress.say(f"resuming from release.npz: {len(rounds)} round(s) already released; "
                     "no new private round, no budget spent")
    else:
        check_dropout(cfg, data)             # a round sure to be refused costs no budget
        from jobs.protocol import new_job_id
        job_id = new_job_id()
        p = cfg.privacy
        # the budget lasts across jobs: reserve this job's whole spend before anything randomizes
        budget = store.reserve(identity, described, job_id, p.eps, p.delta,
                               job_default_budget(p, len(sp.private_y)), accountant=p.accountant,
                               records=len(sp.private_y))
        try:
            progress.say(f"privacy budget of {described}: eps={budget[0]:g}, delta={budget[1]:g}; "
                         f"this job reserved eps={p.eps:g} (ledger {store.path})")
            write_text(os.path.join(out_dir, "config.yaml"),
                       yaml.safe_dump(cfg.to_dict(), sort_keys=False))
            progress.say(f"private {len(sp.private_y)} records in {data.num_clients} clients, "
                         f"public {len(sp.public_y)}, evaluation {len(sp.eval_y)}")
            with progress.stage("queries", f"encoder + k-means: s = {fit_s} queries"
                                + (f" (of {cfg.queries.s}, split over {cfg.rounds.count} rounds)"
                                   if cfg.rounds.split_queries else "")):
                encoder, public_emb, first_qs = fit_queries(cfg, data, progress.say)
            started = _start_ray()
        except BaseException as exc:      # no client has randomized yet: nothing was released
            store.close_job(identity, job_id, f"job ended before any client randomized "
                            f"({type(exc).__name__}: {_first_line(exc)}); reservation returned")
            raise
    if resume:
        started = _start_ray()
    try:
        if not resume:
            rounds, query_sets, ledger = _private_rounds(cfg, data, encoder, public_emb, first_qs,
                                                         store, identity, job_id, out_dir, key_file,
                                                         progress, shard_faults, party_faults,
                                                         release_key=release_key)
        return _finish(cfg, data, encoder, rounds, query_sets, ledger, public_emb, store, identity,
                       described, budget, job_id, out_dir, progress, auto_choice)
    finally:
        if started:
            ray.shutdown()


def _start_ray() -> bool:
    """ensure_ray, then the job's own SIGINT/SIGTERM handlers again (ray.init installs its own)."""
    from jobs import signals
    from jobs.ray_env import ensure_ray
    try:
        started = ensure_ray()             # one Ray for the whole job, after the budget check
    except SystemExit as exc:              # Ray's own SIGTERM handler, while ray.init runs
        if exc.code == signals.signal.SIGTERM:
            raise signals.JobInterrupted(signals.signal.SIGTERM) from None
        raise
    signals.install()
    return started


def check_dropout(cfg, data) -> None:
    """Refuse, before any budget is reserved, a simulated dropout that leaves fewer senders
    (on average) than the first round's shuffle needs: the shuffler would refuse the round
    only after every client had worked."""
    if cfg.privacy.model != "shuffle" or not cfg.shuffle.dropout:
        return
    from rknn_ray.mechanisms import build
    from rknn_ray.pipeline import mechanism_params, round_budgets, round_query_counts
    p = cfg.privacy
    eps0, delta0 = round_budgets(p.eps, p.delta, cfg.rounds.count, cfg.rounds.budget_split)[0]
    params = dataclasses.replace(mechanism_params(cfg, data, eps=eps0, delta=delta0),
                                 num_queries=round_query_counts(cfg)[0])
    floor = max(build(p.model, p.mechanism, params).min_senders(), cfg.shuffle.min_senders or 0)
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


def _private_rounds(cfg, data, encoder, public_emb, first_qs, store, identity, job_id, out_dir,
                    key_file, progress, shard_faults, party_faults=None, release_key=None):
    """The only phase that touches private data: T rounds on one ProtocolSession.

    Each release is committed to the persistent ledger and saved to release.npz at once.
    On a failure the job's unreleased reservation is returned, unless the failure came
    where a release may already have happened (then it stays counted).
    """
    from jobs.protocol import CoverShortfall, PartyFailure, ProtocolSession
    from jobs.release_file import save_release
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.accounting.events import event_to_dict
    from rknn_ray.mechanisms import build
    from rknn_ray.pipeline import (dataset_sources, mechanism_params, round_budgets,
                                   round_query_counts)
    from rknn_ray.queries import NEXT_ROUND_SELECTORS

    p = cfg.privacy
    budget_eps = p.eps if p.budget_eps is None else min(p.budget_eps, p.eps)
    budget_delta = p.delta if p.budget_delta is None else min(p.budget_delta, p.delta)
    ledger = PrivacyLedger(budget_eps=budget_eps, budget_delta=budget_delta or None,
                           accountant=p.accountant)
    budgets = round_budgets(p.eps, p.delta, cfg.rounds.count, cfg.rounds.budget_split)
    sizes = round_query_counts(cfg)            # new queries per round
    rounds, query_sets, selections = [], [], []
    released = False
    try:
        from rknn_ray.accounting.budget_store import mark_started
        mark_started(store, identity, job_id)       # from here a release may happen
        with progress.stage("actors", f"starting {cfg.cluster.shards} client shards and the server"):
            session = ProtocolSession(cfg, dataset_sources(cfg, data), job_id, key_file, progress,
                                      shard_faults, party_faults)
        with session:
            for t, (eps_t, delta_t) in enumerate(budgets):
                if t == 0:
                    qs = first_qs
                    selections.append({"round": 0, "rule": "kmeans", "queries": qs.size})
                elif cfg.rounds.query_selection in NEXT_ROUND_SELECTORS:
                    taken = np.concatenate([q.public_index for q in query_sets])
                    qs = NEXT_ROUND_SELECTORS[cfg.rounds.query_selection](
                        public_emb, taken, sizes[t], cfg.run.seed + t)
                    selections.append({"round": t, "rule": cfg.rounds.query_selection,
                                       "queries": qs.size})
                else:                  # uncertain: post-processing of the rounds released so far
                    from rknn_ray.pipeline import next_round_uncertain
                    with progress.stage(f"select_{t}", f"round {t + 1}: interim student, queries "
                                        f"where it is least certain ({cfg.rounds.uncertainty})"):
                        qs, info = next_round_uncertain(cfg, data, rounds, query_sets, public_emb,
                                                        cfg.run.seed + t, sizes[t])
                    selections.append({"round": t, "queries": qs.size, **info})
                    progress.say(f"round {t + 1} queries: {qs.size} among the {info['pool']} least "
                                 f"certain; uncertainty chosen {info['uncertainty_chosen']:.3f} vs "
                                 f"all {info['uncertainty_all']:.3f}; interim student agrees with "
                                 f"the released labels on {info['interim_agreement_released']:.3f}")
                params = dataclasses.replace(mechanism_params(cfg, data, eps=eps_t, delta=delta_t),
                                             num_queries=qs.size)     # this round's s
                mechanism = build(p.model, p.mechanism, params)
                with progress.stage(f"round_{t}", f"round {t + 1}/{len(budgets)}: "
                                    f"{p.model}/{p.mechanism} at eps={eps_t:.4g}"):
                    try:
                        rounds.append(session.run_round(t, mechanism, encoder, qs.features, ledger))
                    except CoverShortfall as exc:   # opened, so spent: recorded, not labelled
                        store.commit_round(identity, job_id, t, exc.guarantee.eps,
                                           exc.guarantee.delta, event_to_dict(exc.event),
                                           note="refused for labelling: too few reports opened "
                                                "to meet the target; recorded at its true cost",
                                           accounting=exc.guarantee.accounting)
                        raise
                    except PrivacyBudgetError:      # refused before the server released anything
                        raise
                    except PartyFailure as exc:     # the party knows whether counts may be out
                        released = exc.released
                        raise
                    except BaseException:
                        released = True             # unknown: count it as released
                        raise
                query_sets.append(qs)
                released = True         # until the ledger commits it, a failure keeps it counted
                note, lost = _rng_marks(cfg).get("warning", "released"), None
                try:        # durable (fsync'd) on disk before the ledger commits the round
                    save_release(out_dir, job_id, release_key or identity, rounds, query_sets,
                                 selections)
                except OSError as exc:
                    lost = exc
                    note = (f"released, but release.npz could not be saved ({_first_line(exc)}): "
                            "the counts are lost; their eps stays counted")
                store.commit_round(identity, job_id, t, rounds[-1].guarantee.eps,
                                   rounds[-1].guarantee.delta, event_to_dict(rounds[-1].event),
                                   note=note, accounting=rounds[-1].guarantee.accounting)
                released = False
                if lost is not None:
                    raise ReleaseNotSaved(f"round {t + 1} was released and its eps={rounds[-1].guarantee.eps:g} "
                                          f"is counted in the ledger, but it could not be saved: "
                                          f"{str(lost).strip().splitlines()[0]}") from None
    except BaseException as exc:
        what = f"job failed ({type(exc).__name__}: {_first_line(exc)})"
        try:
            if released:
                store.mark_failed(identity, job_id, what + "; reservation kept: a release may "
                                  "have happened")
            else:               # every round so far is committed; nothing else can be out
                store.close_job(identity, job_id, what + f"; {len(rounds)} round(s) released, "
                                "the rest of the reservation returned")
        except Exception:       # a ledger that cannot be written keeps the reservation counted
            pass
        raise
    store.close_job(identity, job_id, f"job finished: {len(rounds)} round(s) released")
    return rounds, query_sets, ledger


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else ""


def release_error_bound(details: dict, num_classes: int, beta: float = 0.05) -> float:
    """The central release's (eta, beta) error bound for the plots, from the mechanism's own
    description (its scale and its noise: discrete or continuous)."""
    from rknn_ray.mechanisms.central import central_error_bound
    return central_error_bound(details["scale"], num_classes, beta, details["noise"])


def _finish(cfg, data, encoder, rounds, query_sets, ledger, public_emb, store, identity,
            described, budget, job_id, out_dir, progress, auto_choice=None) -> dict:
    """Labels, the student and the run folder, from released counts only (plus diagnostics if asked)."""
    from jobs.release_file import load_selections
    from rknn_ray.pipeline import exact_answers, finish_labels, fit_student, student_inputs
    from rknn_ray.plots import run_summary_png
    from rknn_ray.queries import union_of_rounds

    sp = data.splits
    all_qs = union_of_rounds(public_emb, query_sets)
    counts = np.concatenate([r.counts for r in rounds])
    with progress.stage("labels", "labels from the released counts"):
        lab, utility = finish_labels(cfg, data, counts, all_qs, public_emb, rounds, progress)
    utility["auto"] = auto_choice
    progress.say(f"label accuracy {lab.label_accuracy:.4f} (public labels vs released)")
    ref = exact = None
    if cfg.run.diagnostics:     # simulation only: exact private counts, never released
        exact = np.concatenate([exact_answers(encoder, data, q, cfg.rknn.k).counts()
                                for q in query_sets])
        ref, _ = finish_labels(cfg, data, exact.astype(float), all_qs, public_emb, rounds, None,
                               noise_std=0.0)
        progress.say(f"[diagnostics, NOT private] non-private label accuracy "
                     f"{ref.label_accuracy:.4f}")
    st = cfg.student
    inputs = student_inputs(cfg, data, encoder, lab, all_qs, public_emb, utility, out_dir)
    train_x = inputs.train_x
    how = f"Ray Train, {st.num_workers} workers" if st.trainer == "ray" else "in this process"
    with progress.stage("student", f"student: {how}, "
                        f"{st.epochs} epochs on {len(train_x)} labelled samples"), \
            progress.epochs(st.epochs) as on_epoch:        # live, from Train's per-epoch reports
        student = fit_student(cfg, data, encoder, lab, utility, inputs, out_dir, progress, on_epoch)
    progress.say(f"student test accuracy {student.test_accuracy:.4f}")
    if hasattr(encoder, "save"):              # a learned encoder travels with the run
        utility["encoder"] = {**encoder.describe(), "file": os.path.basename(encoder.save(out_dir))}

    truth_q = sp.public_y[all_qs.public_index]     # public labels: measurement only
    g = rounds[-1].guarantee
    eps_spent, delta_spent = ledger.spent()
    timings = dict(progress.timings)
    for stage in ("clients", "shuffle", "server_open"):
        timings[stage] = sum(r.timings.get(stage, 0.0) for r in rounds)
    for t, r in enumerate(rounds):
        timings.update({f"round_{t}_{k}": v for k, v in r.timings.items()})
    report = {
        "accuracy": {"labels": lab.label_accuracy, "student": student.test_accuracy,
                     "nonprivate_labels": None, "query_labels": lab.query_accuracy},
        "privacy": {"model": g.model, "mechanism": g.mechanism, "eps": eps_spent,
                    "delta": delta_spent, "unit": g.unit, "neighbour": g.neighbour,
                    "rounds": [r.guarantee.to_dict() for r in rounds], "ledger": ledger.to_dict(),
                    "details": [r.mechanism for r in rounds],
                    "budget": {"dataset": identity, "description": described,
                               "eps": budget[0], "delta": budget[1],
                               "spent_eps": store.spent(identity).eps, "ledger": store.path},
                    "release_file": "release.npz", **_rng_marks(cfg)},
        "counts": {**data.public_counts(), "queries": all_qs.size,
                   "messages": int(sum(r.messages for r in rounds)),
                   "received": int(sum(r.received for r in rounds)),
                   "rejected": _sum_dicts(r.rejected for r in rounds),
                   "authenticated_senders": [r.authenticated_senders for r in rounds],
                   "missing": [r.missing for r in rounds],
                   "rounds": len(rounds)},
        "split": sp.describe(),
        "student": {"test_accuracy": student.test_accuracy, "epochs": student.epochs,
                    "trainer": st.trainer,
                    "num_workers": student.num_workers, "device": student.device,
                    "checkpoint": student.checkpoint_path, "train_samples": int(len(train_x))},
        "timings_s": timings,
        "selection": load_selections(out_dir),      # per round: rule, pool, uncertainty
        "utility": {k: v for k, v in utility.items() if k != "confidence"},
        "rng": cfg.run.rng, "version": __version__, "job_id": job_id,
        "config": cfg.to_dict(),
    }
    if any(r.shuffler is not None for r in rounds):
        report["shuffler"] = [r.shuffler for r in rounds]
    from jobs.placement import merge_placements       # party -> the Ray nodes it ran on
    report["placement"] = merge_placements(r.placement for r in rounds)
    labels_table = pa.table({
        "public_index": np.arange(len(sp.public_y)), "query": all_qs.assignment,
        "label": lab.public_hard, "true_label": sp.public_y, "weight": lab.public_weight,
        "soft": pa.array(list(lab.query_soft[all_qs.assignment]), type=pa.list_(pa.float32())),
    })
    write_parquet(os.path.join(out_dir, "labels.parquet"), labels_table)
    write_json(os.path.join(out_dir, "ledger.json"), ledger.to_dict())
    details = rounds[-1].mechanism
    bound = release_error_bound(details, data.num_classes) if g.model == "central" else None
    correct = lab.query_labels == truth_q
    run_summary_png(os.path.join(out_dir, "summary.png"), report, student.history,
                    count_gaps(counts, truth_q), correct, bound, "released")
    if cfg.run.diagnostics:
        report["diagnostics"] = write_diagnostics(os.path.join(out_dir, "diagnostics"), report,
                                                  student.history, ref, exact, truth_q,
                                                  correct, bound, len(sp.public_y))
        # PRIVATE (depends on the label-driven partition): only in the diagnostics
        report["diagnostics"]["records_dropped_by_bound"] = data.records_dropped()
    remove_train_storage(out_dir)         # Train's student-*/ copies, an interrupted attempt's too
    write_json(os.path.join(out_dir, "report.json"), report)   # last: marks a complete run
    if os.path.exists(os.path.join(out_dir, "incomplete.json")):   # a resumed run is complete now
        os.unlink(os.path.join(out_dir, "incomplete.json"))
    return report


DIAGNOSTICS_README = """NOT PRIVATE. Everything in this folder was computed from the private data WITHOUT
noise (run.diagnostics: true, a simulation setting): the labels the same pipeline gives
with exact counts, and plots of exact per-query counts. No privacy guarantee covers it.
Do not share this folder with anyone who may not see the private data; share the run
folder without it.
"""


def count_gaps(counts: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per query: count of the (public) true class minus the best other class."""
    rows = np.arange(counts.shape[0])
    others = counts.astype(float).copy()
    others[rows, truth] = -np.inf
    return counts[rows, truth] - others.max(axis=1)


def write_diagnostics(folder: str, report: dict, history, ref, exact, truth_q, correct, bound,
                      num_public: int) -> dict:
    """The non-private reference, in its own folder with a README that says so; the folder
    is owner-only (0700), since what it holds was computed from private data without noise."""
    from rknn_ray.plots import run_summary_png
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    write_text(os.path.join(folder, "README.txt"), DIAGNOSTICS_README)
    write_parquet(os.path.join(folder, "nonprivate_labels.parquet"), pa.table({
        "public_index": np.arange(num_public), "nonprivate_label": ref.public_hard}))
    diag = {"private": False, "folder": "diagnostics",
            "nonprivate_labels": ref.label_accuracy, "nonprivate_query_labels": ref.query_accuracy}
    run_summary_png(os.path.join(folder, "summary_nonprivate.png"),
                    {**report, "diagnostics": diag}, history, count_gaps(exact, truth_q),
                    correct, bound, "non-private")
    return diag


def _rng_marks(cfg) -> dict:
    """report.json's privacy section: ``private`` is False (with why) for a seeded simulation."""
    from rknn_ray.rng import NOT_PRIVATE
    return {"private": True} if cfg.run.rng == "secure" else {"private": False,
                                                              "warning": NOT_PRIVATE}


def _sum_dicts(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def check_rng_consent(cfg, insecure_seeded: bool) -> None:
    """A seeded run is predictable: it runs only when the command line says so, and says so."""
    from rknn_ray.rng import NOT_PRIVATE
    if cfg.run.rng != "seeded":
        return
    if not insecure_seeded:
        raise ConfigError("run.rng", "'seeded' makes every client secret and the server's noise "
                          "predictable from run.seed: the release would not be private",
                          "use run.rng=secure (the default), or add --insecure-seeded to run a "
                          "reproducible simulation that is marked NOT PRIVATE everywhere")
    print(f"WARNING: {NOT_PRIVATE}", file=sys.stderr)


#: what ``--resume RUN --set key=value`` may change: work after the release only (the
#: labels are post-processing of the released counts, the student is trained on them).
#: Everything else decides what was released, and report.json must agree with release.npz.
RESUME_MAY_CHANGE = ("student.", "labels.", "cluster.", "run.progress")


def check_resume_overrides(saved, cfg) -> None:
    """Refuse ``--set`` keys that would change the meaning of a finished release."""
    before, after = _leaves(saved.to_dict()), _leaves(cfg.to_dict())
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    refused = [k for k in changed if not k.startswith(RESUME_MAY_CHANGE)]
    if refused:
        raise ConfigError("--resume", f"--set {', '.join(refused)} would change what the saved "
                          "release means (it was released with the run folder's config.yaml)",
                          "resume changes only student.*, labels.*, cluster.* and run.progress; "
                          "start a new run (a new release, new budget) for anything else")


def _leaves(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} for every leaf of a nested config dict."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


class ReleaseNotSaved(RknnError):
    """A round was released (and counted in the ledger) but release.npz could not be written."""


def _one_line(exc: BaseException) -> str:
    """A failure as one line: an error raised in a Ray actor as itself, not Ray's wrapping."""
    cause = getattr(exc, "cause", None)
    if cause is not None and type(exc).__module__.startswith("ray"):
        exc = cause
    if isinstance(exc, RknnError):
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    from rknn_ray.errors import NO_SPACE
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"out of disk space{where} ({exc.strerror}). Fix: free space and re-run"
    if "database or disk is full" in str(exc):
        return f"out of disk space ({exc}). Fix: free space on the ledger's file system"
    return f"the job failed: {type(exc).__name__}: {_first_line(exc)}"


def main(argv=None) -> int:
    from jobs import signals
    with signals.handled():
        return _main(parse_args(argv))


def _main(args) -> int:
    from jobs import signals
    out, owned = None, False            # owned: this invocation may write into ``out``
    created = False
    try:
        if args.resume:
            out = os.path.abspath(args.resume)
            if not os.path.isfile(os.path.join(out, "release.npz")):
                raise ConfigError("--resume", f"{out} has no release.npz",
                                  "resume a run folder whose private round finished")
            if os.path.exists(os.path.join(out, "report.json")):
                raise ConfigError("--resume", f"{out} is already complete (report.json)",
                                  "nothing to resume; start a new run instead")
            saved = load_config(os.path.join(out, "config.yaml"))
            cfg = load_config(os.path.join(out, "config.yaml"), args.overrides)
            check_resume_overrides(saved, cfg)
        else:
            cfg = load_config(args.config, args.overrides)
        check_rng_consent(cfg, args.insecure_seeded)
        if not os.environ.get("RAY_ADDRESS"):       # a local instance: its CPUs are ours to count
            validate_resources(cfg, float(os.cpu_count() or 1))
        if args.key_file:
            from server.keys import check_key_file
            check_key_file(args.key_file, load=True)
        if not args.resume:
            out = args.out or os.path.join("runs", f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            created = not os.path.exists(out)
            out = prepare_run_dir(out, overwrite=args.overwrite,
                                  discard_release=args.discard_release)
        owned = True
        from jobs.progress import Progress
        progress = Progress.for_console(cfg.run.progress, quiet=args.quiet)
        report = run(cfg, out, key_file=args.key_file, ledger_path=args.ledger,
                     resume=bool(args.resume), progress=progress)
    except (KeyboardInterrupt, Exception) as exc:
        interrupt = signals.as_interrupt(exc)
        if interrupt is not None:
            stage = _stage_words(locals().get("progress"))
            message = f"interrupted by {interrupt.name}" + (f" during {stage}" if stage else "")
        else:
            message = _one_line(exc)
        line = f"error: {message}"
        if owned and out and os.path.isdir(out):
            if created and not os.listdir(out):
                os.rmdir(out)                 # leave no empty run folder behind
            elif not os.path.exists(os.path.join(out, "report.json")):
                line += "; " + _record_incomplete(out, message, exc)
        print(line, file=sys.stderr)
        if interrupt is not None:
            return interrupt.exit_code
        if not isinstance(exc, RknnError) and _one_line(exc).startswith("the job failed"):
            raise
        return 2
    acc, p = report["accuracy"], report["privacy"]
    print(f"run folder: {out}")
    if not p.get("private", True):
        print(f"NOT PRIVATE: {p['warning']}")
    print(f"{p['model']}/{p['mechanism']} eps={p['eps']:.4g} delta={p['delta']:.3g} "
          f"({p['unit']}-level, {p['neighbour']}): label accuracy {acc['labels']:.4f}, "
          f"student accuracy {acc['student']:.4f}")
    if "diagnostics" in report:
        print(f"[diagnostics, NOT private: {out}/diagnostics] non-private label accuracy "
              f"{report['diagnostics']['nonprivate_labels']:.4f}")
    return 0


def _stage_words(progress) -> str | None:
    """The stage a failure left, in words ("round_0" is the first private round)."""
    stage = progress and (progress.failed_in or progress.current)
    if stage and stage.startswith("round_"):
        return f"private round {int(stage.split('_')[1]) + 1}"
    return stage or None


def _is_cover_shortfall(exc: BaseException) -> bool:
    from jobs.protocol import CoverShortfall
    return isinstance(exc, CoverShortfall)


def _record_incomplete(out: str, message: str, exc: BaseException) -> str:
    """Write incomplete.json (what happened, whether a release is saved, the next step);
    returns the rest of the console line. A full disk here costs one clause, not a traceback."""
    released = os.path.exists(os.path.join(out, "release.npz"))
    lost = isinstance(exc, ReleaseNotSaved)
    if released and not lost:
        next_step, said = (f"python -m jobs.distill --resume {out}",
                           f"run folder {out} is marked incomplete; its release is saved: finish "
                           f"it with --resume {out}")
    elif lost:
        next_step, said = ("free disk space; the lost release stays counted in the ledger",
                           f"run folder {out} is marked incomplete; the release was NOT saved "
                           "(its eps is counted in the ledger)")
    elif _is_cover_shortfall(exc):      # the server saw the reports: spent, but no counts out
        next_step, said = ("no counts were released and the round's eps stays counted in the "
                           "ledger; re-run as the reason says",
                           f"run folder {out} is marked incomplete; no counts were released (the "
                           "round was refused for labelling; its eps is counted in the ledger)")
    else:
        next_step, said = ("nothing was released; fix the cause and re-run",
                           f"run folder {out} is marked incomplete; nothing was released")
    earlier = {}
    try:                        # a failed --resume keeps the first failure's reason beside its own
        with open(os.path.join(out, "incomplete.json")) as fh:
            old = json.load(fh)
        if isinstance(old, dict) and old.get("reason"):
            earlier = {"earlier_reasons": [*old.get("earlier_reasons", []), old["reason"]][-5:]}
    except (OSError, ValueError):
        pass
    try:
        mark_incomplete(out, message, release_saved=released and not lost,
                        released_and_lost=lost, next_step=next_step, **earlier)
    except OSError as werr:
        return said.replace(" is marked incomplete", "") + \
            f" (incomplete.json could not be written: {werr.strerror or werr})"
    return said + " (incomplete.json)"


if __name__ == "__main__":
    sys.exit(main())

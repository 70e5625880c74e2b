"""After the release: labels, the student and the run folder, from released counts only.

Writes labels.parquet, ledger.json, summary.png (and, with ``run.diagnostics``, the
NOT-private diagnostics folder), then report.json last: it marks a complete run.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
import pyarrow as pa

from rknn_ray import __version__
from rknn_ray.job.context import JobContext
from rknn_ray.job.labels_file import (accuracy_section, accuracy_words, has_public_labels,
                                      id_column, labels_table, measured,
                                      public_ids)
from rknn_ray.job.placement import merge_placements
from rknn_ray.predictor import write_predictor
from rknn_ray.job.release_file import load_selections
from rknn_ray.job.stages import finish_labels, nonprivate_labels
from rknn_ray.labeling.stage import connection_plan
from rknn_ray.student.stage import fit_student, student_description, student_inputs
from rknn_ray.labeling.connection import Connection
from rknn_ray.labeling.queries import union_of_rounds
from rknn_ray.rng import NOT_PRIVATE
from rknn_ray.runio import (INCOMPLETE_MARKER, RELEASE_FILE, remove_train_storage, write_json,
                            write_parquet, write_text)

DIAGNOSTICS_README = """NOT PRIVATE. Everything in this folder was computed from the private data WITHOUT
noise (run.diagnostics: true, a simulation setting): the labels the same pipeline gives
with exact counts, and plots of exact per-query counts. No privacy guarantee covers it.
Do not share this folder with anyone who may not see the private data; share the run
folder without it.
"""



def _spent(ctx, accountant: str) -> dict:
    """The matched source's spend after this job (its history: the console's, never the
    report's), composed as the budget store checks it: by the
    job's accountant at the budget's delta (a pld job's rounds calibrated together have own
    eps adding up to more than the job's eps; their sum is not what the budget holds)."""
    eps, delta = ctx.store.composed(ctx.identity, accountant)
    return {"spent_eps": eps, "spent_delta": delta, "spent_by": accountant}

def finish(ctx: JobContext, rounds: list, query_sets: list, ledger, mechanism) -> tuple:
    """Labels, the student and the run folder; returns (the report, also in report.json;
    the public samples' labels, also in labels.parquet).
    ``mechanism``: the last round's, whose own error bound the central plots draw."""
    cfg, data, progress, out_dir = ctx.cfg, ctx.data, ctx.progress, ctx.out_dir
    sp = data.splits
    all_qs = union_of_rounds(ctx.public_emb, query_sets)
    counts = np.concatenate([r.counts for r in rounds])
    with progress.stage("labels", "labels from the released counts"):
        lab, label_info = finish_labels(cfg, data, counts, all_qs, ctx.public_emb, rounds,
                                        progress)
    labelled = has_public_labels(sp)
    if labelled:
        progress.say(f"label accuracy {lab.label_accuracy:.4f} (public labels vs released)")
    ref = exact = None
    connection = connection_report(cfg, load_selections(out_dir), len(query_sets))
    if cfg.run.diagnostics:     # simulation only: exact private counts, never released
        plans = saved_plans(cfg, load_selections(out_dir), query_sets, ctx.public_emb)
        exact, ref, _ = nonprivate_labels(cfg, data, ctx.encoder, query_sets, all_qs,
                                          ctx.public_emb, rounds, connection=plans)
        if labelled:
            progress.say(f"[diagnostics, NOT private] non-private label accuracy "
                         f"{ref.label_accuracy:.4f}")
    st = cfg.student
    inputs = student_inputs(cfg, data, ctx.encoder, lab, all_qs, ctx.public_emb, label_info,
                            out_dir)
    train_x = inputs.train_x
    trainer, why = st.chosen_trainer(len(train_x), inputs.image_shape)   # auto: by size
    how = (f"Ray Train, {st.num_workers} worker{'s' if st.num_workers != 1 else ''}"
           if trainer == "ray" else "in this process")
    if st.trainer == "auto":       # the default; ray or local is the user's own choice
        progress.say(f"student.trainer {why}")
    with progress.stage("student", f"student: {how}, "
                        f"{st.epochs} epochs on {len(train_x)} labelled samples"), \
            progress.epochs(st.epochs) as on_epoch:        # live, from Train's per-epoch reports
        student = fit_student(cfg, data, ctx.encoder, lab, label_info, inputs, out_dir, progress,
                              on_epoch)
    write_predictor(out_dir, cfg, data, inputs.described, ctx.encoder)   # RunResult.predict
    accuracy = accuracy_section(sp, lab.label_accuracy, lab.query_accuracy,
                                student.test_accuracy)
    progress.say(f"student test accuracy {accuracy_words(accuracy, 'student')}")
    utility = utility_report(ctx, label_info, student_description(cfg, data, ctx.encoder, inputs))

    # public labels: measurement only; the queries without one (a user's public table has
    # none) have no count gap to plot
    plotted = np.flatnonzero(np.asarray(sp.public_y)[all_qs.public_index] >= 0)
    truth_q = sp.public_y[all_qs.public_index[plotted]]
    g = rounds[-1].guarantee
    eps_spent, delta_spent = ledger.spent()
    source = _spent(ctx, cfg.privacy.accountant)      # the operator's view: the console only
    progress.say(f"budget of {ctx.described}: eps={ctx.budget[0]:g}, spent "
                 f"eps={source['spent_eps']:.6g} after this job (composed by "
                 f"{source['spent_by']}; `rknn-ray budget` shows it, report.json does not)")
    timings = dict(progress.timings)
    for stage in ("clients", "shuffle", "server_open"):
        timings[stage] = sum(r.timings.get(stage, 0.0) for r in rounds)
    for t, r in enumerate(rounds):
        timings.update({f"round_{t}_{k}": v for k, v in r.timings.items()})
    # the job's wall time to here (Ray's start and the time between stages included; the
    # release's untimed noise sampling left out, as from every stage)
    timings["job"] = progress.elapsed()
    report = {
        "accuracy": accuracy,
        "privacy": {"model": g.model, "mechanism": g.mechanism, "eps": eps_spent,
                    "delta": delta_spent, "unit": g.unit, "neighbour": g.neighbour,
                    "relation": neighbour_relation(data),
                    # what a record's value may be (a table: clipped to public / config bounds)
                    **({"domain": data.domain} if getattr(data, "domain", None) else {}),
                    "rounds": [r.guarantee.to_dict() for r in rounds], "ledger": ledger.to_dict(),
                    "details": [r.mechanism for r in rounds],
                    # which source the records were charged to depends on which of them
                    # matched a known one: its name, its budget and its spend (its history)
                    # are in the ledger and the operator's views, never in the report
                    "budget": {"description": ctx.described,    # the config's words only
                               "ledger": ctx.store.path,
                               "shown_by": f"rknn-ray budget --ledger {ctx.store.path}"},
                    "release_file": "release.npz", **rng_marks(cfg),
                    # privacy.allow_partial_release: per round, the shards lost (None: all sent)
                    "partial_release": ([r.partial for r in rounds]
                                        if any(r.partial for r in rounds) else None)},
        "counts": {**data.public_counts(), "queries": all_qs.size,
                   "messages": _total(r.messages for r in rounds),
                   "received": _total(r.received for r in rounds),
                   "rejected": (None if any(r.rejected is None for r in rounds)
                                else sum_dicts(r.rejected for r in rounds)),
                   "authenticated_senders": [r.authenticated_senders for r in rounds],
                   "missing": [r.missing for r in rounds],
                   "keys_made_ahead": [r.keys_made_ahead for r in rounds],
                   "rounds": len(rounds),
                   **({"holders": data.holders} if getattr(data, "holders", None) else {})},
        "split": sp.describe(),
        "student": {"test_accuracy": accuracy["student"], "epochs": student.epochs,
                    "trainer": trainer, "trainer_configured": st.trainer,
                    "trainer_reason": why,
                    "num_workers": student.num_workers, "device": student.device,
                    "checkpoint": student.checkpoint_path, "train_samples": int(len(train_x))},
        "timings_s": timings,
        "selection": [{k: measured(v) if isinstance(v, float) else v for k, v in
                       without_prices(sel).items()}
                      for sel in load_selections(out_dir)],  # per round: rule, pool, uncertainty
        "utility": utility,
        "connection": connection,
        "rng": cfg.run.rng, "version": __version__, "job_id": ctx.job_id,
        "resumed": resumed_from(out_dir, ctx.started_at),
        "config": cfg.to_dict(),
    }
    if any(r.shuffler is not None for r in rounds):
        report["shuffler"] = [r.shuffler for r in rounds]
    if cfg.cluster.holders == "remote":     # who the parties were, and the n opened
        report["remote"] = remote_section(cfg, rounds)
    scans = {f"scan@{site}": [node] for site, node in (getattr(data, "scan_nodes", None)
                                                       or {}).items()}   # data.private.sites
    report["placement"] = merge_placements([*(r.placement for r in rounds), scans])  # party -> its Ray nodes
    write_parquet(os.path.join(out_dir, "labels.parquet"),
                  labels_table(sp, data.num_classes, counts, all_qs, lab))
    write_json(os.path.join(out_dir, "ledger.json"), ledger.to_dict())
    bound = release_error_bound(mechanism) if g.model == "central" else None
    correct = lab.query_labels[plotted] == truth_q
    from rknn_ray.plots import run_summary_png  # defers matplotlib: importing run stays light
    run_summary_png(os.path.join(out_dir, "summary.png"), report, student.history,
                    count_gaps(counts[plotted], truth_q), correct, bound, "released")
    if cfg.run.diagnostics:
        report["diagnostics"] = write_diagnostics(os.path.join(out_dir, "diagnostics"), report,
                                                  student.history, ref, exact[plotted],
                                                  truth_q, correct, bound, public_ids(sp),
                                                  id_column(sp))
        # PRIVATE (depends on the label-driven partition): only in the diagnostics
        report["diagnostics"]["records_dropped_by_bound"] = data.records_dropped()
    remove_train_storage(out_dir)         # Train's student-*/ copies, an interrupted attempt's too
    write_json(os.path.join(out_dir, "report.json"), report)   # last: marks a complete run
    if os.path.exists(os.path.join(out_dir, INCOMPLETE_MARKER)):   # a resumed run is complete now
        os.unlink(os.path.join(out_dir, INCOMPLETE_MARKER))
    return report, lab.public_hard


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def resumed_from(out_dir: str, started_at: float) -> dict | None:
    """report.json's ``resumed``: None for a run finished in one go; for one that finishes a
    release an earlier attempt saved (``--resume``: release.npz is older than this job), when
    it finished, when that release was saved, and why the attempt stopped (incomplete.json's
    reason, when it left one: a killed process leaves none)."""
    release = os.path.join(out_dir, RELEASE_FILE)
    saved = os.path.getmtime(release) if os.path.isfile(release) else started_at
    if saved >= started_at:
        return None
    after = None
    try:
        with open(os.path.join(out_dir, INCOMPLETE_MARKER)) as fh:
            marker = json.load(fh)
        after = marker.get("reason") if isinstance(marker, dict) else None
    except (OSError, ValueError):
        pass
    return {"at": _utc(time.time()), "release_saved_at": _utc(saved), "after": after}


def connection_report(cfg, selections: list, count: int) -> dict:
    """report.json's ``connection``: the rule configured, the rule each round's clients used
    and its prices' digest (rknn_ray.labeling.connection; public), and what auto chose and why.
    A round saved without one (an older release) used reverse k-NN."""
    old = {"rule": "reverse_knn", "prices_digest": "reverse_knn"}
    used = [sel.get("connection") or old for sel in selections][:count]
    used += [old] * (count - len(used))
    auto = next((c["auto"] for c in used if "auto" in c), None)
    return {"configured": cfg.rknn.connection, "rules": [c["rule"] for c in used],
            "prices_digest": [c["prices_digest"] for c in used],
            **({"auto": auto} if auto is not None else {})}


def without_prices(selection: dict) -> dict:
    """A round's selection for report.json: its connection's prices stay in release.npz
    (report.json keeps their digest)."""
    conn = selection.get("connection")
    if not conn or "prices" not in conn:
        return selection
    return {**selection, "connection": {k: v for k, v in conn.items() if k != "prices"}}


def saved_plans(cfg, selections: list, query_sets: list, public_emb) -> list:
    """The connection each round's clients used: its saved prices (release.npz), or for a
    round saved without any, the plan of its rule made again from public data."""
    plans = []
    for t, qs in enumerate(query_sets):
        conn = (selections[t].get("connection") if t < len(selections) else None) or {}
        rule = conn.get("rule", "reverse_knn")
        plans.append(Connection(rule, np.asarray(conn["prices"], dtype=np.float64))
                     if "prices" in conn else connection_plan(cfg, public_emb, qs.features, rule))
    return plans


def utility_report(ctx: JobContext, label_info: dict, student: dict | None) -> dict:
    """report.json's ``utility``: how the labels were made (noise std, denoising; not the
    per-sample confidences), the auto choices, the student's inputs, a saved learned encoder."""
    out = {k: v for k, v in label_info.items() if k != "confidence"}
    out["auto"] = ctx.auto_choice
    if student is not None:
        out["student"] = student
    if hasattr(ctx.encoder, "save"):              # a learned encoder travels with the run
        out["encoder"] = {**ctx.encoder.describe(),
                          "file": os.path.basename(ctx.encoder.save(ctx.out_dir))}
    return out


def release_error_bound(mechanism, beta: float = 0.05) -> float:
    """The central release's (eta, beta) error bound for the plots: the mechanism's own
    (its scale and its noise, discrete or continuous), never a rebuild from its description."""
    return float(mechanism.error_bound(beta))


def count_gaps(counts: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per query: count of the (public) true class minus the best other class."""
    rows = np.arange(counts.shape[0])
    others = counts.astype(float).copy()
    others[rows, truth] = -np.inf
    return counts[rows, truth] - others.max(axis=1)


def write_diagnostics(folder: str, report: dict, history, ref, exact, truth_q, correct, bound,
                      ids, id_name: str = "id") -> dict:
    """The non-private reference, in its own folder with a README that says so; the folder
    is owner-only (0700), since what it holds was computed from private data without noise.
    ``exact``: the exact counts of the plotted queries (those with a public truth)."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)
    write_text(os.path.join(folder, "README.txt"), DIAGNOSTICS_README)
    write_parquet(os.path.join(folder, "nonprivate_labels.parquet"), pa.table({
        id_name: ids, "nonprivate_label": ref.public_hard}, metadata={"id_column": id_name}))
    diag = {"private": False, "folder": "diagnostics",
            "nonprivate_labels": measured(ref.label_accuracy),
            "nonprivate_query_labels": measured(ref.query_accuracy)}
    from rknn_ray.plots import run_summary_png  # defers matplotlib: importing run stays light
    run_summary_png(os.path.join(folder, "summary_nonprivate.png"),
                    {**report, "diagnostics": diag}, history, count_gaps(exact, truth_q),
                    correct, bound, "non-private")
    return diag


def rng_marks(cfg) -> dict:
    """report.json's privacy section: ``private`` is False (with why) for a seeded simulation."""
    return {"private": True} if cfg.run.rng == "secure" else {"private": False,
                                                              "warning": NOT_PRIVATE}


def remote_section(cfg, rounds) -> dict:
    """report.json's ``remote``: the holders ran off the cluster, each its own process, key and
    ledger; how many were registered, reported and opened, and the service they reached."""
    last = rounds[-1].shuffler or {}
    return {"holders": "remote: each its own process, key and ledger, off the cluster",
            "registry": cfg.remote.registry, "registered": last.get("registered"),
            "reported": last.get("senders"), "released": last.get("released"),
            "opened": int(rounds[-1].messages), "service": last.get("service"),
            "spec_hash": last.get("spec_hash"), "specification": "published/round.spec",
            "answers": last.get("answers")}


def neighbour_relation(data) -> str:
    """report.json's privacy.relation: the neighbour relation the guarantee holds under, and
    how holders enter it (README, "trust models")."""
    holders = getattr(data, "holders", None)
    if holders and holders.get("column"):
        return ("replace-one record: one record's value (features and label) replaced; which "
                "holders take part and how many records each holds are public (each holder "
                f"keeps at most {holders['bound']} records, "
                + ("and reads its own rows in its own process, off the cluster)"
                   if holders.get("remote") else "chosen at random under its own secret)")
                + ("; which site holds each holder is public (data.private.sites)"
                   if holders.get("sites") else ""))
    return ("replace-one record: one record's value (features and label) replaced; the "
            "assignment of records to clients is public")


def _total(values):
    """The sum of per-round counts, or None when a round's count is withheld."""
    values = list(values)
    return None if any(v is None for v in values) else int(sum(values))


def sum_dicts(dicts) -> dict:
    out: dict = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out

"""Events are the only source of privacy numbers (issue 19 item 2).

The store rebuilds every release's event and costs it with the accountant under the
choices recorded beside it: an event it cannot rebuild is an error naming the type and
the fix (never a generic stand-in), a commit whose numbers are not the accountant's cost
of its event is refused, the bound of a legacy shuffle event is read as the accountant's
choice, and jobs.compare's baselines write each release once, into the compare's store.
"""
import json
import os
import sqlite3

import pytest
from dp_accounting import dp_event

from rknn_ray.accounting.accountants import Costing, event_cost
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.events import (ShuffledLocalDpEvent, UnrebuildableEventError,
                                        costed_from_dict, event_from_dict, event_to_dict)
from rknn_ray.baselines.events import (dpsgd_event, gnmax_event, lnmax_event, nfdp_event,
                                       private_knn_event, selective_rr_event)
from rknn_ray.errors import LedgerError
from rknn_ray.accounting.guarantee import guarantee_of

LEGACY_SHUFFLE = {"type": "ShuffledLocalDpEvent", "local_mechanism": "collision", "eps0": 3.0,
                  "num_senders": 50000, "delta": 1e-6, "bound": "fmt_closed_form",
                  "honest_fraction": 1.0, "reports_opened": 50000}


def _store(tmp_path) -> BudgetStore:
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("ds", "d", "job", 5.0, 1e-6, (5.0, 1e-6))
    return store


def test_the_store_refuses_an_event_it_cannot_rebuild(tmp_path):
    store = _store(tmp_path)
    with pytest.raises(LedgerError, match="'PateDpEvent'.*Fix"):
        store.commit_round("ds", "job", 0, 1.0, 1e-5, {"type": "PateDpEvent", "eps": 1.0,
                                                       "delta": 1e-5})
    # a row written by another version: composing it is an error, not a generic event
    with sqlite3.connect(store.path) as con:
        con.execute("INSERT INTO releases (identity, job_id, round, status, eps, delta, event, "
                    "note, created, updated) VALUES ('ds', 'old', 0, 'released', 1.0, 0.0, ?, "
                    "'', 0, 0)", (json.dumps({"type": "FutureDpEvent", "x": 1}),))
    for compose in (lambda: store.composed("ds"), lambda: store.composed("ds", "pld")):
        with pytest.raises(LedgerError, match="'FutureDpEvent'.*Fix"):
            compose()
    with pytest.raises(UnrebuildableEventError, match="DiscreteLaplaceDpEvent"):
        event_from_dict({"type": "DiscreteLaplaceDpEvent"})          # fields missing


def test_a_commit_must_be_the_accountants_cost_of_its_event(tmp_path):
    store = _store(tmp_path)
    release = event_to_dict(dp_event.LaplaceDpEvent(noise_multiplier=2.0))      # costs 0.5
    with pytest.raises(LedgerError, match="costs eps=0.5"):
        store.commit_round("ds", "job", 0, 0.4, 0.0, release)
    store.commit_round("ds", "job", 0, 0.5, 0.0, release)
    # a Gaussian release is committed with the delta its cost was stated at, and rebuilt so
    gauss, at = gnmax_event(20.0, 10), Costing(delta=1e-7)
    eps, delta = event_cost(gauss, at)
    store.commit_round("ds", "job", 1, eps, delta, event_to_dict(gauss), accounting=at)
    store.close_job("ds", "job", "done")
    assert store.composed("ds", "basic") == pytest.approx((0.5 + eps, delta), rel=1e-12)


def test_a_legacy_shuffle_event_keeps_its_bound_as_the_accountants_choice(tmp_path):
    event, legacy = costed_from_dict(LEGACY_SHUFFLE)
    assert legacy == {"bound": "fmt_closed_form"} and not hasattr(event, "bound")
    assert event == ShuffledLocalDpEvent("collision", 3.0, 50000, 1e-6, 1.0, 50000)
    cost = event_cost(event, Costing(bound="fmt_closed_form"))
    store = _store(tmp_path)
    store.commit_round("ds", "job", 0, *cost, LEGACY_SHUFFLE)       # read as written, same bound
    store.close_job("ds", "job", "done")
    assert store.composed("ds", "basic") == pytest.approx(cost, rel=1e-12)


BASELINE_RELEASES = {
    "pate_lnmax": (lnmax_event(40.0, 30), Costing(delta=1e-5)),
    "pate_gnmax": (gnmax_event(40.0, 30), Costing(delta=1e-5)),
    "private_knn": (private_knn_event(0.15, 4.0, 30), Costing(delta=1e-5)),
    "dpsgd_rdp": (dpsgd_event(0.06, 1.1, 100), Costing(delta=1e-5)),
    "dpsgd_pld": (dpsgd_event(0.06, 1.1, 100), Costing(delta=1e-5, method="pld")),
    "nfdp": (nfdp_event(18, 2880, True), Costing()),
    "selective_rr": (selective_rr_event(2.0, 30, 2, 10), Costing()),
}


@pytest.mark.parametrize("name", sorted(BASELINE_RELEASES))
def test_every_baseline_release_survives_the_store_at_its_accountant_cost(tmp_path, name):
    event, costing = BASELINE_RELEASES[name]
    saved = json.loads(json.dumps(event_to_dict(event)))
    assert "eps" not in json.dumps(saved).replace('"eps": 2.0', "") or name == "selective_rr"
    assert event_from_dict(saved) == event
    cost = event_cost(event, costing)
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("ds", "d", "job", cost[0], cost[1], (1e9, 0.9))
    store.commit_round("ds", "job", 0, *cost, saved, accounting=costing.to_dict())
    store.close_job("ds", "job", "done")
    assert store.composed("ds", "basic", target_delta=0.5) == cost


def test_a_baseline_records_each_release_once_into_the_compares_store(tmp_path):
    """jobs.compare hands each baseline a ledger that is a view over its reservation in the
    compare's store: each release is written there once (no copy from a ledger of its own)
    and the totals are the accountant's composition of the events, not a hand sum."""
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.baselines.common import record
    store = BudgetStore(str(tmp_path / "compare.sqlite"))
    store.reserve("ds/pate_gnmax", "digits [pate_gnmax]", "compare-1", 2.0, 1e-5, (1e9, 1.0))
    ledger = PrivacyLedger(store=store, identity="ds/pate_gnmax", job_id="compare-1")
    a, b = BASELINE_RELEASES["pate_gnmax"], BASELINE_RELEASES["nfdp"]
    for i, (event, costing) in enumerate((a, b)):
        record(ledger, event, costing, "central", "gnmax", "record", "add/remove", "test",
               round_id=i)
    store.close_job("ds/pate_gnmax", "compare-1", "done")
    ca, cb = event_cost(*a), event_cost(*b)
    with sqlite3.connect(store.path) as con:
        rows = con.execute("SELECT round, eps, event FROM releases WHERE status = 'released' "
                           "ORDER BY id").fetchall()
    assert [(r, e) for r, e, _ in rows] == [(0, ca[0]), (1, cb[0])]
    assert [json.loads(ev)["type"] for _, _, ev in rows] == [a[0].__class__.__name__,
                                                              b[0].__class__.__name__]
    assert ledger.spent() == pytest.approx((ca[0] + cb[0], ca[1] + cb[1]), rel=1e-12)
    assert store.composed("ds/pate_gnmax", "basic", target_delta=0.5) == pytest.approx(
        (ca[0] + cb[0], ca[1] + cb[1]), rel=1e-12)


def test_the_runs_ledger_is_a_view_over_one_store():
    """PrivacyLedger writes no list of its own: each release is one row of a store (in memory
    for the run) and everything it shows is read back from there; a guarantee that is not
    the accountant's cost of its event never gets in."""
    from dataclasses import replace

    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.mechanisms import MechanismParams, build
    mech = build("shuffle", "collision", MechanismParams(10, 4, 1, 1.0, delta=1e-6,
                                                         num_clients=20000))
    ledger = PrivacyLedger(budget_eps=3.0, budget_delta=1e-5, accountant="pld")
    assert ledger.store.path == ":memory:"
    ledger.record(guarantee_of(mech), 0, messages=20000)
    (row,) = ledger.store.release_rows("run", "run")
    assert row["event"] == event_to_dict(mech.event())
    assert row["accounting"] == {"bound": "clones_numerical", "delta": 0.0, "method": "rdp"}
    (entry,) = ledger.entries
    assert entry.guarantee == guarantee_of(mech) and entry.extra == {"messages": 20000}
    assert ledger.spent() == ledger.store.composed("run", "pld", target_delta=1e-5)
    with pytest.raises(TypeError, match="eps"):      # a guarantee has no eps of its own
        replace(guarantee_of(mech), eps=0.01)
    with pytest.raises(LedgerError, match="costs eps="):     # nor does the store take one
        ledger.store.append_release("run", "run", 1, 0.01, 1e-6, event_to_dict(mech.event()),
                                    accounting=mech.costing())
    assert len(ledger.entries) == 1


def test_a_release_saved_with_its_bound_inside_resumes_at_the_same_cost(tmp_path):
    """release.npz written before the bound left the event: resume rebuilds the event, reads
    the bound as the accountant's choice, and the run's ledger admits it at the saved cost."""
    import numpy as np

    from rknn_ray.job.release_file import load_release
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.runio import RELEASE_FILE
    cost = event_cost(costed_from_dict(LEGACY_SHUFFLE)[0], Costing(bound="fmt_closed_form"))
    saved = {"eps": cost[0], "delta": cost[1], "model": "shuffle", "mechanism": "collision",
             "unit": "record", "neighbour": "replace-one", "n": 50000, "note": ""}
    meta = {"job_id": "j", "dataset": "d", "rounds": [
        {"guarantee": saved, "event": LEGACY_SHUFFLE, "mechanism": {}, "messages": 1,
         "received": 1, "clients": 1, "rejected": {}, "timings": {}, "shuffler": None}]}
    with open(tmp_path / RELEASE_FILE, "wb") as fh:
        np.savez(fh, meta=json.dumps(meta), counts_0=np.zeros((2, 2)),
                 query_features_0=np.zeros((2, 3), np.float32),
                 query_public_index_0=np.arange(2))
    _, _, rounds, _ = load_release(str(tmp_path), np.zeros((4, 3), np.float32))
    (r,) = rounds
    assert r.guarantee.accounting == Costing(bound="fmt_closed_form")
    ledger = PrivacyLedger()
    ledger.record(r.guarantee, 0)
    assert ledger.spent() == pytest.approx(cost, rel=1e-12)


# ---------------------------------------------------------------- issue 38 item 1

def test_a_stored_eps_is_a_cache_recomputed_from_the_event(tmp_path):
    """report.json, release.npz and ledger rows keep (eps, delta) for their readers; a
    guarantee (and the store's spend) read back is the cost of its event again, whatever
    number was stored."""
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.accounting.guarantee import Guarantee
    from rknn_ray.mechanisms import MechanismParams, build
    mech = build("shuffle", "collision", MechanismParams(10, 4, 1, 1.0, delta=1e-6,
                                                         num_clients=20000))
    g = guarantee_of(mech)
    saved = json.loads(json.dumps(g.to_dict()))
    assert (saved["eps"], saved["delta"]) == (g.eps, g.delta)
    assert saved["event"] == event_to_dict(mech.event())
    back = Guarantee.from_dict({**saved, "eps": 99.0, "delta": 0.5})
    assert back == g and (back.eps, back.delta) == event_cost(mech.event(), mech.costing())
    # a ledger row whose shown eps was changed reads back at its event's cost
    store = _store(tmp_path)
    PrivacyLedger(store=store, identity="ds", job_id="job").record(g, 0)
    with sqlite3.connect(store.path) as con:
        (meta,) = con.execute("SELECT meta FROM releases WHERE status = 'released'").fetchone()
        meta = json.loads(meta)
        meta["guarantee"]["eps"] = 99.0
        con.execute("UPDATE releases SET meta = ?, eps = 99.0 WHERE status = 'released'",
                    (json.dumps(meta),))
    (entry,) = PrivacyLedger(store=store, identity="ds", job_id="job").entries
    assert entry.guarantee == g and entry.guarantee.eps == g.eps
    assert store.spent("ds").eps == pytest.approx(5.0)      # the reservation's rest + the release
    (shown,) = [r for r in store.datasets()[0]["releases"] if r["status"] == "released"]
    assert (shown["eps"], shown["delta"]) == (g.eps, g.delta)


def test_a_run_folder_written_before_rounds_carried_their_event_still_loads(tmp_path):
    """report.json's rounds once held (eps, delta) and no event: RunResult.from_path takes
    the event from the ledger's release of that round and costs it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rknn_ray.job.runner import RUN_FILES, RunResult
    from rknn_ray.mechanisms import MechanismParams, build
    mech = build("central", "laplace", MechanismParams(10, 4, 1, 0.5))
    g = guarantee_of(mech)
    old_round = {k: v for k, v in g.to_dict().items() if k != "event"}
    old_round["eps"] = 7.0                          # whatever it says, the event decides
    entry = {"round": 0, "event": event_to_dict(g.event), "accounting": g.accounting.to_dict()}
    (tmp_path / RUN_FILES["report"]).write_text(json.dumps({"privacy": {"rounds": [old_round]}}))
    (tmp_path / RUN_FILES["ledger"]).write_text(json.dumps({"entries": [entry]}))
    pq.write_table(pa.table({"label": [0, 1, 2]}), tmp_path / RUN_FILES["labels"])
    res = RunResult.from_path(str(tmp_path))
    assert res.guarantee == g and res.guarantee.eps == pytest.approx(0.5)


# ---------------------------------------------------------------- issue 38, second step

def _run_with_tampered_numbers(tmp_path):
    """A run folder whose report.json and ledger.json hold two real central Laplace rounds
    (eps 0.5 each, their events beside them), every stored eps then changed by hand."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.job.runner import RUN_FILES
    from rknn_ray.mechanisms import MechanismParams, build
    from tests.run_folders import write_run
    g = guarantee_of(build("central", "laplace", MechanismParams(10, 4, 1, 0.5)))
    ledger = PrivacyLedger(budget_delta=1e-6, accountant="pld")
    ledger.record(g, 0)
    ledger.record(g, 1)
    folder = write_run(str(tmp_path / "run"), "central", "laplace", eps=1.0)
    path = os.path.join(folder, RUN_FILES["report"])
    with open(path) as fh:
        report = json.load(fh)
    saved = ledger.to_dict()
    truth = (saved["total"]["eps"], saved["total"]["delta"])
    for e in saved["entries"]:
        e["eps"] = 9.0
    saved["total"] = {"eps": 9.0, "delta": 0.5}
    report["privacy"].update(eps=9.0, delta=0.5, ledger=saved,
                             rounds=[{**g.to_dict(), "eps": 9.0}, {**g.to_dict(), "eps": 9.0}])
    with open(path, "w") as fh:
        json.dump(report, fh)
    with open(os.path.join(folder, RUN_FILES["ledger"]), "w") as fh:
        json.dump(saved, fh)
    pq.write_table(pa.table({"label": [0, 1]}), os.path.join(folder, RUN_FILES["labels"]))
    return folder, truth


def test_a_tampered_eps_in_report_json_is_recomputed_from_the_events(tmp_path):
    """report.json's total, rounds and ledger, and ledger.json, show (eps, delta) as a cache:
    `rknn-ray report` and RunResult.from_path read the events' cost, not the number."""
    from jobs.report import load_run, run_row
    from rknn_ray.job.runner import RunResult
    folder, truth = _run_with_tampered_numbers(tmp_path)
    assert truth[0] < 1.0 + 1e-9                 # pld composes two eps-0.5 Laplace rounds
    p = load_run(folder)["report"]["privacy"]
    assert (p["eps"], p["delta"]) == truth
    assert [r["eps"] for r in p["rounds"]] == [0.5, 0.5]
    assert [e["eps"] for e in p["ledger"]["entries"]] == [0.5, 0.5]
    assert (p["ledger"]["total"]["eps"], p["ledger"]["total"]["delta"]) == truth
    assert run_row(load_run(folder))["eps"] == truth[0]
    res = RunResult.from_path(folder)
    assert (res.report["privacy"]["eps"], res.guarantee.eps) == (truth[0], 0.5)
    assert res.ledger["total"]["eps"] == truth[0]


def test_a_report_whose_events_cannot_be_costed_is_named_not_shown(tmp_path):
    from jobs.report import ReportError, load_run
    from rknn_ray.job.runner import RUN_FILES
    folder, _ = _run_with_tampered_numbers(tmp_path)
    path = os.path.join(folder, RUN_FILES["report"])
    with open(path) as fh:
        report = json.load(fh)
    report["privacy"]["ledger"]["entries"][0]["event"] = {"type": "PateDpEvent", "eps": 1.0}
    with open(path, "w") as fh:
        json.dump(report, fh)
    with pytest.raises(ReportError, match="cannot be costed.*PateDpEvent"):
        load_run(folder)

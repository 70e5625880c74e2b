"""One ledger, written once per round: a job's PrivacyLedger is a view over its own rows of
the persistent store, and a check costs the new event, not every recorded one again."""
import json
import sqlite3

import pytest
from dp_accounting import dp_event

import rknn_ray.accounting.accountants as accountants
from rknn_ray.accounting.accountants import get_accountant
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.accounting.ledger import PrivacyLedger
from rknn_ray.config import load_config
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.accounting.guarantee import Guarantee, guarantee_of

FAST = ["student.epochs=1", "queries.restarts=1", "run.rng=seeded", "student.trainer=local",
        "run.progress=false"]
LAPLACE = dp_event.LaplaceDpEvent(noise_multiplier=10.0)     # costs eps = 0.1 exactly


def central(eps=0.1):
    """A central Laplace release of cost eps (sensitivity 1, scale 1/eps)."""
    return Guarantee(dp_event.LaplaceDpEvent(noise_multiplier=1.0 / eps), "central", "laplace")


def shuffle_release():
    mech = build("shuffle", "collision", MechanismParams(10, 4, 1, 1.0, delta=1e-6,
                                                         num_clients=20000))
    return guarantee_of(mech)


def reserved(store, identity, job_id):
    """(eps, delta) still held by the job's open reservation."""
    with store._connect() as con:
        return con.execute("SELECT eps, delta FROM releases WHERE identity = ? AND job_id = ? "
                           "AND status = 'reserved'", (identity, job_id)).fetchone()


# ---------------------------------------------------------------------- the job's view

def test_a_jobs_ledger_is_its_rows_in_the_persistent_store(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("ds", "ds", "job", 1.0, 0.0, (5.0, 1e-6))
    ledger = PrivacyLedger(budget_eps=0.25, accountant="pld", store=store, identity="ds",
                           job_id="job")
    ledger.record(central(), 0, messages=7)
    ledger.record_spent(central(), 1, note="NOT PRIVATE", messages=8)
    # each release is one row, committed into the reservation: nothing else is written
    (dataset,) = store.datasets()
    assert [(r["job_id"], r["round"], r["status"]) for r in dataset["releases"]] == [
        ("job", None, "reserved"), ("job", 0, "released"), ("job", 1, "released")]
    assert dataset["releases"][2]["note"] == "NOT PRIVATE"
    assert reserved(store, "ds", "job") == pytest.approx((0.8, 0.0))
    # the cap is checked before a release: a refused round writes nothing
    with pytest.raises(PrivacyBudgetError, match="round refused"):
        ledger.record(central(), 2)
    assert len(store.release_rows("ds", "job")) == 2
    # a fresh view of the same rows shows the same ledger
    again = PrivacyLedger(budget_eps=0.25, accountant="pld", store=store, identity="ds",
                          job_id="job")
    assert again.to_dict() == ledger.to_dict()
    assert [e.extra for e in again.entries] == [{"messages": 7}, {"messages": 8}]


def test_a_job_without_a_reservation_cannot_record_a_release(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    ledger = PrivacyLedger(store=store, identity="ds", job_id="nobody")
    with pytest.raises(PrivacyBudgetError, match="holds no reservation"):
        ledger.record(central(), 0)
    assert ledger.entries == [] and store.release_rows("ds", "nobody") == []
    with pytest.raises(ValueError, match="needs store, identity and job_id"):
        PrivacyLedger(store=store)


def test_ledgers_of_two_jobs_on_one_source_show_their_own_rows(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    for job in ("a", "b"):
        store.reserve("ds", "ds", job, 0.5, 0.0, (5.0, 1e-6))
    a, b = (PrivacyLedger(store=store, identity="ds", job_id=j) for j in ("a", "b"))
    a.record(central(), 0)
    b.record(central(0.2), 0)
    assert a.spent() == (0.1, 0.0) and b.spent() == (0.2, 0.0)


# ---------------------------------------------------------------------- a check that does not grow

def _counting(monkeypatch):
    calls = []
    real = accountants.event_cost

    def counted(*a, **k):
        calls.append(1)
        return real(*a, **k)
    monkeypatch.setattr(accountants, "event_cost", counted)
    return calls


@pytest.mark.parametrize("accountant", ["basic", "pld"])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_round_costs_the_same_evaluations_at_round_20_as_at_round_2(
        monkeypatch, tmp_path, accountant, persistent):
    """Each check composes the recorded events once (cached), so 20 rounds cost O(20)
    evaluations of the event cost; re-costing every entry on every check cost O(20^2)."""
    rounds = 20
    guarantee = shuffle_release()
    kw = {}
    if persistent:
        store = BudgetStore(str(tmp_path / "l.sqlite"))
        store.reserve("ds", "ds", "job", rounds * guarantee.eps, rounds * guarantee.delta,
                      (100.0, 1e-3))
        kw = {"store": store, "identity": "ds", "job_id": "job"}
    ledger = PrivacyLedger(budget_eps=100.0, budget_delta=1e-4, accountant=accountant, **kw)
    calls = _counting(monkeypatch)
    per_round = []
    for t in range(rounds):
        before = len(calls)
        ledger.check(guarantee)               # the session's check before any client
        ledger.check(guarantee)               # and with the true cost before the release
        ledger.record_spent(guarantee, t)     # the job's one write after the save
        ledger.spent()
        per_round.append(len(calls) - before)
    assert per_round[-1] == per_round[1] and len(calls) <= 8 * rounds, per_round
    before = len(calls)
    ledger.to_dict()
    assert len(calls) == before              # the output re-costs nothing


@pytest.mark.parametrize("accountant,release", [
    ("basic", "shuffle"), ("pld", "shuffle"), ("pld", "laplace"), ("basic", "mixed")])
@pytest.mark.parametrize("budget_delta", [None, 1e-4])
def test_cached_totals_are_the_accountants_composition_of_every_event(
        accountant, release, budget_delta):
    """After every round, spent(), check() and to_dict() equal, to the bit, the accountant
    composing every recorded event from scratch (at the ledger's target delta). Six rounds:
    the mixed ledger goes twice through its three kinds of event (the from-scratch side of
    the check composes T(T+1)/2 PLDs)."""
    sg = shuffle_release()
    lg = Guarantee(LAPLACE, "shuffle", "laplace", unit=sg.unit, neighbour=sg.neighbour)
    generic = Guarantee(accountants.ApproxDpEvent(0.1, 0.0), "shuffle", "laplace",
                        unit=sg.unit, neighbour=sg.neighbour)
    releases = {"shuffle": [sg], "laplace": [lg], "mixed": [sg, lg, generic]}[release]
    ledger = PrivacyLedger(budget_delta=budget_delta, accountant=accountant)
    acc = get_accountant(accountant)
    recorded = []

    def scratch(items):
        events = [(g.event, g.accounting) for g in items]
        target = budget_delta or max(1e-12, 2.0 * sum(g.delta for g in items))
        return acc.compose(events, target)
    for t in range(6):
        g = releases[t % len(releases)]
        assert ledger.check(g) == scratch(recorded + [g])
        ledger.record(g, t)
        recorded.append(g)
        assert ledger.spent() == scratch(recorded)
    out = ledger.to_dict()
    assert (out["total"]["eps"], out["total"]["delta"]) == scratch(recorded)
    costs = [accountants.event_cost(g.event, g.accounting) for g in recorded]
    assert (out["total_basic"]["eps"], out["total_basic"]["delta"]) == (
        sum(c[0] for c in costs), min(1.0, sum(c[1] for c in costs)))


def test_an_empty_ledger_shows_what_it_showed_before():
    out = PrivacyLedger().to_dict()
    assert out["total"] == {"eps": 0.0, "delta": 0.0}
    assert json.dumps(out["total_basic"]) == '{"eps": 0, "delta": 0}'


# ---------------------------------------------------------------------- a whole job

def _job(tmp_path, *overrides):
    from rknn_ray.job import run
    from rknn_ray.runio import prepare_run_dir
    cfg = load_config("jobs/configs/digits_central.yaml", [*FAST, *overrides])
    out = prepare_run_dir(str(tmp_path / "run"), overwrite=False)
    return run, cfg, out, str(tmp_path / "ledger.sqlite")


def test_a_runs_ledger_json_is_the_persistent_stores_rows_of_its_job(
        ray_session, tmp_path, monkeypatch):
    """Each round is written once, to the persistent store (no in-memory copy), and
    ledger.json / report.json show exactly those rows."""
    writes = []
    for name in ("commit_round", "append_release"):
        real = getattr(BudgetStore, name)

        def spy(self, *a, _real=real, _name=name, **k):
            writes.append(_name)
            return _real(self, *a, **k)
        monkeypatch.setattr(BudgetStore, name, spy)
    run, cfg, out, path = _job(tmp_path, "rounds.count=2", "privacy.accountant=pld")
    result = run(cfg, out, ledger_path=path)
    assert writes == ["commit_round", "commit_round"]
    shown = json.loads((tmp_path / "run" / "ledger.json").read_text())
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert shown == report["privacy"]["ledger"] == result.ledger
    store = BudgetStore(path)
    (dataset,) = store.datasets()
    rows = [r for r in dataset["releases"] if r["status"] == "released"]
    (job_id,) = {r["job_id"] for r in dataset["releases"]}
    assert [(e["round"], e["eps"], e["delta"], e["event"]) for e in shown["entries"]] == \
        [(r["round"], r["eps"], r["delta"], r["event"]) for r in rows]
    view = PrivacyLedger(budget_eps=shown["budget"]["eps"], budget_delta=shown["budget"]["delta"],
                         accountant="pld", store=store, identity=dataset["identity"],
                         job_id=job_id)
    assert view.to_dict() == shown
    assert report["privacy"]["eps"] == shown["total"]["eps"]


def test_a_ledger_that_cannot_commit_a_release_counts_the_reservation_as_spent(
        ray_session, tmp_path, monkeypatch):
    def unwritable(self, *a, **k):
        raise sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(BudgetStore, "commit_round", unwritable)
    run, cfg, out, path = _job(tmp_path)
    with pytest.raises(sqlite3.OperationalError):
        run(cfg, out, ledger_path=path)
    assert (tmp_path / "run" / "release.npz").exists()       # saved before the write
    (dataset,) = BudgetStore(path).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "released" and row["eps"] == pytest.approx(1.0)   # settled: spent
    assert "counted as spent" in row["note"]
    assert dataset["spent"]["eps"] == pytest.approx(1.0)

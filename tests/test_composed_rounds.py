"""Rounds calibrated together (rknn_ray.mechanisms.composed_rounds, issue 39 items 2-3): under
the pld accountant a T-round single-message shuffle job runs each round at the largest eps0
whose composed cost fits the job's eps, instead of the eps0 of an eps/T share; the basic
accountant keeps the split; a round that opens fewer reports is charged its true cost."""
from types import SimpleNamespace

import pytest

from rknn_ray.accounting import PrivacyLedger, guarantee_of
from rknn_ray.accounting.accountants import Composition
from rknn_ray.config import load_config
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.job.context import JobContext
from rknn_ray.labeling.stage import round_budgets
from rknn_ray.mechanisms.stage import mechanism_for

N = 1_079                               # the digits job's clients, one record each
DATA = SimpleNamespace(num_clients=N, num_classes=10, max_records_per_client=1)


def _ctx(*overrides):
    cfg = load_config("jobs/configs/digits_shuffle.yaml",
                      ["privacy.mechanism=rr", "privacy.eps=1.0", "rounds.count=3",
                       "queries.s=10", *overrides])
    return JobContext(cfg, DATA, "", None, None, "", "", "")


def _pld_ledger(ctx):
    return PrivacyLedger(budget_eps=ctx.cfg.privacy.eps, budget_delta=ctx.cfg.privacy.delta,
                         accountant="pld")


def test_a_pld_job_runs_its_rounds_at_the_eps0_their_composition_allows():
    ctx = _ctx("privacy.accountant=pld")
    split = mechanism_for(ctx.cfg, DATA, eps=1 / 3, delta=1e-6 / 3)     # the eps/T share's eps0
    mechs = [ctx.round_mechanism(t, 10) for t in range(3)]
    assert len({m.local_eps for m in mechs}) == 1                       # even: one eps0
    assert mechs[0].local_eps > 1.2 * split.local_eps
    assert mechs[0].describe()["eps0_from"].startswith("the rounds plan")
    ledger = _pld_ledger(ctx)
    for t, m in enumerate(mechs):
        g = guarantee_of(m)
        ledger.check(g)                                  # each round fits before it runs
        ledger.record(g, t)
        assert g.eps == pytest.approx(m.params.eps)      # the round's target: its event's cost
    eps, delta = ledger.spent()
    assert 0.99 <= eps <= 1.0 and delta == 1e-6          # the budget, used within 1%
    assert ledger.to_dict()["total_basic"]["eps"] > 1.5  # what the rounds' own eps add up to


def test_a_budget_split_scales_each_rounds_eps0_with_its_fraction():
    ctx = _ctx("privacy.accountant=pld", "rounds.budget_split=[0.2, 0.3, 0.5]")
    shares = ctx.round_budgets()
    ratios = [s.eps0 / e for s, (e, _) in zip(shares, round_budgets(1.0, 1e-6, 3, (0.2, 0.3, 0.5)))]
    assert ratios == pytest.approx([ratios[0]] * 3) and ratios[0] > 1.2
    events = [(guarantee_of(ctx.round_mechanism(t, 10)).event, ctx.round_mechanism(0, 10).costing())
              for t in range(3)]
    assert 0.99 <= Composition("pld").extend(events).result(1e-6)[0] <= 1.0


def test_the_basic_accountant_keeps_the_eps_over_T_split():
    ctx = _ctx()                                         # accountant: basic (the default)
    split = mechanism_for(ctx.cfg, DATA, eps=1 / 3, delta=1e-6 / 3)
    for t in range(3):
        m = ctx.round_mechanism(t, 10)
        assert m.local_eps == split.local_eps and m.params.eps == pytest.approx(1 / 3)
    assert [(s.eps, s.delta, s.eps0) for s in ctx.round_budgets()] == \
        [(e, d, None) for e, d in round_budgets(1.0, 1e-6, 3, "even")]


def test_rounds_that_gain_nothing_together_keep_the_split():
    """Three senders amplify nothing: each round's cost is its eps0, so the plan is the
    basic split (each round calibrated for its share), whatever the accountant."""
    from rknn_ray.mechanisms.composed_rounds import round_shares
    few = SimpleNamespace(num_clients=3, num_classes=10, max_records_per_client=1)
    assert [s.eps0 for s in round_shares(_ctx("privacy.accountant=pld").cfg, few)] == [None] * 3


def test_a_short_round_is_charged_its_true_composed_cost():
    """The third round opens 50 reports fewer than planned: it costs more than its target,
    the ledger refuses it before release (composed over the budget), and recorded as spent
    (the server saw the reports) it counts at the PLD of the senders actually shuffled."""
    ctx = _ctx("privacy.accountant=pld")
    mechs = [ctx.round_mechanism(t, 10) for t in range(3)]
    ledger = _pld_ledger(ctx)
    for t in range(2):
        ledger.record(guarantee_of(mechs[0]), t)
    short = N - 50
    g = guarantee_of(mechs[2], N, mechs[2].round_event(N, short), opened=short)
    assert g.n == short and g.eps > mechs[2].params.eps
    with pytest.raises(PrivacyBudgetError, match="pld composition"):
        ledger.check(g)
    ledger.record_spent(g, 2)
    events = [(e.event, e.guarantee.accounting) for e in ledger.entries]
    assert events[-1][0].num_senders == short
    assert ledger.spent()[0] == Composition("pld").extend(events).result(1e-6)[0] > 1.0


def test_the_reservation_keeps_the_later_rounds_composed_cost(tmp_path):
    """Committing a round leaves in the job's reservation what its later rounds may still
    cost together: the store's total while round 3 runs is never below the job's final one
    (the reservation less the rounds' own eps would be: they add up to more than eps)."""
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.mechanisms.composed_rounds import reservation_after
    ctx = _ctx("privacy.accountant=pld")
    store = BudgetStore(str(tmp_path / "ledger.sqlite"), purpose="experiment")
    store.reserve("ds", "digits", "job", 1.0, 1e-6, (1.0, 1e-6), accountant="pld")
    ledger = PrivacyLedger(budget_eps=1.0, budget_delta=1e-6, accountant="pld", store=store,
                           identity="ds", job_id="job")
    totals = []
    for t in range(3):
        g = guarantee_of(ctx.round_mechanism(t, 10))
        ledger.record_spent(g, t, reserve_left=reservation_after(ctx.cfg, DATA, t))
        totals.append(store.composed("ds", "pld", target_delta=1e-6)[0])
    assert reservation_after(ctx.cfg, DATA, 2) == (0.0, 0.0)
    assert min(totals[:2]) >= totals[2] == pytest.approx(ledger.spent()[0])
    assert reservation_after(_ctx().cfg, DATA, 0) is None       # basic: reservation less release


def test_the_benchmark_plans_each_T_split_and_together(capsys):
    import json

    from benchmarks.composed_rounds import main
    assert main(["--plan", "jobs/configs/digits_shuffle.yaml", "--set", "privacy.mechanism=rr",
                 "--rounds", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["rounds"] for r in rows] == [2, 3]
    for r in rows:
        assert r["eps0_together"] > r["eps0_split"]
        assert r["composed_split"] < 0.75 < 0.99 <= r["composed_together"] <= 1.0
    assert main(["--plan", "jobs/configs/digits_central.yaml", "--rounds", "2"]) == 2
    assert "single-message shuffle" in capsys.readouterr().err


def test_the_jobs_rounds_loop_runs_the_plan():
    """planned_rounds (the job's loop) on the real digits data: each round's mechanism runs
    the plan's eps0, and its own target is the plan's."""
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.job.rounds import planned_rounds
    from rknn_ray.mechanisms.composed_rounds import round_shares
    from rknn_ray.job.stages import fit_queries
    cfg = _ctx("privacy.accountant=pld", "run.rng=seeded", "queries.restarts=1").cfg
    data = prepare_data(cfg)
    _, emb, first = fit_queries(cfg, data)
    released, query_sets, plans = [], [], []
    for plan in planned_rounds(cfg, data, emb, first, released, query_sets):
        plans.append(plan)
        released.append(plan.t)
        query_sets.append(plan.queries)
    shares = round_shares(cfg, data)
    assert [(p.eps, p.mechanism.local_eps, p.mechanism.params.eps) for p in plans] == \
        [(s.eps, s.eps0, s.eps) for s in shares]
    assert shares[0].eps0 > 1.2 * mechanism_for(cfg, data, eps=1 / 3, delta=1e-6 / 3).local_eps


def test_choices_made_before_the_rounds_use_the_planned_share_not_eps_over_T():
    """queries.s / rknn.k: auto and rknn.connection: auto are chosen for the noisiest round's
    noise: with the rounds calibrated together that is the planned round's own eps (its eps0's
    cost), not eps/T; with rknn.k: auto the plan is made at k = 1; basic keeps eps/T."""
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.job.stages import noisiest_round_share, resolve_auto
    from rknn_ray.mechanisms.composed_rounds import round_shares
    basic = _ctx().cfg
    assert noisiest_round_share(basic, DATA) == pytest.approx((1 / 3, 1e-6 / 3))
    joint = _ctx("privacy.accountant=pld").cfg
    planned = round_shares(joint, DATA)[0]
    assert noisiest_round_share(joint, DATA) == (planned.eps, planned.delta)
    assert planned.eps > 1.2 / 3
    auto = _ctx("privacy.accountant=pld", "queries.s=auto", "rknn.k=auto").cfg
    assert noisiest_round_share(auto, DATA)[0] == pytest.approx(planned.eps)
    data = prepare_data(auto)
    _, choice = resolve_auto(auto, data)
    assert choice["per_round_eps"] == pytest.approx(noisiest_round_share(auto, data)[0])
    assert "calibrated together" in choice["reason"]

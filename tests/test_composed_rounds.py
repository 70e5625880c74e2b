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
    # rknn.r=2: kr = 2, so rr is costed by tight's generic form; with its per-bit RR form
    # (kr = 1) the small rounds amplify more, and one eps0 scale would give the 0.2 round
    # less than its split: the plan keeps the split there (joint_shares)
    ctx = _ctx("privacy.accountant=pld", "rounds.budget_split=[0.2, 0.3, 0.5]", "rknn.r=2")
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
    """Three senders amplify nothing under the generic form (kr = 2 here): each round's cost
    is its eps0, so the plan is the basic split (each round calibrated for its share),
    whatever the accountant. (Per-bit RR's own form, kr = 1, amplifies three reports a
    little: its three rounds compose below the sum, and the plan takes that.)"""
    from rknn_ray.mechanisms.composed_rounds import round_shares
    few = SimpleNamespace(num_clients=3, num_classes=10, max_records_per_client=1)
    cfg = _ctx("privacy.accountant=pld", "rknn.r=2").cfg
    assert [s.eps0 for s in round_shares(cfg, few)] == [None] * 3


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
    # r = 2: rr's generic form (its per-bit form's PLDs cost ~30 s to plan; covered by
    # tests/test_accounting_bitrr.py's dominating pair)
    assert main(["--plan", "jobs/configs/digits_shuffle.yaml", "--set", "privacy.mechanism=rr",
                 "--set", "rknn.r=2", "--rounds", "3", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["rounds"] for r in rows] == [2, 3]
    for r in rows:
        assert r["eps0_together"] > r["eps0_split"]
        assert r["composed_split"] < 0.75 < 0.99 <= r["composed_together"] <= 1.0
    assert main(["--plan", "jobs/configs/digits_central.yaml", "--rounds", "2"]) == 2
    assert "delta = 0: pure-DP rounds compose to exactly their sum" in capsys.readouterr().err
    assert main(["--plan", "jobs/configs/digits_local.yaml", "--rounds", "2"]) == 2
    assert "give a single-message shuffle, central or multi-message config" in \
        capsys.readouterr().err
    # central at a delta: at T <= 3 the Laplace composition gains nothing, and the benchmark
    # says so (the plan at T = 20 is test_central_rounds_at_a_delta_are_calibrated_together's)
    assert main(["--plan", "jobs/configs/digits_central.yaml", "--set", "privacy.delta=1e-6",
                 "--set", "queries.s=10", "--rounds", "3", "--json"]) == 0
    for r in json.loads(capsys.readouterr().out)["rows"]:
        assert not r["together"] and r["noise_scale_together"] == r["noise_scale_split"]
        assert r["composed_split"] <= 1.0


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


# ------------------------------------------------ the central model (Laplace on the sum)

def _central(*overrides):
    return load_config("jobs/configs/digits_central.yaml",
                       ["privacy.eps=1.0", "privacy.accountant=pld", "queries.s=10", *overrides])


def _composed(cfg, shares):
    mechs = [mechanism_for(cfg, DATA, eps=s.eps, delta=s.delta, num_queries=10) for s in shares]
    return Composition("pld").extend((guarantee_of(m).event, m.costing())
                                     for m in mechs).result(cfg.privacy.delta)[0]


def _planned_together(cfg, rounds):
    """The rounds' shares of a plan calibrated together for eps 1, delta 1e-6 (checked: one
    eps each, above the eps/T share; composing within 1% under eps, where the eps/T split
    composes below 0.9)."""
    from rknn_ray.mechanisms.composed_rounds import round_shares
    shares = round_shares(cfg, DATA)
    assert all(s.together and s.eps0 is None for s in shares)
    assert len({s.eps for s in shares}) == 1 and shares[0].eps > 1.1 / rounds
    basic = round_budgets(1.0, 1e-6, rounds, "even")
    split = _composed(cfg, [SimpleNamespace(eps=e, delta=d) for e, d in basic])
    assert split < 0.9 and 0.99 <= _composed(cfg, shares) <= 1.0
    return shares


@pytest.mark.parametrize("noise", ["discrete", "continuous"])
def test_central_rounds_at_a_delta_are_calibrated_together(noise):
    """20 central rounds at delta 1e-6: each round's noise is calibrated for x eps/20 with the
    largest x whose pld composition fits eps = 1 (within 1%), above what the eps/T split's
    composition spends (it leaves ~13% of eps unused)."""
    cfg = _central("privacy.delta=1e-6", "rounds.count=20", f"privacy.noise={noise}")
    shares = _planned_together(cfg, 20)
    m = mechanism_for(cfg, DATA, eps=shares[0].eps, delta=shares[0].delta, num_queries=10)
    assert guarantee_of(m).eps == pytest.approx(shares[0].eps)   # its own target: its cost
    assert float(m.scale) < 40 / 1.1                              # 2kr / (eps/20) = 40


def test_the_central_plan_spends_the_delta_or_keeps_the_split():
    """delta = 0: pure-DP rounds compose by pld to exactly their sum, so the split stays
    (and the config keeps refusing a delta a pure job would never use); at delta 1e-6 three
    rounds compose to their sum as well (nothing to gain: the split), twenty do not."""
    from rknn_ray.errors import ConfigError
    from rknn_ray.mechanisms.composed_rounds import composes_jointly, round_shares
    pure = _central("rounds.count=20")
    assert not composes_jointly(pure)
    assert [(s.eps, s.delta, s.together) for s in round_shares(pure, DATA)] == \
        [(e, d, False) for e, d in round_budgets(1.0, 0.0, 20, "even")]
    three = _central("privacy.delta=1e-6", "rounds.count=3")
    assert composes_jointly(three)
    assert [(s.eps, s.together) for s in round_shares(three, DATA)] == [(1 / 3, False)] * 3
    assert round_shares(_central("privacy.delta=1e-6", "rounds.count=20"), DATA)[0].together
    for over in (["rounds.count=1"], ["rounds.count=20", "privacy.accountant=basic"]):
        with pytest.raises(ConfigError, match="pure eps-DP.*privacy.accountant=pld"):
            _central("privacy.delta=1e-6", *over)


def test_the_reservation_keeps_the_later_central_rounds_composed_cost(tmp_path):
    """As for shuffle rounds: committing a central round leaves in the reservation the pld
    composition of the later planned rounds, never below what they spend."""
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.mechanisms.composed_rounds import reservation_after, round_shares
    cfg = _central("privacy.delta=1e-6", "rounds.count=20")
    shares = round_shares(cfg, DATA)
    store = BudgetStore(str(tmp_path / "ledger.sqlite"), purpose="experiment")
    store.reserve("ds", "digits", "job", 1.0, 1e-6, (1.0, 1e-6), accountant="pld")
    ledger = PrivacyLedger(budget_eps=1.0, budget_delta=1e-6, accountant="pld", store=store,
                           identity="ds", job_id="job")
    totals = []
    for t, s in enumerate(shares):
        g = guarantee_of(mechanism_for(cfg, DATA, eps=s.eps, delta=s.delta, num_queries=10))
        ledger.check(g)
        left = reservation_after(cfg, DATA, t)
        # the later rounds' composition (their basic sum where that is smaller)
        assert left[0] <= (19 - t) * s.eps + 1e-12 and left[1] <= (19 - t) * 1e-6 / 20 + 1e-18
        ledger.record_spent(g, t, reserve_left=left)
        totals.append(store.composed("ds", "pld", target_delta=1e-6)[0])
    assert reservation_after(cfg, DATA, 0)[0] < 1.0 < 19 * shares[0].eps
    assert reservation_after(cfg, DATA, 19) == (0.0, 0.0)
    assert min(totals[:-1]) >= totals[-1] == pytest.approx(ledger.spent()[0])
    assert 0.99 <= ledger.spent()[0] <= 1.0


def _run_job(config, overrides, tmp_path):
    """Runs the packaged ``config`` with ``overrides`` (its own ledger file); report's privacy."""
    import json

    from jobs.distill import main
    args = ["--config", f"jobs/configs/{config}.yaml", "--out", str(tmp_path / "run"),
            "--quiet", "--ledger", str(tmp_path / "ledger.sqlite")]
    for o in overrides:
        args += ["--set", o]
    assert main(args) == 0
    return json.loads((tmp_path / "run" / "report.json").read_text())["privacy"]


def test_a_central_job_of_twenty_rounds_runs_the_plan(ray_session, tmp_path):
    """The digits central job, 20 rounds under pld at delta 1e-6 (one student epoch): the
    ledger accepts every round at the planned eps, and they compose to eps within 1%."""
    from rknn_ray.mechanisms.composed_rounds import round_shares
    over = ["rounds.count=20", "privacy.accountant=pld", "privacy.delta=1e-6", "queries.s=15",
            "student.epochs=1", "queries.restarts=1", "student.trainer=local"]
    priv = _run_job("digits_central", over, tmp_path)
    planned = round_shares(_central(*over[:4]), DATA)[0].eps
    assert len(priv["ledger"]["entries"]) == 20
    assert [r["eps"] for r in priv["rounds"]] == pytest.approx([planned] * 20)
    assert planned > 1.1 / 20
    assert 0.99 <= priv["eps"] <= 1.0 and priv["delta"] == 1e-6
    assert priv["ledger"]["total_basic"]["eps"] > 1.1          # the rounds' own eps, added up
    # the dataset's spend the budget store checks: the rounds composed by pld at the
    # budget's delta, not their own eps added up (the ledger's view; not in the report)
    from rknn_ray.accounting.budget_store import BudgetStore
    store = BudgetStore(priv["budget"]["ledger"])
    (source,) = store.datasets()
    spent, _ = store.composed(source["identity"], "pld")
    assert spent <= priv["eps"] + 1e-9 and spent <= source["budget"]["eps"]


# ------------------------------------- the multi-message shuffle (the protocol's exact PLD)

def test_multi_message_rounds_are_calibrated_together():
    """The accountant composes multi-message rounds by the protocol's exact PLD (cap failures
    charged at the composed eps): three eps/3 rounds compose to ~0.89 at delta 1e-6, so the
    plan calibrates each round for x eps/3 with the largest x that fits eps = 1 (within 1%):
    less DLap noise and fewer flooding messages per round than the split; basic keeps it."""
    from rknn_ray.mechanisms.composed_rounds import composes_jointly
    cfg = _ctx("privacy.accountant=pld", "privacy.mechanism=multi").cfg
    assert composes_jointly(cfg) and not composes_jointly(_ctx("privacy.mechanism=multi").cfg)
    shares = _planned_together(cfg, 3)
    joint = mechanism_for(cfg, DATA, eps=shares[0].eps, delta=shares[0].delta, num_queries=10)
    alone = mechanism_for(cfg, DATA, eps=1 / 3, delta=1e-6 / 3, num_queries=10)
    assert guarantee_of(joint).eps <= shares[0].eps                # its own target: its eps
    assert joint.cal.error_variance < 0.9 * alone.cal.error_variance
    assert joint.min_senders() == alone.min_senders()              # the floor: all shares


def test_a_multi_message_job_of_two_rounds_runs_the_plan(ray_session, tmp_path):
    """The digits multi-message job, 2 rounds of eps 2 under pld at delta 1e-6 (one student
    epoch; eps 2 keeps the flood of messages small): the ledger accepts every round at the
    planned eps, and they compose to eps within 1%."""
    from rknn_ray.mechanisms.composed_rounds import round_shares
    over = ["privacy.mechanism=multi", "privacy.eps=2.0", "rounds.count=2",
            "privacy.accountant=pld", "queries.s=10", "student.epochs=1",
            "queries.restarts=1", "student.trainer=local"]
    priv = _run_job("digits_shuffle", over, tmp_path)
    planned = round_shares(_ctx(*over[:5]).cfg, DATA)[0].eps
    assert len(priv["ledger"]["entries"]) == 2 and planned > 1.04 * 2.0 / 2
    assert all(r["eps"] <= planned for r in priv["rounds"])
    assert [r["eps"] for r in priv["rounds"]] == pytest.approx([planned] * 2, rel=2e-3)
    assert 0.99 * 2.0 <= priv["eps"] <= 2.0 and priv["delta"] == 1e-6
    assert priv["ledger"]["total_basic"]["eps"] > 1.04 * 2.0   # the rounds' own eps, added up

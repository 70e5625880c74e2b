"""The delta side of the budget (issue 18, issue 21 items 4 and 6): a pure first job leaves
room for shuffle jobs, a refusal names its limiting quantity and the exact command, the
delta summed over jobs stays below 1/n, central delta is refused, and a pure budget
composes exactly under the PLD accountant."""
import itertools
import re
import shlex

import pytest
from dp_accounting import dp_event

from jobs.budget import main as budget_main
from rknn_ray.accounting.budget_store import BudgetStore, job_default_budget
from rknn_ray.accounting.events import event_to_dict
from rknn_ray.accounting.source_identity import job_source
from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError, LedgerError, PrivacyBudgetError
from rknn_ray.data.prepared import prepare_data

DEMOS = ["digits_central", "digits_local", "digits_shuffle"]


@pytest.fixture(scope="module")
def demo_jobs():
    """Each demo config with its prepared data (loaded once)."""
    jobs = {}
    for name in DEMOS:
        cfg = load_config(f"jobs/configs/{name}.yaml")
        jobs[name] = (cfg, prepare_data(cfg))
    return jobs


def _charge(store, cfg, data, job_id):
    """What jobs.distill does before Ray starts."""
    identity, described, _ = job_source(store, cfg, data)
    n = len(data.splits.private_y)
    p = cfg.privacy
    store.reserve(identity, described, job_id, p.eps, p.delta, job_default_budget(p, n),
                  accountant=p.accountant, records=n)
    return identity


@pytest.mark.parametrize("order", list(itertools.permutations(DEMOS)), ids="-".join)
def test_the_demo_configs_run_in_any_order_on_one_ledger(tmp_path, demo_jobs, order):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    identities = {_charge(store, *demo_jobs[name], name) for name in order}
    assert len(identities) == 1                 # one dataset, one budget
    (row,) = store.datasets()
    assert row["spent"]["eps"] == pytest.approx(1.0 + 4.0 + 2.0)
    assert 0 < row["budget"]["delta"] < 1 / len(demo_jobs["digits_central"][1].splits.private_y)


def test_a_delta_limited_refusal_names_delta_and_the_exact_command(tmp_path, demo_jobs, capsys):
    path = str(tmp_path / "l.sqlite")
    store = BudgetStore(path)
    central, data = demo_jobs["digits_central"]
    pure = central.with_overrides(["privacy.budget_delta=0"])       # a pure budget, chosen
    ident = _charge(store, pure, data, "central")
    shuffle = demo_jobs["digits_shuffle"][0]
    with pytest.raises(PrivacyBudgetError) as refused:
        _charge(store, shuffle, data, "shuffle")
    text = str(refused.value)
    assert "The limit is delta (1e-06 > budget 0)" in text and "The limit is eps" not in text
    assert "lowering eps does not help" in text and "lower privacy.eps" not in text
    command = re.search(r"rknn-ray budget set \S+ --eps \S+ --delta \S+", text).group(0)
    assert command == f"rknn-ray budget set {ident} --eps 20 --delta 1e-06"
    assert budget_main(shlex.split(command)[2:] + ["--ledger", path]) == 0    # run it as printed
    assert _charge(store, shuffle, data, "shuffle") == ident                  # and it fits
    assert "delta 0 -> 1e-06" in capsys.readouterr().out


def test_delta_summed_over_jobs_stays_below_one_over_n(tmp_path, demo_jobs):
    """Issue 21 item 4: 20 shuffle jobs at delta 9e-4 (each < 1/n = 9.27e-4) were admitted
    under budget_delta 0.5, 0.018 in total; now the second is refused, whatever the budget."""
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    cfg, data = demo_jobs["digits_shuffle"]
    n = len(data.splits.private_y)
    identity, described, _ = job_source(store, cfg, data)
    store.set_budget(identity, 100.0, 0.5, described)        # as an old ledger may hold it
    admitted = 0
    for i in range(20):
        try:
            store.reserve(identity, described, f"job-{i}", 1.0, 9e-4, (100.0, 0.5), records=n)
            admitted += 1
        except PrivacyBudgetError as exc:
            assert "The limit is delta: the total would reach 1/n" in str(exc)
            assert f"n = {n} private records" in str(exc) and "lowering eps does not help" in str(exc)
    assert admitted == 1 and store.spent(identity).delta < 1 / n
    # and no budget at or above 1/n can be set any more: the source knows its n; bringing
    # the old budget under the cap needs no --allow-lower
    with pytest.raises(ConfigError, match="not below 1/n"):
        store.set_budget(identity, 100.0, 0.5)
    store.set_budget(identity, 100.0, 9.2e-4)
    assert store.budget(identity) == (100.0, 9.2e-4)


def test_pld_under_an_old_budget_above_one_over_n_answers_below_the_cap(tmp_path):
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.set_budget("ds", 100.0, 0.5, "an old ledger's budget")
    store.reserve("ds", "d", "job-0", 1.0, 1e-5, (100.0, 0.5), accountant="pld", records=1000)
    with pytest.raises(PrivacyBudgetError, match="would reach 1/n = 0.001"):
        store.reserve("ds", "d", "job-1", 1.0, 1e-3, (100.0, 0.5), accountant="pld", records=1000)


def test_a_delta_budget_at_or_above_one_over_n_is_refused(tmp_path, demo_jobs):
    cfg = demo_jobs["digits_shuffle"][0].with_overrides(["privacy.budget_delta=0.5"])
    n = len(demo_jobs["digits_shuffle"][1].splits.private_y)
    with pytest.raises(ConfigError, match=rf"privacy.budget_delta.*not below 1/n = {1 / n:.3g} "
                                          rf".*n = {n} private"):
        prepare_data(cfg)                       # the config check that needs n
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    with pytest.raises(ConfigError, match="privacy.budget_delta"):
        store.reserve("ds", "d", "job", 1.0, 1e-6, (10.0, 0.5), records=n)
    assert store.datasets() == []               # nothing written


def test_the_budget_cli_refuses_a_delta_budget_above_one_over_n(tmp_path, demo_jobs, capsys):
    path = str(tmp_path / "l.sqlite")
    ident = _charge(BudgetStore(path), *demo_jobs["digits_central"], "central")
    assert budget_main(["set", ident, "--eps", "30", "--delta", "0.5", "--ledger", path]) == 2
    err = capsys.readouterr().err
    n = len(demo_jobs["digits_central"][1].splits.private_y)
    assert "not below 1/n" in err and f"--delta below {1 / n:.3g}" in err
    assert BudgetStore(path).budget(ident)[0] == 20.0          # unchanged


@pytest.mark.parametrize("model", ["central", "local"])
def test_a_pure_model_with_a_delta_is_refused(model):
    over = ["privacy.delta=0.5"] + (["privacy.model=local", "privacy.mechanism=rr"]
                                    if model == "local" else [])
    with pytest.raises(ConfigError, match=f"every {model} mechanism is pure eps-DP.*set "
                                          "privacy.delta=0"):
        load_config("jobs/configs/digits_central.yaml", over)


def test_pld_against_a_pure_budget_composes_pure_events_exactly(tmp_path):
    """Issue 21 item 6: with accountant pld and a pure budget every job was refused (PLD
    reports delta 1e-12 > 0); pure events now compose by their sum, exact at delta 0."""
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    release = event_to_dict(dp_event.LaplaceDpEvent(noise_multiplier=1.0))      # eps 1
    for i in range(3):
        store.reserve("ds", "d", f"job-{i}", 1.0, 0.0, (3.0, 0.0), accountant="pld")
        store.commit_round("ds", f"job-{i}", 0, 1.0, 0.0, release)
        store.close_job("ds", f"job-{i}", "done")
    assert store.composed("ds", "pld") == (pytest.approx(3.0), 0.0)
    with pytest.raises(PrivacyBudgetError, match=r"The limit is eps \(3.1 > budget 3\)"):
        store.reserve("ds", "d", "job-3", 0.1, 0.0, (3.0, 0.0), accountant="pld")
    with pytest.raises(PrivacyBudgetError, match=r"The limit is .*delta \(1e-06 > budget 0\)"):
        store.reserve("ds", "d", "job-4", 0.0001, 1e-6, (3.0, 0.0), accountant="pld")


def test_an_experiment_ledger_admits_independent_cells(tmp_path):
    """jobs.grid / jobs.compare cells are independent hypothetical releases in an isolated
    ledger: neither the delta budget nor the 1/n cap stops a grid there."""
    from jobs.cells import isolated_ledger
    with isolated_ledger(str(tmp_path)) as path:
        store = BudgetStore(path)
        assert store.purpose == "experiment"
        for i in range(20):
            store.reserve("ds", "d", f"cell-{i}", 1.0, 9e-4, (1e6, 1e-4), records=1078)
    assert BudgetStore(path).spent("ds").delta == pytest.approx(0.018)
    # a budget ledger with spend never becomes an experiment ledger (its cap would be lifted)
    real = tmp_path / "real"
    BudgetStore(str(real / "ledger.sqlite")).reserve("ds", "d", "job", 1.0, 0.0, (5.0, 0.0))
    with pytest.raises(LedgerError, match="cannot become an experiment ledger"):
        with isolated_ledger(str(real)):
            pass
    assert BudgetStore(str(real / "ledger.sqlite")).purpose == "budget"

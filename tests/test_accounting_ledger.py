"""Privacy ledger: composition, budget refusal, units, PLD vs basic, persistence."""
import json
import math

import pytest
from dp_accounting import dp_event

from rknn_ray.accounting.events import ApproxDpEvent
from rknn_ray.accounting.guarantee import Guarantee
from rknn_ray.accounting.ledger import PrivacyLedger
from rknn_ray.errors import ConfigError, PrivacyBudgetError


def g(eps, delta=0.0, model="central", mech="laplace", unit="record", n=None, event=None):
    """A release of cost (eps, delta): ``event``, else the generic event of that cost."""
    return Guarantee(ApproxDpEvent(eps, delta) if event is None else event, model, mech,
                     unit=unit, n=n)


def test_basic_composition_sums_and_budget_refuses_before_release():
    led = PrivacyLedger(budget_eps=1.0, budget_delta=1e-5)
    for t in range(3):
        led.record(g(0.3, 1e-6), round_id=t)
    assert led.spent() == pytest.approx((0.9, 3e-6))
    with pytest.raises(PrivacyBudgetError, match=r"round refused.*eps=1\.2.*Fix"):
        led.check(g(0.3, 1e-6))
    with pytest.raises(PrivacyBudgetError):
        led.record(g(0.3, 1e-6), round_id=3)
    assert len(led.entries) == 3          # the refused round left no trace


def test_units_and_neighbour_must_match():
    led = PrivacyLedger()
    led.record(g(0.5), round_id=0)
    with pytest.raises(PrivacyBudgetError, match="client-level"):
        led.record(g(0.5, unit="client"), round_id=1)


def test_pld_composition_is_tighter_than_basic_for_many_laplace_rounds():
    b = 10.0                               # Laplace scale / sensitivity: eps = 0.1 each
    ev = dp_event.LaplaceDpEvent(noise_multiplier=b)
    pld = PrivacyLedger(budget_delta=1e-6, accountant="pld")
    basic = PrivacyLedger(accountant="basic")
    for t in range(50):
        pld.record(g(0.1, event=ev), round_id=t)
        basic.record(g(0.1), round_id=t)
    eps_pld, delta_pld = pld.spent()
    assert basic.spent()[0] == pytest.approx(5.0)
    assert eps_pld < 0.7 * 5.0 and delta_pld == 1e-6
    # advanced composition (Dwork-Rothblum-Vadhan) is a valid, looser bound
    adv = math.sqrt(2 * 50 * math.log(1 / 1e-6)) * 0.1 + 50 * 0.1 * (math.exp(0.1) - 1)
    assert eps_pld <= adv


def test_pld_generic_events_never_exceed_basic():
    led = PrivacyLedger(budget_delta=1e-5, accountant="pld")
    for t in range(4):
        led.record(g(0.5, 1e-7, model="shuffle", mech="krr", n=1000), round_id=t)
    eps, delta = led.spent()
    assert eps <= 2.0 + 1e-9 and delta <= 1e-5


def test_pld_budget_cap_uses_composed_total():
    ev = dp_event.LaplaceDpEvent(noise_multiplier=10.0)
    led = PrivacyLedger(budget_eps=2.0, budget_delta=1e-6, accountant="pld")
    n = 0
    while True:
        try:
            led.record(g(0.1, event=ev), round_id=n)
        except PrivacyBudgetError:
            break
        n += 1
    assert n > 20                          # basic would stop at 20
    assert led.spent()[0] <= 2.0


def test_to_dict_and_atomic_save(tmp_path):
    led = PrivacyLedger(budget_eps=3.0, accountant="basic")
    led.record(g(1.0, model="shuffle", mech="rr", n=500), round_id=0, bound="clones_numerical")
    path = tmp_path / "sub" / "privacy.json"
    led.save(path)
    d = json.loads(path.read_text())
    assert d["accountant"] == "basic" and d["total"]["eps"] == 1.0
    e = d["entries"][0]
    assert (e["model"], e["mechanism"], e["unit"], e["neighbour"], e["n"], e["round"]) == \
        ("shuffle", "rr", "record", "replace-one", 500, 0)
    assert e["bound"] == "clones_numerical"
    assert [p.name for p in path.parent.iterdir()] == ["privacy.json"]   # no temp left


def test_bad_configuration_is_refused():
    with pytest.raises(ConfigError):
        PrivacyLedger(accountant="rdp-ish")
    with pytest.raises(ConfigError):
        PrivacyLedger(budget_eps=-1)


def test_a_guarantee_shows_only_the_accounting_choices_its_event_reads():
    """Issue 57: a central job's guarantee named a shuffle bound (clones_numerical) in
    report.json (its rounds, its ledger entries, its mechanism details). The bound is shown
    where an amplification bound prices the event, and the dict read back costs the same."""
    from rknn_ray.accounting.guarantee import Guarantee, guarantee_of
    from rknn_ray.mechanisms import MechanismParams, build
    central = build("central", "laplace", MechanismParams(10, 4, 1, 1.0, num_clients=100,
                                                           options={"bound": "tight"}))
    local = build("local", "rr", MechanismParams(10, 4, 1, 1.0, num_clients=100,
                                                 options={"bound": "tight"}))
    shuffle = build("shuffle", "collision", MechanismParams(10, 4, 1, 1.0, delta=1e-6,
                                                            num_clients=20000))
    for mech in (central, local):
        shown = guarantee_of(mech).to_dict()
        assert "bound" not in shown["accounting"] and "bound" not in mech.describe()
        assert Guarantee.from_dict(shown).eps == guarantee_of(mech).eps
    shown = guarantee_of(shuffle).to_dict()
    assert shown["accounting"]["bound"] == "clones_numerical"
    assert Guarantee.from_dict(shown).eps == pytest.approx(guarantee_of(shuffle).eps)
    led = PrivacyLedger(budget_eps=3.0, accountant="basic")
    led.record(guarantee_of(central), round_id=0)
    assert "bound" not in led.to_dict()["entries"][0]["accounting"]

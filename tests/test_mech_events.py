"""Every mechanism's guarantee and event are pure functions of its public parameters and n.

Covers every registered mechanism (and the options that change the noise): the event
is a frozen dp_accounting DpEvent that survives a JSON round trip (the ledger and the
budget store save it), costs exactly the stated guarantee, and for the central model
matches dp_accounting's own definition of (discrete) Laplace with our noise."""
import json
import math

import attr
import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.accountants import (BasicAccountant, Costing, PLDAccountant,
                                             UnknownEventError, event_cost)
from rknn_ray.accounting.events import ApproxDpEvent, event_from_dict, event_to_dict
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.mechanisms import MechanismParams, available, build
from rknn_ray.mechanisms.noise import discrete_laplace_pmf
from rknn_ray.accounting.guarantee import guarantee_of

N = 20000
VARIANTS = [(model, name, {}) for model, names in available().items() for name in names] + [
    ("central", "laplace", {"noise": "continuous"}),
    ("local", "laplace", {"multi_record": "normalize"}),
]


def params(**options) -> MechanismParams:
    return MechanismParams(10, 4, 2, 1.0, delta=1e-6, num_clients=N, options=options)


def variant_id(v):
    return "-".join([v[0], v[1], *map(str, v[2].values())])


@pytest.fixture(scope="module", params=VARIANTS, ids=variant_id)
def mech(request):
    model, name, opts = request.param
    return build(model, name, params(**opts))


def test_the_event_is_frozen_pure_and_survives_json(mech):
    event = mech.event()
    assert isinstance(event, dp_event.DpEvent) and attr.has(type(event))
    assert event == mech.event() and hash(event) == hash(mech.event())
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        setattr(event, attr.fields(type(event))[0].name, 0)
    saved = json.loads(json.dumps(event_to_dict(event)))     # what report.json / the store keep
    assert saved["type"] == type(event).__name__
    assert event_from_dict(saved) == event


def test_the_guarantee_is_exactly_the_accountants_cost_of_the_event(mech):
    n = mech.min_senders() if mech.model == "shuffle" else None
    for m in ([None] if n is None else [None, n, 3 * n]):
        g = guarantee_of(mech, m)
        assert g.accounting == mech.costing()                  # the choices it was costed with
        assert (g.eps, g.delta) == event_cost(mech.event(m), g.accounting)     # exactly
    if mech.model == "shuffle":
        event = mech.round_event(2 * n, 2 * n)
        g = guarantee_of(mech, 2 * n, event, opened=2 * n)
        assert g.event == event and (g.eps, g.delta) == event_cost(event, g.accounting)


def test_asking_for_a_guarantee_changes_nothing(mech):
    assert not hasattr(mech, "senders_shuffled")
    before = mech.describe()
    if mech.model == "shuffle":
        floor = mech.min_senders()
        assert guarantee_of(mech, 5 * floor).n == 5 * floor
        assert guarantee_of(mech, 5 * floor).eps <= guarantee_of(mech, floor).eps
    else:                                         # n is ignored outside the shuffle model
        assert guarantee_of(mech, 7) == guarantee_of(mech) and mech.event(7) == mech.event()
    assert mech.describe() == before and guarantee_of(mech) == guarantee_of(mech)


def test_no_event_below_the_sender_floor():
    for name in available()["shuffle"]:
        mech = build("shuffle", name, params())
        floor = mech.min_senders()
        mech.event(floor)
        with pytest.raises(PrivacyBudgetError, match="refused"):
            mech.event(floor - 1)
        with pytest.raises(PrivacyBudgetError, match="refused"):
            guarantee_of(mech, floor - 1)


def test_central_discrete_laplace_event_is_dp_accountings_definition_of_our_noise():
    mech = build("central", "laplace", params())
    event = mech.event()
    assert isinstance(event, dp_event.DiscreteLaplaceDpEvent)
    assert event.sensitivity == 2 * 2 * 1                    # replace-one L1: 2 k r
    a, x = event.noise_parameter, np.arange(-6, 7)
    # dp_accounting: P[x] = exp(-a|x|) tanh(a/2); ours: P[x] ~ exp(-|x|/scale)
    np.testing.assert_allclose(discrete_laplace_pmf(x, mech.scale),
                               np.exp(-a * np.abs(x)) * np.tanh(a / 2), rtol=1e-12)
    pld = pld_lib.from_discrete_laplace_mechanism(a, sensitivity=event.sensitivity)
    assert pld.get_epsilon_for_delta(0.0) == pytest.approx(guarantee_of(mech).eps, rel=1e-3)


def test_central_continuous_laplace_event_is_scale_over_sensitivity():
    mech = build("central", "laplace", params(noise="continuous"))
    event = mech.event()
    assert isinstance(event, dp_event.LaplaceDpEvent)
    assert event.noise_multiplier * mech.params.sensitivity_l1 == pytest.approx(mech.scale)
    pld = pld_lib.from_laplace_mechanism(event.noise_multiplier, sensitivity=1)
    assert pld.get_epsilon_for_delta(0.0) == pytest.approx(guarantee_of(mech).eps, rel=1e-3)


def test_shuffle_events_hold_parameters_not_a_computed_eps():
    for name in available()["shuffle"]:
        fields = event_to_dict(build("shuffle", name, params()).event())
        assert "eps" not in fields
    mech = build("shuffle", "collision", params())
    single = mech.event()
    assert single.local_mechanism == "collision" and single.eps0 == mech.local_eps
    # the amplification bound is the accountant's choice, recorded beside the event
    assert "bound" not in event_to_dict(single)
    assert guarantee_of(mech).accounting == Costing(bound="clones_numerical")


def test_the_bound_is_the_accountants_choice():
    """One event, two accountants' choices of upper bound: two costs; the mechanism's
    guarantee is the cost under the bound it calibrated with, and says so."""
    fmt = build("shuffle", "collision", params(bound="fmt_closed_form"))
    event = fmt.event()
    g = guarantee_of(fmt)
    assert g.accounting == Costing(bound="fmt_closed_form")
    assert (g.eps, g.delta) == event_cost(event, Costing(bound="fmt_closed_form"))
    assert event_cost(event, Costing(bound="clones_numerical"))[0] < g.eps   # tighter bound
    with pytest.raises(UnknownEventError, match="lower_bound"):
        event_cost(event, Costing(bound="lower_bound"))      # not an upper bound: no cost


def test_a_ledger_of_every_trust_model_is_json_and_totals_from_its_events():
    mechs = [build(m, n, params(**o)) for m, n, o in VARIANTS]
    totals = {}
    for accountant in ("basic", "pld"):
        ledger = PrivacyLedger(accountant=accountant)
        for i, m in enumerate(mechs):
            ledger.record(guarantee_of(m), i, mechanism_name=m.name)
        ledger.record(guarantee_of(mechs[0]), len(mechs))
        out = json.loads(json.dumps(ledger.to_dict()))
        assert [e["event"]["type"] for e in out["entries"]] == \
            [type(m.event()).__name__ for m in mechs + mechs[:1]]
        totals[accountant] = (out["total"]["eps"], out["total"]["delta"])
    stated = [guarantee_of(m) for m in mechs] + [guarantee_of(mechs[0])]
    assert totals["basic"][0] == pytest.approx(sum(g.eps for g in stated), rel=1e-9)
    assert totals["basic"][1] == pytest.approx(sum(g.delta for g in stated), rel=1e-9)
    assert totals["pld"][0] <= totals["basic"][0] * (1 + 1e-9)


def test_pld_falls_back_to_basic_when_the_target_delta_is_below_the_events_own():
    events = [ApproxDpEvent(1.0, 1e-3), dp_event.LaplaceDpEvent(noise_multiplier=2.0)]
    eps, delta = PLDAccountant().compose(events, 1e-6)
    assert math.isfinite(eps)
    assert (eps, delta) == BasicAccountant().compose(events)

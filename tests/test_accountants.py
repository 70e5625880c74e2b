"""Events and accountants: every mechanism describes its release as a pure, frozen event, and
every accountant passes one conformance suite (the idea of dp_accounting's
privacy_accountant_test: one abstract test class, one subclass per accountant)."""
import attr
import numpy as np
import pytest
from dp_accounting import dp_event

from rknn_ray.accounting import PrivacyLedger
from rknn_ray.accounting.accountants import (BasicAccountant, Costing, PLDAccountant,
                                             UnknownEventError, event_cost, rdp_epsilon)
from rknn_ray.accounting.calibration import guided_edge, monotone_edge
from rknn_ray.accounting.events import (LocalRandomizerDpEvent, MultiMessageShuffleDpEvent,
                                        ShuffledLocalDpEvent, event_to_dict)
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.accounting.guarantee import guarantee_of

PARAMS = MechanismParams(10, 4, 1, 1.0, delta=1e-6, num_clients=20000)
MECHANISMS = [("central", "laplace"), ("local", "rr"), ("local", "collision"),
              ("shuffle", "rr"), ("shuffle", "collision"), ("shuffle", "multi")]


@pytest.mark.parametrize("model,name", MECHANISMS)
def test_every_mechanism_states_its_release_as_a_pure_frozen_event(model, name):
    mech = build(model, name, PARAMS)
    e1, e2 = mech.event(), mech.event()
    assert e1 == e2 and hash(e1) == hash(e2)                  # pure function of the parameters
    assert isinstance(e1, dp_event.DpEvent) and attr.has(type(e1))
    with pytest.raises(attr.exceptions.FrozenInstanceError):
        setattr(e1, attr.fields(type(e1))[0].name, 0)
    # the event costs what the mechanism promises, never more
    eps, delta = event_cost(e1)
    g = guarantee_of(mech)
    assert eps == pytest.approx(g.eps, rel=1e-9) and delta == pytest.approx(g.delta)
    assert event_to_dict(e1)["type"] == type(e1).__name__
    assert "eps" not in event_to_dict(e1) or model == "local"   # no computed eps in an event


def test_shuffle_events_follow_the_senders_actually_shuffled():
    mech = build("shuffle", "collision", PARAMS)
    floor = mech.min_senders()
    assert mech.event(floor).num_senders == floor
    assert event_cost(mech.event(floor))[0] <= PARAMS.eps * (1 + 1e-9)
    assert event_cost(mech.event(2 * floor))[0] < event_cost(mech.event(floor))[0]  # more senders
    with pytest.raises(PrivacyBudgetError):
        mech.event(floor - 1)                                 # below the floor: no event, no release
    multi = build("shuffle", "multi", PARAMS)
    assert isinstance(multi.event(), MultiMessageShuffleDpEvent)
    with pytest.raises(PrivacyBudgetError):
        multi.event(multi.n_cal - 1)


EVENTS = [dp_event.DiscreteLaplaceDpEvent(noise_parameter=0.5, sensitivity=2),
          dp_event.LaplaceDpEvent(noise_multiplier=2.0),
          LocalRandomizerDpEvent("rr", 0.7),
          ShuffledLocalDpEvent("Collision", 3.0, 50000, 1e-6),
          build("shuffle", "multi", PARAMS).event()]


class AccountantConformance:
    """What every accountant must satisfy; subclasses name the accountant."""
    accountant = None

    def test_nothing_costs_nothing(self):
        assert self.accountant.compose([], 1e-6) == (0.0, 0.0)
        assert self.accountant.compose([dp_event.NoOpDpEvent()], 1e-6)[0] == 0.0

    @pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
    def test_one_event_is_never_looser_than_its_own_cost(self, event):
        eps, delta = self.accountant.compose([event], max(1e-6, 2 * event_cost(event)[1]))
        own = event_cost(event)
        assert eps <= own[0] * (1 + 1e-9) + 1e-9
        assert delta <= max(1e-6, 2 * own[1]) + 1e-15

    def test_composition_is_monotone(self):
        seen = []
        last = 0.0
        for e in EVENTS:
            seen.append(e)
            eps, _ = self.accountant.compose(seen, 1e-5)
            assert eps >= last - 1e-9
            last = eps

    def test_never_above_basic_composition(self):
        basic = BasicAccountant().compose(EVENTS)
        eps, delta = self.accountant.compose(EVENTS, max(1e-5, basic[1]))
        assert eps <= basic[0] * (1 + 1e-9)

    def test_unknown_events_are_refused_with_a_clear_error(self):
        with pytest.raises(UnknownEventError, match="event_cost"):
            self.accountant.compose([dp_event.UnsupportedDpEvent()], 1e-6)
        # a Gaussian has no pure cost: refused unless the accountant states it at a delta
        with pytest.raises(UnknownEventError, match="GaussianDpEvent.*delta"):
            self.accountant.compose([dp_event.GaussianDpEvent(noise_multiplier=1.0)], 1e-6)

    def test_a_gaussian_release_costs_what_rdp_says_at_its_stated_delta(self):
        event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(4.0), 10)
        costing = Costing(delta=1e-5)
        eps, delta = self.accountant.compose([(event, costing)], 1e-5)
        assert eps <= rdp_epsilon(event, 1e-5) * (1 + 1e-9) and delta <= 1e-5 * (1 + 1e-9)


    def test_shuffled_rounds_cost_at_most_their_sum_and_at_least_the_exact_lower_composition(self):
        from rknn_ray.accounting.bounds import BOUNDS
        from rknn_ray.accounting.shuffle_pld import composed_eps, pld_from_pair, rr_lower_pair
        eps0, n, delta, T = 3.0, 50000, 1e-6, 4
        event = ShuffledLocalDpEvent("rr", eps0, n, delta)
        eps, spent_delta = self.accountant.compose([(event, Costing("clones_numerical"))] * T,
                                                   T * delta)
        per_round = BOUNDS["clones_numerical"].central_eps(eps0, n, delta)
        lower = composed_eps(pld_from_pair(*rr_lower_pair(eps0, n), pessimistic=False), T,
                             T * delta)
        assert lower < eps <= T * per_round * (1 + 1e-9) and spent_delta <= T * delta * (1 + 1e-9)

    def test_multi_message_rounds_cost_at_most_their_own_cost_and_their_sum(self):
        """One multi-message round composed alone costs at most (and about) its own (eps,
        delta); a cap failure mass never makes it cheaper; T rounds at most their sum."""
        event = build("shuffle", "multi", PARAMS).event()
        own = event_cost(event)
        eps, delta = self.accountant.compose([event], own[1])
        assert own[0] * 0.98 <= eps <= own[0] * (1 + 1e-9) and delta <= own[1] * (1 + 1e-12)
        no_cap = attr.evolve(event, cap_failure=0.0)
        assert self.accountant.compose([event] * 3, 3e-6)[0] >= \
            self.accountant.compose([no_cap] * 3, 3e-6)[0]
        assert self.accountant.compose([event] * 3, 3 * own[1])[0] <= 3 * own[0] * (1 + 1e-9)


class TestBasicAccountant(AccountantConformance):
    accountant = BasicAccountant()

    def test_basic_is_the_plain_sum(self):
        eps, delta = self.accountant.compose(EVENTS[:3])
        assert eps == pytest.approx(2 * 0.5 + 0.5 + 0.7) and delta == 0.0


class TestPLDAccountant(AccountantConformance):
    accountant = PLDAccountant()

    def test_pld_beats_basic_for_many_laplace_releases(self):
        events = [dp_event.LaplaceDpEvent(noise_multiplier=10.0)] * 200
        eps, delta = self.accountant.compose(events, 1e-6)
        assert delta == 1e-6 and eps < 0.8 * BasicAccountant().compose(events)[0]

    def test_pld_charges_shuffled_rounds_their_composed_dominating_pair(self):
        event = (ShuffledLocalDpEvent("rr", 3.0, 50000, 1e-6), Costing("clones_numerical"))
        eps, _ = self.accountant.compose([event] * 4, 4e-6)
        assert eps < 0.6 * BasicAccountant().compose([event] * 4)[0]

    def test_pld_composes_multi_message_rounds_by_the_protocols_exact_pld(self):
        """Three eps/3 multi-message rounds compose by the protocol's own PLD to ~10% below
        the sum of their eps (the generic (eps, delta) pair of each round gave the sum)."""
        from rknn_ray.accounting.multi_message import protocol_eps
        params = MechanismParams(10, 4, 1, 1 / 3, delta=1e-6 / 3, num_clients=20000)
        event = build("shuffle", "multi", params).event()
        eps, delta = self.accountant.compose([event] * 3, 1e-6)
        assert delta == 1e-6 and eps < 0.92 * 3 * event_cost(event)[0]
        assert event_cost(event)[0] == protocol_eps(event.dlap_p, event.flood_mean_total,
                                                    event.sensitivity_l1, event.delta,
                                                    event.flood_shape)

    def test_the_cap_failure_mass_is_charged_at_one_plus_e_to_the_composed_eps(self):
        """Capped rounds cost the smallest E with delta_PLD(E) + (1 + e^E) sum phi_t <= delta,
        phi_t = cap_failure_t / (1 + e^eps_t): by hand on three rounds with a large cap
        failure, between the eps of delta_PLD alone and the eps of that plus a flat sum."""
        from rknn_ray.accounting.accountants import Composition, cap_failure_mass, event_pld
        event = attr.evolve(build("shuffle", "multi", PARAMS).event(), cap_failure=2e-7)
        phi = 2e-7 / (1 + np.exp(event_cost(event)[0]))
        assert cap_failure_mass(event) == pytest.approx(phi, rel=1e-12)
        assert cap_failure_mass(attr.evolve(event, cap_failure=0.0)) == 0.0
        pld = event_pld(event).self_compose(3)
        composition = Composition("pld").extend([event] * 3)
        assert composition.phi == pytest.approx(3 * phi, rel=1e-12)
        eps, delta = composition.result(3e-6)
        assert delta == 3e-6
        assert pld.get_delta_for_epsilon(eps) + (1 + np.exp(eps)) * 3 * phi <= 3e-6
        below = eps - 1e-6                                 # the smallest such E, to 1e-6
        assert pld.get_delta_for_epsilon(below) + (1 + np.exp(below)) * 3 * phi > 3e-6
        assert pld.get_epsilon_for_delta(3e-6) < eps        # the mass costs something
        # the composed eps exceeds a round's, so the charge exceeds the rounds' cap_failure
        # summed: adding only that to delta would understate the cost
        assert eps > event_cost(event)[0] and (1 + np.exp(eps)) * 3 * phi > 3 * 2e-7
        assert eps > pld.get_epsilon_for_delta(3e-6 - 3 * 2e-7)
        # a target the failure mass alone exceeds: the pld says nothing, basic is reported
        heavy = attr.evolve(event, cap_failure=1e-5)
        assert Composition("pld").extend([heavy]).pld_eps(2e-6) == np.inf
        assert Composition("pld").extend([heavy]).result(2e-6) == \
            Composition("basic").extend([heavy]).result(2e-6)

    def test_the_failure_mass_uses_the_eps_the_cap_was_sized_with(self):
        """The event records the eps its message cap was sized with (cap_eps): phi is charged
        from that, not from a recomputation that a later version of the calibration could
        make larger (which would understate phi); an older event without it recomputes."""
        import math

        from rknn_ray.accounting.accountants import cap_failure_mass
        from rknn_ray.mechanisms.shuffle_multi import noise_message_cap
        mech = build("shuffle", "multi", PARAMS)
        event = mech.event()
        assert event.cap_eps == mech.cal.eps > 0
        n_all = max(mech.n_cal, int(mech.params.num_clients))
        assert mech.noise_cap == noise_message_cap(
            event.dlap_p, event.flood_mean_total, event.noise_senders, event.num_cells,
            event.cap_failure / ((1 + math.exp(event.cap_eps)) * n_all), event.flood_shape)
        sized_lower = attr.evolve(event, cap_eps=0.5 * event.cap_eps)
        assert cap_failure_mass(sized_lower) == pytest.approx(
            event.cap_failure / (1 + math.exp(0.5 * event.cap_eps)), rel=1e-12)
        assert cap_failure_mass(sized_lower) > cap_failure_mass(event)
        older = attr.evolve(event, cap_eps=0.0)
        assert cap_failure_mass(older) == pytest.approx(
            event.cap_failure / (1 + math.exp(event_cost(event)[0])), rel=1e-12)


def test_the_ledger_keeps_events_and_totals_them_with_its_accountant():
    ledger = PrivacyLedger(budget_eps=2.0, accountant="basic")
    mech = build("central", "laplace", PARAMS)
    ledger.record(guarantee_of(mech), 0)
    entry = ledger.to_dict()["entries"][0]
    assert entry["event"] == {"type": "DiscreteLaplaceDpEvent", "noise_parameter": 0.5,
                              "sensitivity": 2}
    assert ledger.spent() == (1.0, 0.0)
    ledger.record(guarantee_of(mech), 1)
    with pytest.raises(PrivacyBudgetError, match="refused"):
        ledger.check(guarantee_of(mech))


def test_the_guided_search_answers_what_bisection_answers_in_fewer_evaluations():
    """guided_edge ends on the accepted side, within tol of the edge, for smooth, kinked,
    step and infinite scores, and with far fewer probes than bisection on a smooth one."""
    from rknn_ray.accounting.bounds import BOUNDS
    cases = [(lambda x: np.log(x) - np.log(2.5), 2.5),                # smooth, like a bound
             (lambda x: max(x - 2.5, 0.0) * 100 - (2.5 - x if x < 2.5 else 0), 2.5),  # kinked
             (lambda x: -1.0 if x <= 7.25 else 1.0, 7.25),              # a step
             (lambda x: -1.0 if x <= 3.0 else np.inf, 3.0)]            # infinite above the edge
    for score, edge in cases:
        probes = []
        got = guided_edge(lambda x: probes.append(x) or score(x), 0.5, 10.0, tol=1e-9,
                          relative=True)
        assert score(got) <= 0 and edge * (1 - 2e-9) <= got <= edge
        assert len(probes) <= 100                      # bisection would take ~33
    probes = []
    guided_edge(lambda x: probes.append(x) or np.log(x / 2.5), 0.5, 10.0, tol=1e-9)
    bisect = []
    monotone_edge(lambda x: bisect.append(x) or x <= 2.5, 0.5, 10.0, want="largest", tol=1e-9)
    assert len(probes) < len(bisect) / 2
    # a bound's local eps0 is granted (its central eps meets the target) and agrees with a
    # bisection of the same predicate to the tolerance
    b, n, delta = BOUNDS["clones_numerical"], 10**5, 1e-6
    e0 = b.local_eps0(1.0, n, delta)
    ref = monotone_edge(lambda e: b.central_eps(e, n, delta) <= 1.0, 1.0, b.eps0_max(n, delta),
                        want="largest", tol=1e-6, relative=True)
    assert b.central_eps(e0, n, delta) <= 1.0 and e0 == pytest.approx(ref, rel=2e-6)
    # a guess near the answer only shortens the search; a guess far off is not trusted
    for guess in (ref * 1.0004, ref * 0.9996, 1.3, 20.0, 1e-12):
        got = b.local_eps0(1.0, n, delta, guess=guess)
        assert b.central_eps(got, n, delta) <= 1.0 and got == pytest.approx(ref, rel=2e-6)


def test_one_monotone_search_serves_every_calibration():
    assert monotone_edge(lambda x: x <= 2.5, 0.0, 10.0, want="largest", tol=1e-9) \
        == pytest.approx(2.5)
    assert monotone_edge(lambda n: n * n >= 50, 1, 100, want="smallest", integer=True) == 8
    edge = monotone_edge(lambda x: x >= np.pi, 0.0, 4.0, want="smallest", tol=1e-3)
    assert np.pi <= edge <= np.pi + 1e-3                      # always on the accepted side
    mech = build("shuffle", "collision", PARAMS)
    floor = mech.min_senders()
    assert mech.central_eps(floor) <= PARAMS.eps * (1 + 1e-9) < mech.central_eps(floor - 1)

"""A shuffled round as a privacy loss distribution (rknn_ray.accounting.shuffle_pld): the
bound's dominating pair is the bound (its hockey-stick at the bound's eps is the delta), its
pessimistic PLD matches the bound at one round, and T rounds compose below T times a round's
eps and above the T-fold composition of an explicit lower-bound pair (shuffled binary RR)."""
import math

import numpy as np
import pytest

from rknn_ray.accounting import PrivacyLedger, guarantee_of
from rknn_ray.accounting.accountants import Costing, PLDAccountant
from rknn_ray.accounting.bound_choice import get_bound
from rknn_ray.accounting.bounds import BOUNDS, RRLowerBound
from rknn_ray.accounting.events import ShuffledLocalDpEvent
from rknn_ray.accounting.shuffle_pld import (PairTooLarge, blanket_pair_chunks, composed_eps,
                                             pld_from_pair, round_pld, rr_lower_pair)
from rknn_ray.mechanisms import MechanismParams, build

SETTINGS = [(3.0, 50_000, 1e-6), (2.0, 10_000, 1e-6), (4.0, 1_797, 1e-5)]


def _hockey(log_p, log_q, eps):
    return float(np.sum(np.maximum(np.exp(log_p) - math.exp(eps) * np.exp(log_q), 0.0)))


@pytest.mark.parametrize("name", ["clones_numerical", "variation_ratio"])
def test_the_dominating_pair_is_the_pair_its_bound_measures(name):
    bound = BOUNDS[name]
    eps0, n, delta = 2.0, 2_000, 1e-6
    log_p, log_q = bound.dominating_pair(eps0, n)
    assert abs(np.exp(log_p).sum() - 1) < 1e-12 and abs(np.exp(log_q).sum() - 1) < 1e-12
    eps = bound.central_eps(eps0, n, delta)
    # the bound is the pair's divergence (to its rounding on the safe side), in both directions
    for a, b in ((log_p, log_q), (log_q, log_p)):
        assert _hockey(a, b, eps) <= delta * (1 + 1e-9)
        assert _hockey(a, b, eps * (1 - 1e-3)) > delta
    # a bound that names no pair says so
    assert not BOUNDS["fmt_closed_form"].has_pair
    with pytest.raises(NotImplementedError, match="no dominating pair"):
        BOUNDS["fmt_closed_form"].dominating_pair(eps0, n)
    assert not get_bound("variation_ratio", "krr", k=4).has_pair


@pytest.mark.parametrize("eps0,n,delta", SETTINGS)
def test_one_round_as_a_pld_is_its_bound_on_the_safe_side(eps0, n, delta):
    bound = BOUNDS["clones_numerical"]
    direct = bound.central_eps(eps0, n, delta)
    eps = composed_eps(round_pld(bound, eps0, n), 1, delta)
    assert direct * (1 - 1e-6) <= eps <= direct + 2e-4       # pessimistic grid of 1e-4


@pytest.mark.parametrize("eps0,n,delta", SETTINGS)
def test_rounds_compose_below_their_sum_and_above_the_exact_lower_composition(eps0, n, delta):
    bound = BOUNDS["clones_numerical"]
    upper = round_pld(bound, eps0, n)
    lower = pld_from_pair(*rr_lower_pair(eps0, n), pessimistic=False)
    # the optimistic lower pair at one round is the exact lower bound, on its safe side
    assert composed_eps(lower, 1, delta) <= RRLowerBound().central_eps(eps0, n, delta) * (1 + 1e-6)
    per_round = bound.central_eps(eps0, n, delta)
    for T in range(2, 6):
        composed = composed_eps(upper, T, T * delta)
        assert composed_eps(lower, T, T * delta) < composed < T * per_round
    assert composed_eps(upper, 5, 5 * delta) < 0.6 * 5 * per_round


def test_the_pld_accountant_charges_shuffled_rounds_their_composed_pair():
    event = ShuffledLocalDpEvent("rr", 3.0, 50_000, 1e-6)
    per_round = BOUNDS["clones_numerical"].central_eps(3.0, 50_000, 1e-6)
    eps, delta = PLDAccountant().compose([(event, Costing(bound="clones_numerical"))] * 5, 5e-6)
    lower = composed_eps(pld_from_pair(*rr_lower_pair(3.0, 50_000), pessimistic=False), 5, 5e-6)
    assert delta == 5e-6 and lower < eps < 0.6 * 5 * per_round
    # a bound without a pair composes the rounds by their (eps, delta): sound, looser
    generic = PLDAccountant().compose([(event, Costing(bound="fmt_closed_form_final"))] * 5, 5e-6)
    assert generic[0] > eps


def pld_ledger_of_rounds(mech, rounds: int, senders: int = 20_000):
    """A pld ledger holding ``rounds`` rounds of ``mech``, each opening every sender's report;
    returns (its dict, one round's guarantee)."""
    ledger = PrivacyLedger(accountant="pld")
    for t in range(rounds):
        g = guarantee_of(mech, senders, mech.round_event(senders, senders), opened=senders)
        ledger.record_spent(g, t)
    return ledger.to_dict(), g


def test_a_job_ledger_records_shuffle_rounds_at_their_composed_cost():
    params = MechanismParams(10, 4, 1, 0.5, delta=1e-6, num_clients=20_000)
    out, g = pld_ledger_of_rounds(build("shuffle", "rr", params), 4)
    assert out["total_basic"]["eps"] == pytest.approx(4 * g.eps)
    assert out["total"]["eps"] < 0.75 * out["total_basic"]["eps"]
    assert [e["event"]["type"] for e in out["entries"]] == ["ShuffledLocalDpEvent"] * 4


def test_a_pair_too_large_to_build_in_seconds_is_refused_not_slow():
    with pytest.raises(PairTooLarge, match="support points"):
        next(blanket_pair_chunks(math.e ** 2, 1 / (math.e ** 2 + 1), math.exp(-2) / 2, 10 ** 8))
    # the accountant then composes the round by its (eps, delta) cost
    event = ShuffledLocalDpEvent("rr", 2.0, 10 ** 8, 1e-8)
    eps, _ = PLDAccountant().compose([event] * 2, 2e-8)
    assert 0 < eps <= 2 * BOUNDS["clones_numerical"].central_eps(2.0, 10 ** 8, 1e-8) * (1 + 1e-9)


@pytest.mark.parametrize("kind", ["krr", "collision"])
def test_the_explicit_lower_pairs_are_shuffled_rrs_exact_divergence(kind):
    from rknn_ray.accounting.hockey import eps_for_delta
    from rknn_ray.accounting.shuffle_pld import histogram_lower_pair
    from rknn_ray.accounting.shuffled_rr import collision_pair, krr_pair
    eps0, n, size, delta = 2.5, 1_500, 10, 1e-6
    p = math.exp(eps0)
    a = 1 / (p + size - 1)
    keep = 1 - 1 / size if kind == "collision" else 1.0
    exact = eps_for_delta((collision_pair if kind == "collision" else krr_pair)(eps0, n, size),
                          delta, eps0, upper=False)
    log_p, log_q = histogram_lower_pair(p, n, a * keep, p * a * keep)
    assert abs(np.exp(log_p).sum() - 1) < 1e-12
    for T in (1, 3):
        optimistic = composed_eps(pld_from_pair(log_p, log_q, pessimistic=False), T, T * delta)
        if T == 1:
            assert exact * (1 - 1e-3) - 2e-4 <= optimistic <= exact * (1 + 1e-6)
        else:
            assert optimistic < T * exact


def test_the_composed_rounds_benchmark_prints_each_T_between_its_bounds(capsys):
    import json

    from benchmarks.composed_rounds import main
    assert main(["--eps0", "2", "--n", "2000", "--delta", "1e-6", "--rounds", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["rounds"] for r in out["rows"]] == [1, 2, 3]
    for r in out["rows"][1:]:
        assert r["lower_composed"] < r["composed_pld"] < r["sum_of_rounds"]
    assert main(["--bound", "fmt_closed_form", "--n", "2000"]) == 2
    assert "names no dominating pair" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--mechanism", "krr"])
    assert exc.value.code == 2 and "--size" in capsys.readouterr().err


def test_the_tight_bound_is_the_default_and_the_job_uses_the_larger_eps0_it_certifies():
    from rknn_ray.accounting.accountants import event_cost
    from rknn_ray.config import PrivacyConfig
    assert PrivacyConfig().amplification_bound == "tight"
    base = dict(num_queries=10, num_classes=4, k=1, eps=1.0, delta=1e-6, num_clients=20_000)
    old = build("shuffle", "rr", MechanismParams(**base, options={"bound": "clones_numerical"}))
    new = build("shuffle", "rr", MechanismParams(**base, options={"bound": "tight"}))
    assert new.local_eps > old.local_eps * 1.05
    assert new.bound.name == "tight_bitrr"                  # per-bit RR (k r = 1): its own form
    event = new.event()
    assert (event.collision_c, event.collision_l, event.rr_kr, event.rr_d) == (0, 0, 1, 40)
    g = guarantee_of(new)
    assert event_cost(event, new.costing()) == pytest.approx((g.eps, g.delta), rel=1e-12)
    assert g.eps <= 1.0 * (1 + 1e-9) and "tight bound" in g.note
    # its rounds compose as tight's dominating pair under the pld accountant (above one
    # round's own lower bound: composing never helps)
    total, _ = pld_ledger_of_rounds(new, 3)
    lower = new.bound.lower(new.local_eps, 20_000, total["total"]["delta"])
    assert lower < total["total"]["eps"] < 0.8 * total["total_basic"]["eps"]


def test_an_unknown_or_lower_bound_is_refused_with_the_choices():
    params = MechanismParams(10, 4, 1, 1.0, delta=1e-6, num_clients=2_000,
                             options={"bound": "lower_bound"})
    with pytest.raises(Exception, match="not an upper bound.*tight"):
        build("shuffle", "rr", params)
    with pytest.raises(Exception, match="not an upper bound"):
        PLDAccountant().compose([(ShuffledLocalDpEvent("rr", 2.0, 2_000, 1e-6),
                                  Costing(bound="tightest"))], 1e-6)


def test_collision_is_calibrated_and_costed_with_the_collision_form_of_its_own_l():
    from rknn_ray.accounting.accountants import event_cost
    from rknn_ray.accounting.bound_choice import round_bound
    base = dict(num_queries=10, num_classes=4, k=1, eps=1.0, delta=1e-4, num_clients=300)
    old = build("shuffle", "collision", MechanismParams(**base, options={"bound": "clones_numerical"}))
    new = build("shuffle", "collision", MechanismParams(**base, options={"bound": "tight"}))
    assert new.bound.name == "tight_collision" and new.local_eps > old.local_eps
    # the l it runs is the l its bound was calibrated for, and the event records it
    assert new.randomizer_params == {"collision_c": 1, "collision_l": new.l}
    event = new.event()
    assert (event.collision_c, event.collision_l) == (1, new.l)
    assert round_bound("tight", "collision", 1, new.l) is new.bound
    g = guarantee_of(new)
    assert event_cost(event, new.costing()) == pytest.approx((g.eps, g.delta), rel=1e-12)
    assert g.eps <= 1.0 * (1 + 1e-9)
    # the same event without its (c, l) (a ledger written before they were recorded) is
    # costed by tight's generic form: sound, and above the Collision form's cost
    bare = ShuffledLocalDpEvent(event.local_mechanism, event.eps0, event.num_senders, event.delta)
    assert event_cost(bare, new.costing())[0] > g.eps


def test_tight_collision_rounds_compose_between_the_collision_pair_and_their_sum():
    from rknn_ray.accounting.shuffle_pld import histogram_lower_pair
    eps0, n, l, delta = 3.0, 400, 10, 1e-4
    bound = get_bound("tight", "collision", l=l, c=1)
    assert bound.has_pair
    per_round = bound.central_eps(eps0, n, delta)
    upper = round_pld(bound, eps0, n)
    # one round: the bound itself, plus the pair's coarser bucketing and the grid
    assert per_round * (1 - 1e-6) <= composed_eps(upper, 1, delta) <= 1.15 * per_round
    p = math.exp(eps0)
    a, keep = 1 / (p + l - 1), 1 - 1 / l
    lower = pld_from_pair(*histogram_lower_pair(p, n, a * keep, p * a * keep), pessimistic=False)
    for T in (2, 3):
        assert composed_eps(lower, T, T * delta) < composed_eps(upper, T, T * delta) \
            < 0.8 * T * per_round

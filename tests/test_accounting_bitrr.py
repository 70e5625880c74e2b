"""Tight shuffle amplification for the project's per-bit randomized response (kr = 1):
brute force over every data set of the other users at small n, its lower bound, and the
comparison with the generic eps0-LDP form."""
import itertools
import math

import numpy as np
import pytest

from rknn_ray.accounting import get_bound
from rknn_ray.accounting.events import event_from_dict
from rknn_ray.accounting.hockey import eps_for_delta
from rknn_ray.accounting.shuffled_rr import bitrr_pairs
from rknn_ray.accounting.tight import BlanketDelta, blanket_params
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms.randomized_response import rr_flip_probability, rr_output_probability
from tests.test_accounting_soundness import _divergence


def _bitrr_histograms(inputs, d, q):
    """Exact law of the shuffled multiset of the reports of one-hot inputs (cells), each bit
    flipped w.p. q: the sampler's own output law (rr_output_probability)."""
    outs = np.array(list(itertools.product((0, 1), repeat=d)), dtype=bool)
    law = {}
    for x in set(inputs):
        onehot = np.zeros((1, d), dtype=bool)
        onehot[0, x] = True
        law[x] = rr_output_probability(outs, onehot, q)[0]
    dist = {(): 1.0}
    for x in inputs:
        nxt = {}
        for hist, pr in dist.items():
            for y, py in enumerate(law[x]):
                key = tuple(sorted(hist + (y,)))
                nxt[key] = nxt.get(key, 0.0) + pr * py
        dist = nxt
    return dist


def _worst(n, d, eps0, eps):
    """max over every data set of users 2..n (multisets of cells) of the exact divergence,
    user 1 hot on cell 0 vs cell 1 (every pair of cells is alike up to relabelling)."""
    q = rr_flip_probability(eps0, 1, 1)
    return max(_divergence(_bitrr_histograms((0,) + others, d, q),
                           _bitrr_histograms((1,) + others, d, q), eps)
               for others in itertools.combinations_with_replacement(range(d), n - 1))


def _upper_delta(eps0, n, eps, method):
    p, px, pr, pc = blanket_params("bitrr", eps0, kr=1)
    est, up, _ = BlanketDelta(p, n, px, pr, pc, method=method).delta(eps)
    return est + up


@pytest.mark.parametrize("n,d,eps0", [(3, 4, 1.0), (4, 4, 2.0), (5, 3, 1.0), (4, 3, 4.0),
                                      (4, 3, 0.2), (3, 4, 6.0)])
def test_bitrr_dominates_brute_force_over_all_datasets(n, d, eps0):
    for eps in [e for e in (0.05, 0.3, 0.8 * eps0) if e < eps0]:
        worst = _worst(n, d, eps0, eps)
        assert worst > 0
        for method in ("exact", "fast"):
            up = _upper_delta(eps0, n, eps, method)
            assert up >= worst - 1e-12, (method, eps, up, worst)
    b = get_bound("tight", mechanism="bitrr", kr=1, d=d)
    e = b.central_eps(eps0, n, 1e-3)
    assert _worst(n, d, eps0, e) <= 1e-3 + 1e-12


@pytest.mark.parametrize("n,d,eps0", [(4, 3, 2.0), (3, 4, 1.0)])
def test_bitrr_lower_pairs_are_divergences_of_real_data_sets(n, d, eps0):
    """'others hot on h'' is that data set's exact divergence; the third-cell counts are a
    post-processing of 'others hot on h''' (never above its exact divergence)."""
    q = rr_flip_probability(eps0, 1, 1)
    exact_pair, *third = bitrr_pairs(eps0, n, d)
    assert len(third) == 2
    for eps in (0.05, 0.5, 0.8 * eps0):
        on_h1 = _divergence(_bitrr_histograms((0,) + (1,) * (n - 1), d, q),
                            _bitrr_histograms((1,) * n, d, q), eps)
        est, up, down = exact_pair.delta(eps)
        assert est - down <= on_h1 + 1e-12 and on_h1 <= est + up + 1e-12
        on_h2 = _divergence(_bitrr_histograms((0,) + (2,) * (n - 1), d, q),
                            _bitrr_histograms((1,) + (2,) * (n - 1), d, q), eps)
        for pd in third:
            est, _, down = pd.delta(eps)
            assert est - down <= on_h2 + 1e-12, (eps, est, on_h2)


def test_bitrr_bounds_a_flip_probability_at_most_the_samplers():
    """The bound is for a flip probability q at most the sampler's rounded-up q_s (whose
    reports are then a post-processing of q's), within 1e-14 of it: the per-bit ratio is
    (1-q)/q ~ e^{eps0/2}, and the blanket's kinds carry all of a report's mass."""
    for eps0 in (0.5, 1.0, 3.0, 8.0):
        q_s = rr_flip_probability(eps0, 1, 1)
        p, px, pr, pc = blanket_params("bitrr", eps0, kr=1)
        q = math.sqrt(px)                              # pi_x = q^2
        assert q <= q_s and q == pytest.approx(q_s, rel=1e-14)
        assert p == pytest.approx(((1 - q) / q) ** 2, rel=1e-14)
        assert p == pytest.approx(math.exp(eps0), rel=1e-13)
        assert (p + 1) * px + pr + p * pc == pytest.approx(1.0, abs=1e-15)


def test_bitrr_is_strictly_below_the_generic_form_and_above_its_lower_bound():
    b, g = get_bound("tight", mechanism="bitrr", kr=1, d=100), get_bound("tight")
    assert b.name == "tight_bitrr"
    for e0 in (1.0, 2.0, 4.0):
        up, gen = b.central_eps(e0, 1079, 1e-6), g.central_eps(e0, 1079, 1e-6)
        assert up < 0.9 * gen, (e0, up, gen)
    for n, e0 in ((1000, 0.5), (1000, 2.0), (100000, 2.0), (100000, 6.0)):
        lo, up = b.lower(e0, n, 1e-6), b.central_eps(e0, n, 1e-6)
        assert 0 < lo <= up, (n, e0, lo, up)
    # the lower bound is its own: not the generic binary-RR one (above it at n = 1079)
    assert b.lower(4.0, 1079, 1e-6) < get_bound("lower_bound").central_eps(4.0, 1079, 1e-6)


def test_bitrr_dominating_pair_dominates_the_bound():
    b = get_bound("tight", mechanism="bitrr", kr=1, d=100)
    n, e0 = 400, 2.0
    lp, lq = b.dominating_pair(e0, n)
    P, Q = np.exp(lp), np.exp(lq)
    assert P.sum() == pytest.approx(1.0, abs=1e-9) and Q.sum() == pytest.approx(1.0, abs=1e-9)
    for delta in (1e-3, 1e-6):
        e = b.central_eps(e0, n, delta)
        ee = math.exp(e)
        exact = _upper_delta(e0, n, e, "exact") - 1e-12
        assert np.sum(np.maximum(P - ee * Q, 0)) >= exact * (1 - 1e-9)
        assert np.sum(np.maximum(Q - ee * P, 0)) >= exact * (1 - 1e-9)


def test_bitrr_validated():
    with pytest.raises(ConfigError, match="generic"):
        get_bound("tight", mechanism="bitrr", kr=2, d=100)
    with pytest.raises(ConfigError):
        get_bound("tight", mechanism="bitrr", kr=1)
    with pytest.raises(ConfigError):
        get_bound("tight", mechanism="bitrr", kr=1, d=100, l=3)
    assert eps_for_delta(bitrr_pairs(1.0, 1079, 2)[0], 1e-6, 1.0, upper=False) > 0
    assert len(bitrr_pairs(1.0, 1079, 2)) == 1 and bitrr_pairs(1.0, 1, 5) == []
    assert get_bound("tight", mechanism="bitrr", kr=1, d=5).lower(1.0, 1, 1e-6) == 0.0


# ------------------------------------------------------------------ in the jobs

def _rr_round(k=1, n=1079, eps=1.0):
    from rknn_ray.mechanisms import MechanismParams, build
    return build("shuffle", "rr", MechanismParams(10, 10, k, eps, delta=1e-6, num_clients=n,
                                                  options={"bound": "tight"}))


def test_shuffle_rr_calibrates_with_the_bitrr_form_and_its_event_says_so():
    from rknn_ray.accounting.accountants import event_cost
    from rknn_ray.accounting.bound_choice import round_bound
    from rknn_ray.accounting.events import ShuffledLocalDpEvent
    mech = _rr_round()
    assert mech.bound.name == "tight_bitrr" and mech.randomizer_params == {"rr_kr": 1, "rr_d": 100}
    generic = round_bound("tight")
    assert mech.local_eps > generic.local_eps0(1.0, 1079, 1e-6) * 1.05  # a larger eps0
    event = mech.event()
    assert (event.rr_kr, event.rr_d) == (1, 100)
    assert round_bound("tight", "rr", 0, 0, 1, 100) is mech.bound
    eps, delta = event_cost(event, mech.costing())
    assert eps <= 1.0 * (1 + 1e-9) and delta == 1e-6
    # an event written before (kr, d) were recorded is costed by the generic form: sound,
    # and above its target at this eps0
    bare = ShuffledLocalDpEvent(event.local_mechanism, event.eps0, event.num_senders, event.delta)
    assert event_cost(bare, mech.costing())[0] == pytest.approx(
        generic.central_eps(event.eps0, event.num_senders, 1e-6), rel=1e-12)
    assert event_cost(bare, mech.costing())[0] > 1.05


def test_shuffle_rr_with_two_ones_falls_back_to_the_generic_form():
    from rknn_ray.accounting.accountants import event_cost
    from rknn_ray.accounting.bound_choice import round_bound
    mech = _rr_round(k=2)
    assert mech.bound is round_bound("tight") and mech.bound.name == "tight"
    event = mech.event()
    assert (event.rr_kr, event.rr_d) == (2, 100)           # recorded, costed generically
    assert event_cost(event, mech.costing())[0] <= 1.0 * (1 + 1e-9)
    assert round_bound("tight", "rr", 0, 0, 2, 100) is round_bound("tight")


def test_a_job_round_records_kr_and_d_and_its_saved_event_alone_costs_it(ray_session):
    """A real seeded digits shuffle round with privacy.mechanism=rr: the ledger row's saved
    event (JSON) is rebuilt and costed from itself alone, by the per-bit RR form."""
    import json

    from rknn_ray.accounting.accountants import Costing, event_cost
    from rknn_ray.accounting.bound_choice import round_bound
    from rknn_ray.accounting.events import costed_from_dict
    from tests.digits_rounds import digits_cfg, session_round
    cfg = digits_cfg("privacy.mechanism=rr", "privacy.eps=1.0")
    _, _, _, ledger, _ = session_round(cfg, job_id="job-bitrr")
    (entry,) = ledger.entries
    row = json.loads(json.dumps(entry.to_dict()))
    event, legacy = costed_from_dict(row["event"])
    assert legacy == {} and (event.rr_kr, event.rr_d) == (1, 10 * 10)
    costing = Costing.from_dict(row["accounting"])
    assert costing.bound == "tight"
    eps, delta = event_cost(event, costing)
    assert (eps, delta) == pytest.approx((row["eps"], row["delta"]), rel=1e-12)
    bitrr = round_bound("tight", "rr", 0, 0, 1, 100)
    assert bitrr.name == "tight_bitrr"
    assert eps == pytest.approx(bitrr.central_eps(event.eps0, event.num_senders, event.delta),
                                rel=1e-12)
    assert eps <= 1.0 * (1 + 1e-9)
    assert round_bound("tight").central_eps(event.eps0, event.num_senders, event.delta) > 1.05


def test_the_calibration_cache_keys_the_bitrr_form_apart_and_reuses_it(tmp_path, monkeypatch):
    from rknn_ray.accounting import calibration_cache as cc
    monkeypatch.setenv(cc.ENV, str(tmp_path))
    b, g = get_bound("tight", mechanism="bitrr", kr=1, d=100), get_bound("tight")
    kb, kg = cc.bound_key(b), cc.bound_key(g)
    assert kb is not None and kb != kg and kb["attrs"]["kr"] == 1 and kb["attrs"]["d"] == 100
    assert kb != cc.bound_key(get_bound("tight", mechanism="bitrr", kr=1, d=40))
    e0 = cc.cached_local_eps0(b, 1.0, 1079, 1e-6)
    (entry,) = list(tmp_path.glob("eps0-*.json"))
    assert e0 > cc.cached_local_eps0(g, 1.0, 1079, 1e-6)          # a second, generic entry
    assert len(list(tmp_path.glob("eps0-*.json"))) == 2
    monkeypatch.setattr(type(b), "local_eps0", lambda *a, **k: pytest.fail("recalibrated"))
    assert cc.cached_local_eps0(b, 1.0, 1079, 1e-6) == e0           # read back, checked


def test_the_budget_store_costs_a_saved_rr_event_by_its_recorded_kr_and_d(tmp_path):
    """The store recomputes every commit from its event: an rr round's event with (kr, d) = (1,
    100) is the bitrr cost, the same event saved before they were recorded the generic one."""
    from rknn_ray.accounting.accountants import Costing, event_cost
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.accounting.events import event_to_dict
    from rknn_ray.errors import LedgerError
    event = _rr_round().event()
    saved, costing = event_to_dict(event), Costing(bound="tight")
    legacy = {k: v for k, v in saved.items() if k not in ("rr_kr", "rr_d")}
    bitrr, generic = event_cost(event, costing), event_cost(event_from_dict(legacy), costing)
    assert bitrr[0] <= 1.0 * (1 + 1e-9) < 1.05 < generic[0]
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("ds", "d", "job", 5.0, 1e-4, (5.0, 1e-4))
    with pytest.raises(LedgerError, match="costs eps="):
        store.commit_round("ds", "job", 0, *generic, saved, accounting=costing)
    store.commit_round("ds", "job", 0, *bitrr, saved, accounting=costing)
    with pytest.raises(LedgerError, match="costs eps="):
        store.commit_round("ds", "job", 1, *bitrr, legacy, accounting=costing)
    store.commit_round("ds", "job", 1, *generic, legacy, accounting=costing)
    store.close_job("ds", "job", "done")
    assert store.composed("ds", "basic")[0] == pytest.approx(bitrr[0] + generic[0], rel=1e-12)


def test_the_amplification_cli_lists_the_bitrr_form_and_its_lower_bound(capsys):
    import json

    from benchmarks.amplification import main
    assert main(["--mechanism", "bitrr", "--d", "100", "--n", "1079", "--eps0", "2",
                 "--delta", "1e-6", "--json"]) == 0
    by = {r["bound"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(by)[:3] == ["lower_bound", "tight_bitrr", "tight"]
    assert "per-bit RR" in by["lower_bound"]["note"]
    assert 0 < by["lower_bound"]["eps"] <= by["tight_bitrr"]["eps"] < 0.8 * by["tight"]["eps"]
    assert main(["--mechanism", "bitrr", "--n", "1079", "--eps0", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --mechanism bitrr needs --d (the report length s * |Y|), e.g. --d 100"]

"""Audit of the real shuffled randomizers, and the simulated BSVS labeling error."""
import itertools
import math

import numpy as np
import pytest
from scipy import optimize, stats

from rknn_ray.accounting import BOUNDS, get_bound, variation_ratio_bound
from benchmarks.audit import (COMMON_CELL, DIFF_CELL, audit_binary_rr,
                                       audit_mechanism, binary_rr_pair_law, bsvs_answers,
                                       exact_pair_eps, law_eps, pair_class_probabilities,
                                       pair_report_classes, simulate_labeling_error,
                                       threshold_test)
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.collision import (collision_probabilities, decode_reports,
                                           encode_reports, hash_coefficients, poly_hash)
from rknn_ray.mechanisms.randomized_response import rr_output_probability

DELTA = 1e-6


def _shuffle(name, n=200, target=2.0):
    return build("shuffle", name, MechanismParams(2, 2, 1, target, delta=DELTA, num_clients=n))


def _claims(mech, n):
    e0 = mech.local_eps
    out = {"variation_ratio": BOUNDS["variation_ratio"].central_eps(e0, n, DELTA),
           "clones_numerical": BOUNDS["clones_numerical"].central_eps(e0, n, DELTA)}
    if mech.name == "collision":
        out["variation_ratio_collision"] = variation_ratio_bound(
            "collision", c=1, l=mech.l).central_eps(e0, n, DELTA)
    if mech.name == "rr":                # tight's per-bit RR form (kr = 1, d = 4 cells)
        out["tight_bitrr"] = get_bound("tight", "bitrr", kr=1, d=4).central_eps(e0, n, DELTA)
    return out


def _one_record(cell, m):
    return RecordAnswers(np.zeros((m, 1), np.int64), np.full((m, 1), cell, np.int64),
                         np.arange(m, dtype=np.int64), 2, 2)


# ------------------------------------------------------------ the test statistic is exact

def test_rr_plus_minus_is_the_exact_likelihood_ratio():
    """Over all 16 RR outputs: P[y | diff] / P[y | common] = e^{eps0 (plus - minus)}."""
    mech = build("local", "rr", MechanismParams(2, 2, 1, 1.7))
    outs = np.array(list(itertools.product([0, 1], repeat=4)), dtype=bool)
    inputs = np.zeros((2, 4), dtype=bool)
    inputs[0, DIFF_CELL] = inputs[1, COMMON_CELL] = True
    P = rr_output_probability(outs, inputs, mech.flip_probability)
    plus, minus = pair_report_classes(mech, np.packbits(outs, axis=1))
    np.testing.assert_allclose(P[0] / P[1], np.exp(1.7 * (plus.astype(int) - minus)), rtol=1e-12)
    # and the exact class probabilities are the summed output probabilities
    (a, b), (a0, b0) = pair_class_probabilities(mech)
    assert P[1][plus].sum() == pytest.approx(a) and P[1][minus].sum() == pytest.approx(b)
    assert P[0][plus].sum() == pytest.approx(a0) and P[0][minus].sum() == pytest.approx(b0)


def test_collision_plus_minus_is_the_exact_likelihood_ratio():
    """For fixed seeds and every z: P[z | diff, H] / P[z | common, H] = e^{eps0 (+ - -)}."""
    mech = build("local", "collision", MechanismParams(2, 2, 1, 2.3))
    o = mech.oracle
    seeds = np.random.default_rng(3).integers(0, 1 << 64, size=40, dtype=np.uint64)
    hashed = poly_hash(hash_coefficients(seeds, o.tag, o.degree), np.arange(o.d), o.l)
    for i, seed in enumerate(seeds):
        z = np.arange(o.l)
        pay = encode_reports(np.full(o.l, seed, np.uint64), [z], [o.z_bytes])
        plus, minus = pair_report_classes(mech, pay)
        ratio = (collision_probabilities(o.eps, o.l, 1, [hashed[i, DIFF_CELL]])
                 / collision_probabilities(o.eps, o.l, 1, [hashed[i, COMMON_CELL]]))
        np.testing.assert_allclose(ratio, np.exp(2.3 * (plus.astype(int) - minus)), rtol=1e-12)
        assert decode_reports(pay, [o.z_bytes])[0][0] == seed


@pytest.mark.parametrize("name", ["rr", "collision"])
def test_class_frequencies_of_the_real_randomizer_match_exact(name):
    """On the secure path's randomness: a client's ChaCha20 stream (rknn_ray.rng)."""
    from rknn_ray.rng import derived_generator
    mech = build("local", name, MechanismParams(2, 2, 1, 2.0))
    rng = derived_generator(b"\x07" * 32, "job", 0, 0)
    m = 200_000
    for cell, (pa, pb) in zip((COMMON_CELL, DIFF_CELL), pair_class_probabilities(mech)):
        plus, minus = pair_report_classes(mech, mech.randomize(_one_record(cell, m), rng).payloads)
        for k, p in ((plus.sum(), pa), (minus.sum(), pb)):
            assert abs(k - m * p) < 5 * math.sqrt(m * p * (1 - p)), (name, cell, k, m * p)


def test_exact_pair_eps_equals_brute_force_over_multisets():
    """n = 3 real-RR users: enumerate all 16^3 output tuples, group into multisets."""
    mech = build("local", "rr", MechanismParams(2, 2, 1, 2.0))
    outs = np.array(list(itertools.product([0, 1], repeat=4)), dtype=bool)
    inputs = np.zeros((2, 4), dtype=bool)
    inputs[0, DIFF_CELL] = inputs[1, COMMON_CELL] = True
    pd, pc = rr_output_probability(outs, inputs, mech.flip_probability)
    P0, P1 = {}, {}
    for t in itertools.product(range(16), repeat=3):
        key = tuple(sorted(t))
        P0[key] = P0.get(key, 0.0) + pd[t[0]] * pc[t[1]] * pc[t[2]]
        P1[key] = P1.get(key, 0.0) + pc[t[0]] * pc[t[1]] * pc[t[2]]
    p0, p1 = np.array([P0[k] for k in P0]), np.array([P1[k] for k in P0])
    delta = 1e-3

    def d(e):
        return max(np.maximum(p0 - math.exp(e) * p1, 0).sum(),
                   np.maximum(p1 - math.exp(e) * p0, 0).sum()) - delta

    brute = optimize.brentq(d, 0.0, 3.0, xtol=1e-12)
    common, diff = pair_class_probabilities(mech)
    assert exact_pair_eps(3, common, diff, delta, 3.0) == pytest.approx(brute, abs=1e-8)


@pytest.mark.parametrize("n,eps0", [(50, 2.0), (1000, 4.0)])
def test_binary_rr_pair_is_the_lower_bound_pair(n, eps0):
    """Binary RR as a (+, -) pair with no neutral report: both exact laws give the
    project's exact lower bound."""
    lb = BOUNDS["lower_bound"].central_eps(eps0, n, DELTA)
    _, P0, P1 = binary_rr_pair_law(n, eps0)
    assert law_eps(P0, P1, DELTA, eps0 + 1) == pytest.approx(lb, rel=1e-5)
    f = 1 / (math.exp(eps0) + 1)
    assert exact_pair_eps(n, (f, 1 - f), (1 - f, f), DELTA, eps0 + 1) == pytest.approx(lb, rel=1e-5)


# ------------------------------------------------------------ the audit

@pytest.mark.parametrize("name,trials", [("rr", 20_000), ("collision", 10_000)])
def test_real_shuffled_audit_positive_and_below_claims(name, trials):
    mech, n = _shuffle(name), 200
    claims = _claims(mech, n)
    a = audit_mechanism(mech, n, DELTA, claims, trials=trials, rng=np.random.default_rng(5))
    assert a.mechanism == name and a.model == "shuffle" and a.eps0 == mech.local_eps
    assert a.red_flags == []
    assert 0.02 < a.eps_lower_empirical <= a.eps_pair_exact
    # the exact eps of the audited pair is itself below every claimed upper bound
    assert a.eps_pair_exact < min(claims.values())
    assert claims["clones_numerical"] == pytest.approx(2.0, rel=1e-3)   # the calibrated target
    assert a.eps_lb_max > 5 and a.p0_hat > a.p1_hat
    # the audit reaches the power its trial count allows (counts at their means)
    assert abs(a.eps_lower_empirical - a.eps_lb_expected) < 0.08


def test_binary_rr_reference_audit_matches_its_power():
    a = audit_binary_rr(1000, 4.0, DELTA, {}, trials=400_000, rng=np.random.default_rng(4))
    assert a.eps_pair_exact == pytest.approx(BOUNDS["lower_bound"].central_eps(4.0, 1000, DELTA),
                                             rel=1e-5)
    assert 0.1 < a.eps_lower_empirical < a.eps_pair_exact
    assert abs(a.eps_lower_empirical - a.eps_lb_expected) < 0.1


def test_false_claim_is_flagged():
    mech, n = _shuffle("rr"), 200
    a = audit_mechanism(mech, n, DELTA, {"too_small": 0.01, **_claims(mech, n)},
                        trials=20_000, rng=np.random.default_rng(6))
    assert a.eps_lower_empirical > 0.01
    assert a.red_flags == ["too_small", "too_small (exact pair eps)"]


def test_local_mechanism_audit_at_given_eps0():
    mech, n = build("local", "rr", MechanismParams(2, 2, 1, 4.0)), 200
    a = audit_mechanism(mech, n, DELTA, {"eps0 itself": 4.0}, trials=20_000,
                        rng=np.random.default_rng(7))
    assert a.model == "local" and a.red_flags == []
    assert 0.3 < a.eps_lower_empirical <= a.eps_pair_exact < 4.0


def test_threshold_test_on_identical_laws_certifies_nothing():
    rng = np.random.default_rng(8)
    s = rng.binomial(100, 0.3, size=(2, 40_000)).astype(float)
    assert threshold_test(s[0], s[1], DELTA)[-1] < 0.1


def test_audit_refuses_unsupported_inputs():
    with pytest.raises(ConfigError, match="k = r = 1"):
        audit_mechanism(build("local", "rr", MechanismParams(2, 2, 2, 1.0)), 10, DELTA, {}, 10)
    with pytest.raises(ConfigError, match="n >= 2"):
        audit_mechanism(build("local", "rr", MechanismParams(2, 2, 1, 1.0)), 1, DELTA, {}, 10)


# ------------------------------------------------------------ labeling error

def test_bsvs_answers_profile():
    a = bsvs_answers(1000, 2, 10)
    c = a.counts()
    assert c.sum() == 1000 and a.num_clients == 1000 and (a.k, a.r) == (1, 1)
    assert c[0, 0] == 150 and c[0, 1] == 100 and c[1, 1] == 150 and c[1, 2] == 100
    assert c[0, 2:].min() >= 31 and c[0, 2:].max() <= 32


@pytest.mark.parametrize("name", ["rr", "collision"])
def test_simulated_error_within_the_theoretical_bound(name):
    """The real mechanism's sup error exceeds its (eta, beta) bound at most at rate beta."""
    beta, n, trials = 0.05, 2000, 60
    ans = bsvs_answers(n, 2, 10)
    mech = build("local", name, MechanismParams(2, 10, 1, 2.0))
    r = simulate_labeling_error(mech, ans, trials, np.random.default_rng(9), beta)
    buckets = r["buckets"]
    assert buckets == 2 * trials and r["trials"] == trials
    assert r["eta_theory"] == mech.error_bound(beta, n)
    # allowed: Bin(buckets, beta) exceedances; fail only if implausibly many
    cap = stats.binom.ppf(0.999, buckets, beta)
    assert r["exceed_count"] <= cap and r["exceed_bernstein_count"] <= cap
    assert r["sup_err_q"] < min(r["eta_bernstein"], r["eta_theory"])
    # the error is real noise, not zero: its size matches the per-cell standard deviation
    v1, v0 = mech.flat_variances()
    sd = math.sqrt(n * max(v1, v0))
    assert 0.5 * sd < r["sup_err_mean"] < 4 * sd
    assert 0 <= r["label_error_sim"] <= 1

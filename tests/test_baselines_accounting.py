"""Each baseline's accounting against its paper's formulas, closed forms and dp_accounting."""
import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from rknn_ray.baselines.common import RDP_ORDERS, rdp_epsilon
from rknn_ray.baselines.dpdfd import candidate_set, selective_rr, selective_rr_distribution
from rknn_ray.baselines.dpsgd import calibrate_noise_multiplier, dpsgd_epsilon
from rknn_ray.baselines.nfdp import largest_k, nfdp_epsilon_delta, table2_printed_eps
from rknn_ray.baselines.pate import (calibrate_pate, gnmax_data_dependent_epsilon, gnmax_q_bound,
                                     pate_epsilon)
from rknn_ray.baselines.private_knn import calibrate_sigma, private_knn_epsilon

# ----------------------------------------------------------------------------- FedMD-NFDP

# paper 003 Table 2 as printed: (n, k as printed, k that matches, eps printed, delta printed)
TABLE2 = [(2880, 16, 18, 0.0027, 0.0062), (2880, 60, 60, 0.0090, 0.0206),
          (2880, 300, 300, 0.0452, 0.0989), (2880, 2880, 2880, 0.4342, 0.6321),
          (300, 16, 18, 0.0260, 0.0583), (300, 60, 60, 0.0867, 0.1815),
          (300, 120, 120, 0.1734, 0.3301), (300, 300, 300, 0.4336, 0.6327)]
# the corrected (natural-log) epsilons of the same rows, Theorem 2
CORRECTED = {(2880, 18): 0.00625, (2880, 60): 0.02083, (2880, 300): 0.10415,
             (2880, 2880): 0.99983, (300, 18): 0.05990, (300, 60): 0.19967,
             (300, 120): 0.39933, (300, 300): 0.99834}


@pytest.mark.parametrize("n,k_printed,k,eps_printed,delta_printed", TABLE2)
def test_nfdp_table2_is_log10_and_natural_log_is_ln10_times_larger(n, k_printed, k, eps_printed,
                                                                  delta_printed):
    assert table2_printed_eps(k, n) == pytest.approx(eps_printed, abs=6e-5)
    if k != k_printed:      # the "k=16" rows do not match k=16 (they match k=18)
        assert abs(table2_printed_eps(k_printed, n) - eps_printed) > 1e-4
    eps, delta = nfdp_epsilon_delta(k, n, replacement=True)
    assert eps == pytest.approx(CORRECTED[(n, k)], abs=6e-6)
    assert eps == pytest.approx(math.log(10) * table2_printed_eps(k, n), rel=1e-12)
    assert delta == pytest.approx(delta_printed, abs=1.5e-4)


def test_nfdp_theorems_closed_forms():
    n, k = 100, 10
    assert nfdp_epsilon_delta(k, n, False) == pytest.approx((math.log(101 / 91), 0.1))
    assert nfdp_epsilon_delta(k, n, True) == pytest.approx((10 * math.log(1.01), 1 - 0.99 ** 10))
    # Lemma 1: with replacement is more private than without, for every k <= n
    for kk in range(2, n + 1):
        w, wo = nfdp_epsilon_delta(kk, n, True), nfdp_epsilon_delta(kk, n, False)
        assert w[0] <= wo[0] + 1e-12 and w[1] <= wo[1] + 1e-12
    # delta ~ k/n: far above 1/n as soon as k > 1
    assert nfdp_epsilon_delta(5, 1000, True)[1] > 4.9 / 1000


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("target", [0.01, 0.1, 1.0, 4.0])
def test_nfdp_largest_k_is_largest(replacement, target):
    n = 108
    k = largest_k(target, n, replacement)
    if k >= 1:
        assert nfdp_epsilon_delta(k, n, replacement)[0] <= target + 1e-12
    if replacement or k < n:
        assert nfdp_epsilon_delta(k + 1, n, replacement)[0] > target


# ----------------------------------------------------------------------------- PATE

def laplace_rdp(order, scale):
    """Mironov 2017, Prop. 6: RDP of the unit-sensitivity Laplace mechanism."""
    a, b = order, scale
    return math.log(a / (2 * a - 1) * math.exp((a - 1) / b)
                    + (a - 1) / (2 * a - 1) * math.exp(-a / b)) / (a - 1)


@pytest.mark.parametrize("scale,queries", [(5.0, 10), (30.0, 30), (100.0, 200)])
def test_lnmax_rdp_is_two_laplace_per_query(scale, queries):
    delta = 1e-5
    orders = list(RDP_ORDERS)
    closed = [2 * queries * laplace_rdp(a, scale) for a in orders]
    expected = rdp.compute_epsilon(orders, closed, delta)[0]
    eps, dlt = pate_epsilon("lnmax", scale, queries, delta)
    pure = 2 * queries / scale
    assert eps == pytest.approx(min(expected, pure), rel=1e-9)
    assert dlt == (0.0 if pure <= expected else delta)


@pytest.mark.parametrize("sigma,queries", [(5.0, 10), (40.0, 200), (150.0, 1000)])
def test_gnmax_rdp_matches_closed_form(sigma, queries):
    delta = 1e-5
    orders = list(RDP_ORDERS)
    closed = [queries * a / sigma ** 2 for a in orders]     # alpha/sigma^2 per query (L2 = sqrt 2)
    expected = rdp.compute_epsilon(orders, closed, delta)[0]
    assert pate_epsilon("gnmax", sigma, queries, delta)[0] == pytest.approx(expected, rel=1e-9)
    # the classic conversion (Mironov Prop. 3) is never tighter than dp_accounting's
    classic = min(c + math.log(1 / delta) / (a - 1) for a, c in zip(orders, closed))
    assert expected <= classic + 1e-9


@pytest.mark.parametrize("agg", ["lnmax", "gnmax"])
@pytest.mark.parametrize("target", [0.1, 1.0, 4.0])
def test_pate_calibration_meets_target(agg, target):
    noise = calibrate_pate(agg, target, 30, 1e-5)
    eps = pate_epsilon(agg, noise, 30, 1e-5)[0]
    assert eps <= target * (1 + 1e-9)
    assert pate_epsilon(agg, noise * 0.98, 30, 1e-5)[0] > target    # and is (nearly) the least


def test_gnmax_data_dependent_is_no_looser_and_tight_on_consensus():
    sigma, delta = 20.0, 1e-5
    hist = np.zeros((100, 10))
    hist[:, 0] = 250            # strong consensus of 250 teachers
    q = gnmax_q_bound(hist, sigma)
    assert np.all(q < 1e-10)
    dd = gnmax_data_dependent_epsilon(hist, sigma, delta)
    di = pate_epsilon("gnmax", sigma, 100, delta)[0]
    classic_di = min(100 * a / sigma ** 2 + math.log(1 / delta) / (a - 1) for a in RDP_ORDERS)
    assert dd < 0.5 * di and dd <= classic_di
    split = np.zeros((100, 10))
    split[:, :2] = 125          # no consensus: falls back to the data-independent bound
    assert gnmax_data_dependent_epsilon(split, sigma, delta) == pytest.approx(classic_di, rel=1e-9)


# ----------------------------------------------------------------------------- Private-kNN

def test_private_knn_is_subsampled_gaussian_in_dp_accounting():
    gamma, sigma, Q, delta = 0.15, 4.0, 30, 1e-5
    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(dp_event.PoissonSampledDpEvent(gamma, dp_event.GaussianDpEvent(sigma / math.sqrt(2))), Q)
    assert private_knn_epsilon(gamma, sigma, Q, delta) == pytest.approx(acc.get_epsilon(delta),
                                                                          rel=1e-12)
    # gamma = 1 is GNMax without subsampling; subsampling only helps
    assert private_knn_epsilon(1.0, sigma, Q, delta) == pytest.approx(
        pate_epsilon("gnmax", sigma, Q, delta)[0], rel=1e-9)
    assert private_knn_epsilon(gamma, sigma, Q, delta) < private_knn_epsilon(1.0, sigma, Q, delta)


def test_calibration_stops_at_its_relative_tolerance_and_never_overspends():
    """Bisection in log space to ``rel_tol`` (each RDP evaluation costs ~0.3 s): the noise
    returned meets the target, is within a factor 1 + rel_tol of the smallest that does, and
    took ~log2(ln(hi/lo) / rel_tol) evaluations, not a fixed 45-60."""
    from rknn_ray.baselines.common import calibrate_decreasing
    calls = []

    def eps_of(x):
        calls.append(x)
        return 3.0 / x
    x = calibrate_decreasing(eps_of, 0.5, lo=1e-2, hi=1e5, rel_tol=1e-6)
    assert eps_of(x) <= 0.5 and 6.0 <= x <= 6.0 * (1 + 1.01e-6)
    assert len(calls) - 1 <= 2 + math.ceil(math.log2(math.log(1e7) / 1e-6))   # 26 of them
    tight = calibrate_decreasing(lambda v: 3.0 / v, 0.5, lo=1e-2, hi=1e5, rel_tol=1e-12)
    assert 6.0 <= tight <= x


def test_private_knn_calibration():
    s = calibrate_sigma(1.0, 0.15, 30, 1e-5)
    assert private_knn_epsilon(0.15, s, 30, 1e-5) <= 1.0 + 1e-9
    assert private_knn_epsilon(0.15, s * 0.97, 30, 1e-5) > 1.0


# ----------------------------------------------------------------------------- DP-SGD

def test_dpsgd_epsilon_is_dp_accounting():
    q, sigma, steps, delta = 64 / 1079, 1.1, 250, 1e-5
    ev = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma)), steps)
    acc = rdp.RdpAccountant(list(RDP_ORDERS))
    acc.compose(ev)
    assert dpsgd_epsilon(q, sigma, steps, delta, "rdp") == pytest.approx(acc.get_epsilon(delta),
                                                                        rel=1e-12)
    # PLD is an upper bound too, and tighter than RDP here
    pld = dpsgd_epsilon(q, sigma, steps, delta, "pld")
    assert 0.5 * acc.get_epsilon(delta) < pld <= acc.get_epsilon(delta) * 1.01
    # Abadi et al.'s moments accountant reference point: q=0.01, sigma=4, 10k steps -> eps ~1.2..1.3
    assert 1.0 < dpsgd_epsilon(0.01, 4.0, 10000, 1e-5, "rdp") < 1.35


def test_dpsgd_calibration_meets_target():
    q, steps = 64 / 1079, 253
    s = calibrate_noise_multiplier(1.0, q, steps, 1e-5)
    assert dpsgd_epsilon(q, s, steps, 1e-5) <= 1.0 + 1e-9
    assert dpsgd_epsilon(q, s * 0.97, steps, 1e-5) > 1.0


def test_rdp_epsilon_of_gaussian_closed_form():
    # one Gaussian with noise multiplier z: RDP alpha/(2 z^2)
    z, delta = 2.0, 1e-5
    closed = [a / (2 * z * z) for a in RDP_ORDERS]
    assert rdp_epsilon(dp_event.GaussianDpEvent(z), delta) == pytest.approx(
        rdp.compute_epsilon(list(RDP_ORDERS), closed, delta)[0], rel=1e-9)


# ----------------------------------------------------------------------------- DP-DFD

def test_candidate_set_threshold_and_top2_fallback():
    C = 10
    uniform = np.full(C, 0.1)
    assert candidate_set(uniform).all()                 # 0.1 > 1/(2*10)
    peaked = np.array([0.9] + [0.1 / 9] * 9)
    m = candidate_set(peaked)
    assert m.sum() == 2 and m[0]                         # only one above 0.05 -> top two
    three = np.array([0.4, 0.3, 0.2] + [0.1 / 7] * 7)
    assert candidate_set(three).sum() == 3


@pytest.mark.parametrize("eps", [0.1, 1.0, 4.0])
def test_selective_rr_is_eps_label_dp(eps):
    """For every candidate set and every pair of teacher labels, every output's
    probability ratio is <= e^eps (label DP per query)."""
    rng = np.random.default_rng(0)
    C = 6
    for _ in range(50):
        prior = rng.dirichlet(np.full(C, 0.5))
        mask = candidate_set(prior)
        dists = np.array([selective_rr_distribution(t, mask, eps) for t in range(C)])
        assert np.allclose(dists.sum(1), 1.0)
        assert np.all(dists[:, ~mask] == 0)
        on = dists[:, mask]
        ratio = on[:, None, :] / on[None, :, :]
        assert ratio.max() <= math.exp(eps) * (1 + 1e-12)
    # the randomized labels follow that distribution
    t = np.zeros(20000, np.int64)
    labels, sizes = selective_rr(t, np.full((20000, C), 1.0 / C), 1.0, np.random.default_rng(1))
    assert (sizes == C).all()
    assert np.mean(labels == 0) == pytest.approx(math.e / (math.e + C - 1), abs=0.01)

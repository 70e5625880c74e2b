"""Multi-message (NB shares + flooding) calibration: exact per-cell pair, calibration."""
import math

import numpy as np
import pytest
from scipy import stats

from rknn_ray.accounting.multi_message import (FLOOD_SHAPES, POISSON, _pmfs,
                                               calibrate_multi_message, dlap_limit_eps,
                                               protocol_eps, smallest_flood_mean)
from rknn_ray.errors import ConfigError


def _exact_view_delta(p, mu, eps, shift, shape=0.0):
    """Brute force: hockey-stick of (x+G+F, G'+F) for x=0 vs x=shift on a 2-D grid
    (F Poisson(mu), or NB with mean mu and shape ``shape``)."""
    A = 140
    f = (stats.poisson.pmf(np.arange(A), mu) if shape == 0 else
         stats.nbinom.pmf(np.arange(A), shape, shape / (mu + shape)))
    geo = (1 - p) * p ** np.arange(A)

    def view(x):
        P = np.zeros((A, A))
        for ff in range(A):
            for gp in range(A - ff - x):
                P[x + gp + ff, ff:A] += f[ff] * geo[gp] * geo[: A - ff]
        return P
    P0, P1 = view(0), view(shift)
    return max(np.maximum(P0 - math.exp(eps) * P1, 0).sum(), np.maximum(P1 - math.exp(eps) * P0, 0).sum())


def _pair_delta(p, mu, eps, shape=0.0):
    P, Q = _pmfs(p, mu, shape)
    keys = set(P) | set(Q)
    e = lambda d, k: math.exp(d[k]) if k in d else 0.0  # noqa: E731
    return max(sum(max(0.0, e(P, k) - math.exp(eps) * e(Q, k)) for k in keys),
               sum(max(0.0, e(Q, k) - math.exp(eps) * e(P, k)) for k in keys))


@pytest.mark.parametrize("p,mu", [(0.5, 3.0), (0.7, 8.0)])
def test_per_cell_pair_equals_brute_force_view(p, mu):
    """The reduced outcome space {low, u} loses nothing: deltas agree with the 2-D view."""
    for eps in (0.0, 0.2, 0.5, -math.log(p)):
        assert _pair_delta(p, mu, eps) == pytest.approx(_exact_view_delta(p, mu, eps, 1), abs=1e-9)


def test_flooding_buys_privacy_and_limit_is_dlap():
    p = math.exp(-0.1)
    e_small = protocol_eps(p, 20.0, 2, 1e-6)
    e_big = protocol_eps(p, 5000.0, 2, 1e-6)
    limit = dlap_limit_eps(p, 2, 1e-6)
    assert e_small > e_big >= limit - 1e-3


def test_nb_shares_sum_to_discrete_laplace():
    """n NB(1/n, p) shares per sign: the +/- difference is DLap(p) (variance 2p/(1-p)^2)."""
    rng = np.random.default_rng(0)
    p, n, trials = 0.8, 50, 200_000
    plus = rng.negative_binomial(1.0 / n, 1 - p, size=(trials, n)).sum(1)
    minus = rng.negative_binomial(1.0 / n, 1 - p, size=(trials, n)).sum(1)
    z = plus - minus
    assert abs(z.mean()) < 0.05
    assert z.var() == pytest.approx(2 * p / (1 - p) ** 2, rel=0.03)
    # pmf of DLap: (1-p)/(1+p) p^|z|
    assert np.mean(z == 0) == pytest.approx((1 - p) / (1 + p), abs=0.005)


def test_calibration_meets_target_and_reports_parameters():
    c = calibrate_multi_message(1.0, 1e-6, n=1000, sensitivity_l1=4, num_cells=200)
    assert c.eps <= 1.0 and c.eps > 0.9
    assert protocol_eps(c.dlap_p, c.flood_mean_total, 4, 1e-6, c.flood_shape) <= 1.0
    assert c.nb_shape == pytest.approx(1e-3) and c.nb_success_prob == pytest.approx(1 - c.dlap_p)
    assert c.error_variance == pytest.approx(2 * c.dlap_p / (1 - c.dlap_p) ** 2)
    # within 25% of central Laplace(L1/eps) error (scale 4), far below Laplace(4kr/eps)
    assert c.laplace_equivalent_scale < 1.25 * 4.0
    expected = 200 * (2 * c.dlap_p / (1 - c.dlap_p) + 2 * c.flood_mean_total) / 1000
    assert c.noise_messages_per_client == pytest.approx(expected)
    with pytest.raises(ConfigError):
        calibrate_multi_message(1.0, 2.0, n=10, sensitivity_l1=2, num_cells=4)


@pytest.mark.parametrize("p,mu,shape", [(0.5, 3.0, 2.0), (0.7, 8.0, 4.0), (0.6, 10.0, 16.0)])
def test_nb_flooding_pair_equals_brute_force_view(p, mu, shape):
    """Negative-binomial flooding: the reduced pair (P, Q) is still exact -- its hockey-stick
    divergence equals the 2-D view's, for both directions and several eps."""
    for eps in (0.0, 0.2, 0.5, -math.log(p)):
        assert _pair_delta(p, mu, eps, shape) == pytest.approx(
            _exact_view_delta(p, mu, eps, 1, shape), abs=1e-9)


def test_nb_pair_is_the_likelihood_ratio_of_the_view():
    """The pair's privacy-loss values are the view's: on each outcome (a, b) of the 2-D view
    the ratio P_0/P_1 equals the pair's ratio for that outcome's class (low or u = a)."""
    p, mu, shape, A = 0.6, 6.0, 3.0, 90
    f = stats.nbinom.pmf(np.arange(A), shape, shape / (mu + shape))
    geo = (1 - p) * p ** np.arange(A)
    P, Q = _pmfs(p, mu, shape)

    def prob(x, a, b):
        return sum(f[ff] * geo[a - x - ff] * geo[b - ff] for ff in range(min(a - x, b) + 1))
    for a in range(1, 25):
        for b in range(0, 25):
            ratio = prob(0, a, b) / prob(1, a, b)
            key = "low" if b <= a - 1 else a
            assert math.log(ratio) == pytest.approx(P[key] - Q[key], abs=1e-9)


def test_nb_flooding_reaches_the_same_guarantee_with_fewer_messages():
    """At the DLap parameter the calibration fixes, the smallest NB flood mean that meets
    (eps, delta) is well below the smallest Poisson one; both meet it exactly."""
    p, eps, delta = math.exp(-0.85 * 0.5), 1.0, 1e-6
    mu_poisson = smallest_flood_mean(p, POISSON, 2, eps, delta)
    mu_nb = smallest_flood_mean(p, 16.0, 2, eps, delta)
    assert protocol_eps(p, mu_nb, 2, delta, 16.0) <= eps
    assert protocol_eps(p, mu_poisson, 2, delta, POISSON) <= eps
    assert protocol_eps(p, mu_nb / 1.05, 2, delta, 16.0) > eps     # the smallest, to 2-5%
    assert mu_nb < 0.5 * mu_poisson


def test_calibration_keeps_the_law_with_the_fewest_messages():
    c = calibrate_multi_message(1.0, 1e-6, n=1000, sensitivity_l1=2, num_cells=100)
    means = {r: smallest_flood_mean(c.dlap_p, r, 2, 1.0, 1e-6) for r in FLOOD_SHAPES}
    assert c.flood_mean_total == pytest.approx(min(m for m in means.values() if m))
    assert c.flood_shape == min(means, key=lambda r: means[r])
    assert protocol_eps(c.dlap_p, c.flood_mean_total, 2, 1e-6, c.flood_shape) == c.eps <= 1.0
    only_poisson = calibrate_multi_message(1.0, 1e-6, n=1000, sensitivity_l1=2, num_cells=100,
                                           flood_shapes=(POISSON,))
    assert only_poisson.flood_shape == POISSON
    assert c.noise_messages_per_client < 0.5 * only_poisson.noise_messages_per_client


@pytest.mark.parametrize("p,mu,shape", [(0.5, 3.0, POISSON), (0.7, 8.0, POISSON),
                                        (0.6, 40.0, 2.0), (0.9, 200.0, POISSON)])
def test_the_pair_s_pld_is_the_library_s_to_the_bit(p, mu, shape):
    """multi_message._pld_of_pair rebuilds dp_accounting's from_two_probability_mass_functions
    with arrays, in the library's order of additions: the same losses, masses and infinity mass
    (a dp_accounting that changes its internals fails here, not silently in a guarantee)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib
    from rknn_ray.accounting.multi_message import _pld_of_pair
    P, Q = _pmfs(p, mu, shape)
    for lower, upper in ((P, Q), (Q, P)):
        with np.errstate(over="ignore"):
            ours = _pld_of_pair(pld_lib, lower, upper, 1e-4)
            lib = pld_lib.from_two_probability_mass_functions(
                lower, upper, value_discretization_interval=1e-4)
        a, b = ours._pmf_remove, lib._pmf_remove
        assert a._infinity_mass == b._infinity_mass
        assert type(a) is type(b)
        if hasattr(a, "_loss_probs"):          # sparse: the same losses, in the same order
            assert list(a._loss_probs.items()) == list(b._loss_probs.items())
        else:                                  # dense: the same grid and masses
            assert a._lower_loss == b._lower_loss and np.array_equal(a._probs, b._probs)
        eps = [0.1, 0.5, 1.0, 2.0]
        assert ours.get_delta_for_epsilon(eps).tolist() == lib.get_delta_for_epsilon(eps).tolist()

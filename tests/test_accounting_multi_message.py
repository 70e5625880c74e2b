"""Multi-message (NB shares + flooding) calibration: exact per-cell pair, calibration."""
import math

import numpy as np
import pytest
from scipy import stats

from rknn_ray.accounting.multi_message import (_pmfs, calibrate_multi_message,
                                               dlap_limit_eps, protocol_eps)
from rknn_ray.errors import ConfigError


def _exact_view_delta(p, mu, eps, shift):
    """Brute force: hockey-stick of (x+G+F, G'+F) for x=0 vs x=shift on a 2-D grid."""
    A = 140
    f = stats.poisson.pmf(np.arange(A), mu)
    geo = (1 - p) * p ** np.arange(A)

    def view(x):
        P = np.zeros((A, A))
        for ff in range(A):
            for gp in range(A - ff - x):
                P[x + gp + ff, ff:A] += f[ff] * geo[gp] * geo[: A - ff]
        return P
    P0, P1 = view(0), view(shift)
    return max(np.maximum(P0 - math.exp(eps) * P1, 0).sum(), np.maximum(P1 - math.exp(eps) * P0, 0).sum())


def _pair_delta(p, mu, eps):
    P, Q = _pmfs(p, mu)
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
    assert protocol_eps(c.dlap_p, c.flood_mean_total, 4, 1e-6) <= 1.0
    assert c.nb_shape == pytest.approx(1e-3) and c.nb_success_prob == pytest.approx(1 - c.dlap_p)
    assert c.error_variance == pytest.approx(2 * c.dlap_p / (1 - c.dlap_p) ** 2)
    # within 25% of central Laplace(L1/eps) error (scale 4), far below Laplace(4kr/eps)
    assert c.laplace_equivalent_scale < 1.25 * 4.0
    expected = 200 * (2 * c.dlap_p / (1 - c.dlap_p) + 2 * c.flood_mean_total) / 1000
    assert c.noise_messages_per_client == pytest.approx(expected)
    with pytest.raises(ConfigError):
        calibrate_multi_message(1.0, 2.0, n=10, sensitivity_l1=2, num_cells=4)

"""Shuffle-model mechanisms: single message at an amplified eps0, multi-message noise."""
import math

import numpy as np
import pytest

from rknn_ray.accounting import BOUNDS
from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.mechanisms.shuffle_multi import decode_messages, encode_messages
from rknn_ray.rng import seeded_generator
from rknn_ray.accounting.guarantee import guarantee_of


def one_per_client(rng, n, s=10, c=10, k=1):
    nb = np.argsort(rng.random((n, s)), axis=1)[:, :k]
    return RecordAnswers(nb, rng.integers(0, c, (n, 1)), np.arange(n), s, c)


@pytest.mark.parametrize("name", ["rr", "collision"])
def test_single_message_eps0_and_sender_floor(name):
    n, target, delta = 20000, 1.0, 1e-6
    mech = build("shuffle", name, MechanismParams(10, 10, 1, target, delta=delta, num_clients=n))
    eps0 = mech.local_eps
    assert eps0 > target                     # amplification buys a larger local eps
    bound = BOUNDS[mech.bound_name]
    assert bound.central_eps(eps0, n, delta) <= target * (1 + 1e-9)
    floor = mech.min_senders()
    assert floor <= n
    assert mech.central_eps(floor) <= target * (1 + 1e-9) < mech.central_eps(floor - 1)
    g = guarantee_of(mech, n)
    assert (g.model, g.unit, g.n, g.delta) == ("shuffle", "record", n, delta)
    with pytest.raises(PrivacyBudgetError, match="Round refused"):
        guarantee_of(mech, floor - 1)


def test_single_message_estimator_unbiased_at_eps0():
    rng = np.random.default_rng(0)
    n = 20000
    mech = build("shuffle", "rr", MechanismParams(5, 2, 1, 1.0, delta=1e-6, num_clients=n))
    ans = one_per_client(rng, n, s=5, c=2)
    est = np.stack([mech.estimate(mech.randomize(ans, seeded_generator(i)).payloads, n)
                    for i in range(20)])
    sd = est.std(axis=0).mean() / math.sqrt(20)
    assert np.abs(est.mean(0) - ans.counts()).max() < 6 * sd


def test_multi_message_round_trip_unbiased_and_dlap_variance():
    rng = np.random.default_rng(1)
    n = 3000
    mech = build("shuffle", "multi", MechanismParams(4, 3, 1, 1.0, delta=1e-6, num_clients=n))
    ans = one_per_client(rng, n, s=4, c=3)
    errs = []
    for i in range(60):
        batch = mech.randomize(ans, seeded_generator(i))
        assert mech.well_formed(batch.payloads).all()
        assert np.unique(batch.senders).size == n    # every client sends
        errs.append(mech.estimate(batch.payloads, n) - ans.counts())
    errs = np.stack(errs)
    # every client honest: n / m times the variance the guarantee needs (m = n/2 by default)
    var = mech.describe()["error_variance_all_honest"]
    assert var == pytest.approx(2 * mech.cal.error_variance)
    assert abs(errs.mean()) < 6 * math.sqrt(var / errs.size)
    assert errs.var() == pytest.approx(var, rel=0.15)
    assert mech.cal.eps <= 1.0 + 1e-9
    assert guarantee_of(mech).eps == pytest.approx(mech.cal.eps)


def test_multi_message_flooding_has_the_calibrated_law():
    """The sampled flooding is the law the accountant costs: NB(r, q) with the calibrated
    mean mu (variance mu + mu^2/r, far above a Poisson's mu), summed over the n/m shares
    every client sends; the (-) messages of a cell are G- + F (no true message)."""
    rng = np.random.default_rng(2)
    n = 3000
    mech = build("shuffle", "multi", MechanismParams(4, 3, 1, 1.0, delta=1e-6, num_clients=n))
    c, a = mech.cal, mech.noise_shape()            # a = n / m shares of each law
    assert c.flood_shape > 0 and mech.event().flood_shape == c.flood_shape
    ans = one_per_client(rng, n, s=4, c=3)
    minus = []
    for i in range(40):
        cells, negative = decode_messages(mech.randomize(ans, seeded_generator(i)).payloads)
        minus.append(np.bincount(cells[negative], minlength=12))
    minus = np.concatenate(minus).astype(float)
    g_mean, g_var = c.dlap_p / (1 - c.dlap_p), c.dlap_p / (1 - c.dlap_p) ** 2
    mean = a * (g_mean + c.flood_mean_total)
    var = a * (g_var + c.flood_mean_total + c.flood_mean_total ** 2 / c.flood_shape)
    assert minus.mean() == pytest.approx(mean, rel=4 * math.sqrt(var / minus.size) / mean)
    assert minus.var() == pytest.approx(var, rel=0.25)
    assert minus.var() > 5 * a * (g_var + c.flood_mean_total)       # not Poisson flooding


def test_multi_message_refuses_missing_noise_shares():
    mech = build("shuffle", "multi", MechanismParams(4, 3, 1, 1.0, delta=1e-6, num_clients=1000,
                                                     options={"expected_dropout": 0.1}))
    assert mech.min_senders() == 900
    guarantee_of(mech, 900)
    with pytest.raises(PrivacyBudgetError, match="expected_dropout"):
        guarantee_of(mech, 899)


def test_message_codec_and_malformed():
    cells = np.array([0, 5, 11]); neg = np.array([False, True, False])
    p = encode_messages(cells, neg)
    assert p.shape == (3, 4)
    c2, n2 = decode_messages(p)
    np.testing.assert_array_equal(c2, cells); np.testing.assert_array_equal(n2, neg)
    mech = build("shuffle", "multi", MechanismParams(2, 3, 1, 1.0, delta=1e-6, num_clients=100))
    np.testing.assert_array_equal(mech.well_formed(p), [True, True, False])


def test_shuffle_needs_delta():
    for name in ("rr", "multi"):
        with pytest.raises(ConfigError, match="delta"):
            build("shuffle", name, MechanismParams(4, 3, 1, 1.0, delta=0.0, num_clients=100))


def test_multi_message_accounting_stable_for_heavy_flooding():
    """Regression: with many flooding pairs (small n, small eps) the pmf grid once lost
    its mass (scipy's Poisson logcdf underflow) and eps came out 0 or inf."""
    from rknn_ray.accounting.multi_message import (calibrate_multi_message, dlap_limit_eps,
                                                   protocol_eps)
    p = 0.8085605399276283
    eps = [protocol_eps(p, mu, 2, 1e-6) for mu in (1e3, 3e3, 8e3, 1.6e4, 3e4, 1e5)]
    assert all(math.isfinite(e) for e in eps)
    assert all(a >= b - 1e-9 for a, b in zip(eps, eps[1:]))       # more flooding, less eps
    nb = [protocol_eps(p, mu, 2, 1e-6, 16.0) for mu in (1e3, 1e4, 1e5)]   # NB flooding too
    assert all(math.isfinite(e) for e in nb) and nb[0] >= nb[1] - 1e-9 >= nb[2] - 2e-9
    assert eps[-1] >= dlap_limit_eps(p, 2, 1e-6) - 1e-6            # never below the limit
    cal = calibrate_multi_message(0.5, 1e-6, 1079, 2, 100)
    assert 0.45 <= cal.eps <= 0.5


def test_multi_message_dlap_share_trades_error_for_messages():
    """privacy.options.dlap_share: a smaller DLap share of the per-cell eps means more DLap
    noise and fewer flooding messages, at the same exactly accounted (eps, delta)."""
    from rknn_ray.config import load_config

    def mech(**options):
        return build("shuffle", "multi", MechanismParams(4, 3, 1, 1.0, delta=1e-6,
                                                         num_clients=3000, options=options))
    default, lower = mech(), mech(dlap_share=0.7)
    assert default.cal.dlap_share == 0.85 and lower.cal.dlap_share == 0.7
    assert lower.cal.error_variance > default.cal.error_variance
    assert lower.cal.noise_messages_per_client < 0.7 * default.cal.noise_messages_per_client
    assert guarantee_of(lower).eps <= 1.0 and guarantee_of(default).eps <= 1.0
    with pytest.raises(ConfigError, match="dlap_share"):
        mech(dlap_share=1.0)
    cfg = load_config("jobs/configs/digits_shuffle.yaml", ["privacy.mechanism=multi",
                                                           "privacy.options.dlap_share=0.7"])
    assert cfg.privacy.options["dlap_share"] == 0.7
    with pytest.raises(ConfigError, match="dlap_share"):
        load_config("jobs/configs/digits_shuffle.yaml", ["privacy.options.dlap_share=1.5"])

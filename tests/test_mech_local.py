"""Local randomizers: exact likelihood ratios, samplers, unbiasedness and variance."""
import itertools
import math

import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError, DataError, ReportError
from rknn_ray.mechanisms import MechanismParams, available, build
from rknn_ray.mechanisms.collision import (PRIME, collision_client_variance, collision_l,
                                           collision_omega, collision_probabilities,
                                           collision_rates, decode_reports, hash_coefficients,
                                           hash_every_key, key_powers, poly_hash,
                                           sample_collision, CollisionOracle)
from rknn_ray.mechanisms.noise import discrete_laplace_pmf
from rknn_ray.mechanisms.randomized_response import rr_flip_probability, rr_output_probability
from rknn_ray.mechanisms.separation import concatenation_moments
from rknn_ray.accounting.guarantee import guarantee_of

LOCAL = ["rr", "collision", "separation", "concatenation", "laplace"]


def params(s=5, Y=4, k=2, r=1, eps=2.0, **opts):
    return MechanismParams(s, Y, k, eps=eps, r=r, options=opts)


def same_record(n, neighbors, labels, s, Y):
    """n clients holding the same one record."""
    return RecordAnswers(np.tile(neighbors, (n, 1)), np.tile(labels, (n, 1)),
                         np.arange(n), s, Y)


def valid_inputs(s, Y, k, r):
    """Every (query set, label set) a record can have."""
    return [(T, y) for T in itertools.combinations(range(s), k)
            for y in itertools.combinations(range(Y), r)]


def worst_ratio(prob):
    """max over input pairs and outputs of P[o|x]/P[o|x'] for a (inputs, outputs) table."""
    return float((prob[:, None, :] / prob[None, :, :]).max())


# ---------------------------------------------------------------- interface

@pytest.mark.parametrize("name", LOCAL)
def test_interface_sizes_and_guarantee(name):
    m = build("local", name, params())
    assert name in available()["local"] and m.model == "local"
    rng = np.random.default_rng(0)
    ans = same_record(7, [0, 3], [2], 5, 4)
    batch = m.randomize(ans, rng)
    assert batch.payloads.dtype == np.uint8 and batch.payloads.shape == (7, m.message_size)
    assert m.well_formed(batch.payloads).all()
    g = guarantee_of(m)
    assert (g.eps, g.delta, g.model, g.unit, g.mechanism) == (2.0, 0.0, "local", "record", name)
    info = m.describe()
    assert info["bytes_per_client"] == m.message_size and "multi_record" in g.note
    est = m.estimate(batch.payloads, 7)
    assert est.shape == (5, 4)
    np.testing.assert_allclose(est, m.client_estimates(batch.payloads).sum(axis=0), atol=1e-6)


def test_message_sizes():
    p = MechanismParams(200, 50, 2, eps=2.0, r=2)
    sizes = {n: build("local", n, p).message_size for n in LOCAL}
    assert sizes["rr"] == 10000 // 8 and sizes["laplace"] == 4 * 10000
    l = collision_l(2.0, 4)
    assert sizes["collision"] == 8 + 1 and l < 256
    assert sizes["concatenation"] == 9 and sizes["separation"] == 8 + 1 + 1


def test_bad_config_and_data_errors():
    with pytest.raises(ConfigError, match="multi_record"):
        build("local", "rr", params(multi_record="all"))
    with pytest.raises(ConfigError, match="eps"):
        build("local", "collision", params(eps=0.0))
    with pytest.raises(DataError, match="calibrated"):
        build("local", "rr", params(k=1)).randomize(same_record(3, [0, 1], [0], 5, 4),
                                                    np.random.default_rng(0))


@pytest.mark.parametrize("name", LOCAL)
def test_malformed_reports_flagged(name):
    m = build("local", name, params(multi_record="normalize"))
    batch = m.randomize(same_record(4, [0, 1], [1], 5, 4), np.random.default_rng(1))
    bad = batch.payloads.copy()
    if name == "rr":
        bad[0, -1] |= 1                         # a padding bit (20 cells -> 4 pad bits)
    elif name == "laplace":
        bad[0, :4] = np.frombuffer(np.float32(np.nan).tobytes(), np.uint8)
    else:
        bad[0, 8:] = 255                        # z >= l
    ok = m.well_formed(bad)
    assert not ok[0] and ok[1:].all()
    with pytest.raises(ReportError, match="malformed"):
        m.estimate(bad, 4)
    assert not m.well_formed(batch.payloads[:, :-1]).any()
    # a missing report is not an error: the estimate debiases with the reports received
    part = m.estimate(batch.payloads[:3], 4)
    np.testing.assert_allclose(part, m.finalize(m.statistic(batch.payloads[:3]), 3))
    np.testing.assert_allclose(m.estimate(batch.payloads, 4),
                               m.finalize(m.statistic(batch.payloads[:3])
                                          + m.statistic(batch.payloads[3:]), 4), atol=1e-9)


# ---------------------------------------------------------------- exact likelihood ratios

def test_rr_worst_case_ratio_is_exactly_e_eps():
    s, Y, k, r, eps = 3, 2, 2, 1, 1.3
    d = s * Y
    q = rr_flip_probability(eps, k, r)
    inputs = np.zeros((len(valid_inputs(s, Y, k, r)), d), dtype=bool)
    for i, (T, y) in enumerate(valid_inputs(s, Y, k, r)):
        inputs[i, [t * Y + c for t in T for c in y]] = True
    outputs = np.array(list(itertools.product([0, 1], repeat=d)), dtype=bool)
    prob = rr_output_probability(outputs, inputs, q)
    np.testing.assert_allclose(prob.sum(axis=1), 1.0)
    assert worst_ratio(prob) == pytest.approx(math.exp(eps), rel=1e-12)


def test_collision_worst_case_ratio_over_every_hash():
    """All 4^4 hash functions [4] -> [4], all 2-sets: ratio <= e^eps, = e^eps without collisions."""
    d, c, l, eps = 4, 2, 4, 0.9
    sets = list(itertools.combinations(range(d), c))
    worst, worst_collided = 0.0, 0.0
    for H in itertools.product(range(l), repeat=d):
        H = np.array(H)
        prob = np.array([collision_probabilities(eps, l, c, H[list(V)]) for V in sets])
        np.testing.assert_allclose(prob.sum(axis=1), 1.0)
        w = worst_ratio(prob)
        worst = max(worst, w)
        if len(set(H)) < d:
            worst_collided = max(worst_collided, w)
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)
    assert worst_collided <= math.exp(eps) * (1 + 1e-12)


def test_collision_ratio_with_the_real_hash_family():
    s, Y, k, r, eps = 3, 3, 1, 2, 1.5
    c = k * r
    l = collision_l(eps, c)
    cells = [[t * Y + y for t in T for y in ys] for T, ys in valid_inputs(s, Y, k, r)]
    coeffs = hash_coefficients(np.arange(300, dtype=np.uint64), 0, c + 1)
    hashed = poly_hash(coeffs, np.arange(s * Y), l)
    worst = max(worst_ratio(np.array([collision_probabilities(eps, l, c, h[V]) for V in cells]))
                for h in hashed)
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)


def test_separation_ratio_is_product_and_reaches_e_eps():
    s, Y, k, r, eps = 3, 3, 1, 1, 1.2
    m = build("local", "separation", params(s, Y, k, r, eps))
    ot, oy = m.oracle_t, m.oracle_y
    assert ot.eps + oy.eps == pytest.approx(eps)
    worst = 0.0
    for seed in range(100):
        seeds = np.array([seed], dtype=np.uint64)
        ht = poly_hash(hash_coefficients(seeds, ot.tag, ot.degree), np.arange(s), ot.l)[0]
        hy = poly_hash(hash_coefficients(seeds, oy.tag, oy.degree), np.arange(Y), oy.l)[0]
        prob = np.array([np.outer(collision_probabilities(ot.eps, ot.l, k, ht[list(T)]),
                                  collision_probabilities(oy.eps, oy.l, r, hy[list(y)])).ravel()
                         for T, y in valid_inputs(s, Y, k, r)])
        worst = max(worst, worst_ratio(prob))
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)


def test_concatenation_ratio_reaches_e_eps():
    s, Y, k, r, eps = 3, 2, 1, 1, 2.0
    m = build("local", "concatenation", params(s, Y, k, r, eps))
    o = m.oracle
    cells = [list(T) + [s + c for c in y] for T, y in valid_inputs(s, Y, k, r)]
    hashed = poly_hash(hash_coefficients(np.arange(200, dtype=np.uint64), o.tag, o.degree),
                       np.arange(s + Y), o.l)
    worst = max(worst_ratio(np.array([collision_probabilities(eps, o.l, o.c, h[V])
                                      for V in cells])) for h in hashed)
    assert worst == pytest.approx(math.exp(eps), rel=1e-12)


def test_local_discrete_laplace_ratio():
    s, Y, k, r, eps = 2, 2, 1, 1, 1.0
    m = build("local", "laplace", params(s, Y, k, r, eps))
    inputs = []
    for T, y in valid_inputs(s, Y, k, r):
        x = np.zeros(s * Y)
        x[[t * Y + c for t in T for c in y]] = 1
        inputs.append(x)
    outs = np.array(list(itertools.product(range(-3, 5), repeat=s * Y)))
    prob = np.array([discrete_laplace_pmf(outs - x, m.scale).prod(axis=1) for x in inputs])
    assert worst_ratio(prob) == pytest.approx(math.exp(eps), rel=1e-9)


def test_local_continuous_laplace_ratio_on_normalized_inputs():
    """normalize: any two A/m of L1 norm kr are within 2kr, so densities stay within e^eps."""
    eps, scale = 0.8, 2 * 1 * 1 / 0.8
    inputs = np.array([[1, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1 / 3, 2 / 3], [0, 0, 0, 1]])
    grid = np.array(list(itertools.product(np.linspace(-2, 3, 9), repeat=4)))
    dens = np.array([np.exp(-np.abs(grid - x).sum(axis=1) / scale) for x in inputs])
    assert worst_ratio(dens) <= math.exp(eps) * (1 + 1e-12)
    assert worst_ratio(dens) == pytest.approx(math.exp(eps))   # (1,0,0,0) vs (0,0,0,1)


# ---------------------------------------------------------------- samplers match the exact law

def test_collision_sampler_matches_definition_5():
    eps, l, c, n = 1.0, 7, 3, 400_000
    rng = np.random.default_rng(3)
    for row in ([1, 4, 6], [2, 2, 5]):                        # no collision / a collision
        z = sample_collision(np.tile(row, (n, 1)), eps, l, c, rng)
        freq = np.bincount(z, minlength=l) / n
        p = collision_probabilities(eps, l, c, row)
        assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / n))


def test_collision_reports_follow_their_own_hash():
    """End to end: P[z in H(V)] = E[h] e^eps / Omega, with H recomputed from each seed."""
    m = build("local", "collision", params(eps=1.0))
    n = 100_000
    batch = m.randomize(same_record(n, [0, 2], [1], 5, 4), np.random.default_rng(4))
    seeds, (z,) = decode_reports(batch.payloads, [m.oracle.z_bytes])
    hashed = poly_hash(hash_coefficients(seeds, 0, m.oracle.degree),
                       np.array([0 * 4 + 1, 2 * 4 + 1]), m.l)
    h = (hashed[:, 0] != hashed[:, 1]) + 1
    inside = (hashed == z[:, None]).any(axis=1)
    expect = h * math.exp(1.0) / collision_omega(1.0, m.l, 2)
    assert abs(inside.mean() - expect.mean()) < 5 * math.sqrt(expect.mean() / n)


def test_hash_family_pairwise_collisions_and_uniformity():
    l, n = 13, 200_000
    coeffs = hash_coefficients(np.arange(n, dtype=np.uint64), 0, 3)
    h = poly_hash(coeffs, np.array([0, 1, 7, 1000]), l)
    assert h.min() >= 0 and h.max() < l
    freq = np.bincount(h[:, 2], minlength=l) / n
    assert np.all(np.abs(freq - 1 / l) < 5 * math.sqrt(1 / l / n))
    coll = (h[:, 0] == h[:, 3]).mean()
    assert abs(coll - 1 / l) < 5 * math.sqrt(1 / l / n)
    # the polynomial is evaluated exactly in GF(2^31 - 1)
    c = [int(x) for x in coeffs[5]]
    v = 1000
    exact = (c[0] + c[1] * v + c[2] * v ** 2 + c[3] * v ** 3) % PRIME
    assert h[5, 3] == (exact * l) >> 31


@pytest.mark.parametrize("degree", [0, 1, 2, 3, 4, 5, 6, 9])
def test_server_hash_of_every_cell_equals_the_horner_hash(degree):
    """hash_every_key (powers, one fold per three terms) gives poly_hash's values bit for
    bit, also at the largest coefficients and keys, where a missed fold would overflow."""
    rng = np.random.default_rng(degree)
    coeffs = hash_coefficients(rng.integers(0, 1 << 64, 300, dtype=np.uint64), 0, degree)
    coeffs[0] = PRIME - 1                                 # every term at its largest
    coeffs[1] = 0
    for num_keys, l in ((1000, 7), (2000, 40_000), (37, 3)):
        keys = np.arange(num_keys)
        expect = poly_hash(coeffs, keys, l)
        assert np.array_equal(hash_every_key(coeffs, key_powers(num_keys, degree), l), expect)
    big = np.array([0, 1, (1 << 29) - 1], dtype=np.uint64)   # the largest key allowed
    powers = np.stack([big ** 0] + [np.array([pow(int(v), j, PRIME) for v in big], np.uint64)
                                    for j in range(1, degree + 1)])
    assert np.array_equal(hash_every_key(coeffs, powers, 1000), poly_hash(coeffs, big, 1000))
    # every product at its largest, (P-1)^2: exact against Python's integers
    worst = np.full((degree + 1, 4), PRIME - 1, np.uint64)
    worst[:, 1] = PRIME - 2
    worst[0] = 1                                          # v^0: the constant term
    exact = [[sum(int(c) * int(w) for c, w in zip(row, worst[:, v])) % PRIME
              for v in range(4)] for row in coeffs[:3]]
    # l = 2^31: (h * l) >> 31 is h itself, so an error of a few units cannot hide in a bucket
    assert hash_every_key(coeffs[:3], worst, 1 << 31).tolist() == exact


def test_hit_counts_in_chunks_equal_the_hit_matrix():
    """The server's per-cell count (reused buffers, any chunk size) sums the hit matrix."""
    oracle = CollisionOracle(d=250, c=2, eps=1.5, l=collision_l(1.5, 2))
    rng = np.random.default_rng(9)
    seeds = rng.integers(0, 1 << 64, 1003, dtype=np.uint64)
    z = rng.integers(0, oracle.l, 1003)
    expect = oracle.hits(seeds, z).sum(axis=0)
    for chunk in (1, 250, 4096, 1 << 16, 1 << 30):
        assert np.array_equal(oracle.hit_counts(seeds, z, chunk), expect)
    assert np.array_equal(oracle.hit_counts(seeds[:0], z[:0], 4096), np.zeros(250, np.int64))


def test_rr_and_laplace_samplers():
    rng = np.random.default_rng(5)
    n = 50_000
    ans = same_record(n, [1, 3], [0], 5, 4)
    rr = build("local", "rr", params(eps=1.0))
    bits = np.unpackbits(rr.randomize(ans, rng).payloads, axis=1, count=20)
    q = rr.flip_probability
    ones = np.zeros(20, dtype=bool)
    ones[[4, 12]] = True
    flips = (bits != ones).mean(axis=0)
    assert np.all(np.abs(flips - q) < 5 * math.sqrt(q * (1 - q) / n))
    lap = build("local", "laplace", params(eps=1.0))
    noise = lap.client_estimates(lap.randomize(ans, rng).payloads).reshape(n, -1)[:, 0]
    for x in range(-3, 4):
        pmf = discrete_laplace_pmf(np.array([x]), lap.scale)[0]
        assert abs((noise == x).mean() - pmf) < 5 * math.sqrt(pmf / n)


# ---------------------------------------------------------------- l and Omega

def test_l_rounding_and_omega():
    for eps in (0.3, 1.0, 2.5, 6.0):
        for c in (1, 2, 4, 10):
            real = 2 * c - 1 + c * math.exp(eps)
            l = collision_l(eps, c)
            assert l in (math.floor(real), math.ceil(real)) and l > c
            other = math.ceil(real) if l == math.floor(real) else math.floor(real)
            if other > c:
                assert (collision_client_variance(eps, l, c)[1]
                        <= collision_client_variance(eps, other, c)[1])
            assert collision_omega(eps, l, c) == pytest.approx(c * math.exp(eps) + l - c)


# ---------------------------------------------------------------- unbiasedness and variance

def _check_moments(est, mean, var):
    """est (n, cells) i.i.d. rows; compare per-cell mean and pooled variance, 5 SE each."""
    n = est.shape[0]
    dev = est - mean
    assert np.all(np.abs(dev.mean(axis=0)) < 5 * np.sqrt(var / n) + 1e-12)
    m2 = (dev ** 2).mean(axis=0)
    se = np.sqrt(((dev ** 2 - m2) ** 2).mean(axis=0) / n)
    assert np.all(np.abs(m2 - var) < 5 * se + 1e-12), (m2 / var).round(3)
    assert np.all(se < 0.04 * var)           # precise enough that a 20%-off constant fails


@pytest.mark.parametrize("name", ["rr", "collision", "separation", "concatenation", "laplace"])
def test_unbiased_with_closed_form_variance(name):
    s, Y, k, r = 4, 3, 2, 1
    heavy = name == "concatenation"        # its pair term is heavy-tailed (kurtosis ~ l)
    n = 500_000 if heavy else 120_000
    m = build("local", name, params(s, Y, k, r, eps=1.0 if heavy else 2.5))
    ans = same_record(n, [0, 2], [1], s, Y)
    est = m.client_estimates(m.randomize(ans, np.random.default_rng(6)).payloads)
    _check_moments(est.reshape(n, -1), ans.counts().ravel() / n,
                   m.cell_variance(ans).ravel() / n)


def test_variance_closed_forms_by_hand():
    eps, l, c = 2.0, 9, 3
    p, q = collision_rates(eps, l, c)
    assert p == pytest.approx(math.exp(2) / (3 * math.exp(2) + 6)) and q == 1 / 9
    v_in, v_out = collision_client_variance(eps, l, c)
    assert v_out == pytest.approx((1 / 9) * (8 / 9) / (p - 1 / 9) ** 2)
    mom = concatenation_moments(eps, l, c)
    for (a, b), (mean, var) in mom.items():
        assert mean == pytest.approx(a * b, abs=1e-12)
    assert mom[0, 0][1] == pytest.approx((1 - q) ** 2 / (p - q) ** 2)
    rr = build("local", "rr", params(k=2, r=1, eps=2.0))
    e = math.exp(0.5)
    assert rr.flat_variances()[0] == pytest.approx(e / (e - 1) ** 2)


def test_concatenation_naive_product_is_biased():
    """What the unbiased pair estimator fixes: E[a_hat b_hat] = -q/(p-q) on true cells."""
    s, Y, n = 3, 2, 100_000
    m = build("local", "concatenation", params(s, Y, 1, 1, eps=2.0))
    ans = same_record(n, [1], [0], s, Y)
    seeds, (z,) = decode_reports(m.randomize(ans, np.random.default_rng(7)).payloads,
                                 [m.oracle.z_bytes])
    ahat = m.oracle.client_estimates(seeds, z)
    naive = (ahat[:, 1] * ahat[:, s + 0]).mean()
    p, q = m.oracle.rates
    assert m.describe()["naive_product_mean_on_true_cells"] == pytest.approx(-q / (p - q))
    assert abs(naive - (-q / (p - q))) < 0.15 * abs(q / (p - q)) + 0.1
    assert naive < 0.5                                       # far from the true value 1
    mom = concatenation_moments(2.0, m.oracle.l, 2, naive=True)
    assert mom[1, 1][0] == pytest.approx(-q / (p - q)) and mom[0, 0][0] == pytest.approx(0)
    assert mom[0, 0][1] == pytest.approx(collision_client_variance(2.0, m.oracle.l, 2)[1] ** 2)


@pytest.mark.parametrize("name", ["rr", "separation", "laplace"])
@pytest.mark.parametrize("how", ["sample", "normalize"])
def test_multi_record_clients(name, how):
    """Clients with 3 records: unbiased for sum_i A^i/m_i, variance incl. sampling."""
    s, Y, n = 4, 3, 60_000
    m = build("local", name, params(s, Y, 2, 1, eps=3.0, multi_record=how))
    recs_n = np.array([[0, 1], [1, 2], [0, 3]])
    recs_y = np.array([[0], [0], [2]])
    ans = RecordAnswers(np.tile(recs_n, (n, 1)), np.tile(recs_y, (n, 1)),
                        np.repeat(np.arange(n), 3), s, Y)
    est = m.client_estimates(m.randomize(ans, np.random.default_rng(8)).payloads)
    target = m.estimand(ans)
    np.testing.assert_allclose(target, ans.counts() / 3)
    var = m.cell_variance(ans)
    if name == "laplace" and how == "normalize":
        np.testing.assert_allclose(var, n * m.noise_variance())      # no sampling noise
        assert "client level" in guarantee_of(m).note
    else:
        assert np.all(var.ravel() >= n * min(m._class_variances().values()))
        if how == "normalize":
            assert "same as 'sample'" in guarantee_of(m).note
    _check_moments(est.reshape(n, -1), target.ravel() / n, var.ravel() / n)


def test_estimate_over_mixed_population():
    """estimate() over clients with different records: z-scores vs the exact variance."""
    rng = np.random.default_rng(9)
    s, Y, k, r, n, trials = 6, 3, 2, 1, 3000, 40
    nb = np.argsort(rng.random((n, s)), axis=1)[:, :k]
    lb = rng.integers(0, Y, (n, 1))
    ans = RecordAnswers(nb, lb, np.arange(n), s, Y)
    for name in LOCAL:
        m = build("local", name, params(s, Y, k, r, eps=1.5))
        z = np.array([(m.estimate(m.randomize(ans, rng).payloads, n) - ans.counts())
                      / np.sqrt(m.cell_variance(ans)) for _ in range(trials)])
        assert abs(z.mean()) < 5 / math.sqrt(z.size) * 3, name   # cells correlate a little
        assert 0.85 < (z ** 2).mean() < 1.15, name

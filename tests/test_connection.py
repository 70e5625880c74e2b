"""rknn.connection (issue 37): balanced connection rules priced on public data only.

The brute-force checks replace one private record in many ways and recompute the exact count
matrix: it may move by at most 2kr in L1 (the unit every mechanism is calibrated for), and no
other record's edges may move. Each rule must also change the degree profile against reverse
k-NN, so the checks are not run on reverse k-NN under another name.
"""
import json
import pickle

import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.labeling.connection import (AT_RISK_FLOOR, RULES, Connection, choose_rule,
                                          degree_profile, plan_connection, release_weights)
from rknn_ray.labeling.rknn import build_answers, reverse_knn

BALANCED = [r for r in RULES if r != "reverse_knn"]


def skewed_data(seed=0):
    """Public and private records from one Gaussian; the queries are the 8 most central and
    the 8 most peripheral public samples: reverse k-NN crowds the central queries and starves
    the peripheral ones, which a plan priced on the public samples can feed."""
    rng = np.random.default_rng(seed)
    public, private = rng.normal(0, 1, (200, 2)), rng.normal(0, 1, (40, 2))
    order = np.argsort(np.linalg.norm(public, axis=1))
    return public, np.vstack([public[order[:8]], public[order[-8:]]]), private


def _counts(conn, emb, labels, queries, k, num_classes=3):
    ids = np.arange(len(emb), dtype=np.int64)
    return build_answers(emb, labels, ids, queries, k, num_classes, conn)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("k,r", [(2, 1), (3, 2)])
def test_replacing_one_record_moves_the_counts_by_at_most_2kr(rule, k, r):
    public, queries, private = skewed_data()
    conn = plan_connection(rule, public, queries, k)      # public data only: fixed for all
    rng = np.random.default_rng(1)
    labels = np.stack([rng.permutation(3)[:r] for _ in range(len(private))])
    base = _counts(conn, private, labels, queries, k)
    counts = base.counts()
    if rule != "reverse_knn":       # the plan is not reverse k-NN in disguise on this data
        assert not np.array_equal(base.neighbors, reverse_knn(private, queries, k))
    # replacements from a pool: other records, public samples, queries themselves (ties),
    # far points; each with every possible label set, for records of both components
    pool = np.vstack([private[::6], public[::25], queries[::3], rng.normal(0, 4, (6, 2)),
                      np.array([[50.0, -50.0], [0.0, 0.0]])])
    label_sets = [np.array(c) for c in ([0], [1], [2])] if r == 1 else \
        [np.array(c) for c in ([0, 1], [0, 2], [1, 2])]
    worst = 0
    for j in range(0, len(private), 4):
        for x in pool:
            for lab in label_sets:
                emb, labs = private.copy(), labels.copy()
                emb[j], labs[j] = x, lab
                got = _counts(conn, emb, labs, queries, k)
                others = np.arange(len(private)) != j
                assert np.array_equal(got.neighbors[others], base.neighbors[others])
                worst = max(worst, int(np.abs(got.counts() - counts).sum()))
    assert worst <= 2 * k * r
    assert worst == 2 * k * r             # the bound is reached: the check is not vacuous


@pytest.mark.parametrize("rule", BALANCED)
def test_balanced_rules_change_the_degree_profile(rule):
    public, queries, private = skewed_data()
    k, s = 3, len(queries)
    conn = plan_connection(rule, public, queries, k)
    assert conn.prices is not None and np.ptp(conn.prices) > 0
    info = conn.info         # the objective the rule maximizes improved on the public samples
    assert info["public_objective"] > info["public_objective_reverse_knn"]
    pub, pub_rev = info["public_degree"], info["public_degree_reverse_knn"]
    assert (pub["min"], pub["p10"]) > (pub_rev["min"], pub_rev["p10"])
    rev, bal = reverse_knn(private, queries, k), conn.neighbors(private, queries, k)
    before, after = degree_profile(rev, s), degree_profile(bal, s)
    assert after != before
    if rule == "balanced_harmonic":      # and on the private records drawn like the public ones
        assert after["min"] > before["min"] and after["p10"] > before["p10"]
        assert after["max"] < before["max"]


def test_reverse_knn_connection_is_exactly_reverse_knn():
    public, queries, private = skewed_data()
    for k in (1, 3):
        conn = plan_connection("reverse_knn", public, queries, k)
        assert conn.prices is None and conn.digest() == "reverse_knn"
        assert np.array_equal(conn.neighbors(private, queries, k), reverse_knn(private, queries, k))
        ids = np.arange(len(private))
        labels = np.zeros(len(private), np.int64)
        assert np.array_equal(build_answers(private, labels, ids, queries, k, 2, conn).counts(),
                              build_answers(private, labels, ids, queries, k, 2).counts())


@pytest.mark.parametrize("rule", BALANCED)
def test_a_plan_is_deterministic_small_and_ships(rule):
    public, queries, private = skewed_data()
    a = plan_connection(rule, public, queries, 2)
    b = plan_connection(rule, public, queries, 2)
    assert a.digest() == b.digest() and len(a.digest()) == 16
    shipped = pickle.loads(pickle.dumps(a))
    assert np.array_equal(shipped.neighbors(private, queries, 2), a.neighbors(private, queries, 2))
    assert len(pickle.dumps(a)) < 4096                      # s prices and a few public facts
    nbr = a.neighbors(private, queries, 2)
    assert nbr.dtype == np.int64 and nbr.shape == (len(private), 2)
    assert all(len(set(row)) == 2 for row in nbr.tolist())  # k distinct queries per record
    json.dumps(a.describe())                                # report.json can hold it
    with pytest.raises(ValueError, match="prices for"):
        a.neighbors(private, queries[:-1], 2)


def test_unknown_rule_is_refused():
    public, queries, _ = skewed_data()
    with pytest.raises(ValueError, match="balanced_harmonic"):
        plan_connection("balanced_max", public, queries, 1)
    with pytest.raises(ValueError):
        Connection("balanced_min", None)


def test_config_accepts_the_rules_and_names_them_on_a_typo():
    from rknn_ray.config import ConfigError, load_config
    for rule in (*RULES, "auto"):
        assert load_config({"rknn": {"connection": rule}}).rknn.connection == rule
    assert load_config({}).rknn.connection == "reverse_knn"
    with pytest.raises(ConfigError) as err:
        load_config({"rknn": {"connection": "balanced"}})
    assert all(r in str(err.value) for r in (*RULES, "auto"))


def test_records_answers_of_a_plan_feed_the_mechanisms_unchanged():
    """A balanced plan's answers are kr-hot rows, the input every mechanism is calibrated for."""
    public, queries, private = skewed_data()
    conn = plan_connection("balanced_harmonic", public, queries, 2)
    ans = _counts(conn, private, np.zeros((len(private), 1), np.int64), queries, 2)
    assert isinstance(ans, RecordAnswers)
    assert ans.counts().sum() == len(private) * 2
    assert (np.bincount(ans.flat_cells().ravel()) <= len(private)).all()


def test_release_weights_follow_the_released_degrees_and_steer_the_plan():
    """A query whose release shows many more records than its public share weighs its public
    samples up; the plan made with those weights moves records toward the queries the release
    showed starved, which the public plan cannot see."""
    public, queries, private = skewed_data()
    k, s = 2, len(queries)
    rev = reverse_knn(public, queries, k)
    public_deg = np.bincount(rev.ravel(), minlength=s)
    scale = 3.0                                          # 3 private records per public sample
    released = np.zeros((s, 2))
    released[:, 0] = public_deg * scale                  # exactly as the public set predicts
    flat = release_weights(public, queries, released, k, 1, len(public) * 3, noise_std=1.0)
    assert np.allclose(flat, 1.0)
    heavy = int(np.argmax(public_deg))
    released[heavy, 0] *= 4                              # the release shows a crowd there
    w = release_weights(public, queries, released, k, 1, len(public) * 3, noise_std=1.0)
    near = (rev == heavy).any(axis=1)
    assert (w[near] > 1.2).all() and np.allclose(w[~near], 1.0)
    plain = plan_connection("balanced_harmonic", public, queries, k)
    weighted = plan_connection("balanced_harmonic", public, queries, k, sample_weight=w)
    assert weighted.digest() != plain.digest() and "weighted" in weighted.info
    # the crowded query is priced up: fewer of the records near it take it
    assert weighted.prices[heavy] - np.median(weighted.prices) > \
        plain.prices[heavy] - np.median(plain.prices)
    with pytest.raises(ValueError, match="sample_weight"):
        plan_connection("balanced_harmonic", public, queries, k, sample_weight=-w)


def test_auto_balances_only_where_reverse_knn_leaves_many_labels_under_the_noise():
    """choose_rule (rknn.connection: auto) reads public data and public parameters only; here
    3 private records per public sample, k = 3 on the skewed queries."""
    public, queries, _ = skewed_data()
    assign = reverse_knn(public, queries, 1)[:, 0]
    quiet, _ = choose_rule(public, queries, assign, 3, 600, noise_std=1.0)
    assert quiet == "reverse_knn"                        # nothing under the noise: no change
    rule, info = choose_rule(public, queries, assign, 3, 600, noise_std=20.0)
    risk = info["at_risk"]          # balancing halves the share under the noise, but it is small
    assert risk["balanced_harmonic"] <= risk["reverse_knn"] / 2 < AT_RISK_FLOOR / 2
    assert rule == "reverse_knn" and "needs reverse_knn at >= 25%" in info["reason"]
    rule, info = choose_rule(public, queries, assign, 3, 600, noise_std=20.0, floor=0.1)
    assert rule == "balanced_harmonic" and "halves it" in info["reason"]   # ties: harmonic
    drowned, info = choose_rule(public, queries, assign, 3, 600, noise_std=1e4, floor=0.1)
    assert drowned == "reverse_knn" and info["at_risk"]["reverse_knn"] == 1.0

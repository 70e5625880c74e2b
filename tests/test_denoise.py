"""Denoising over the public graph: post-processing of released counts only; s/k auto."""
import types

import numpy as np
import pytest

from rknn_ray.labeling.autotune import choose_s_k
from rknn_ray.config import load_config
from rknn_ray.labeling.denoise import choose_neighbours, public_knn_graph, smooth_counts
from rknn_ray.job.stages import finish_labels, resolve_auto
from rknn_ray.data.prepared import PreparedData, prepare_data
from rknn_ray.labeling.queries import select_queries


def _clusters(rng, n=600, c=4, d=5):
    centres = rng.normal(0, 6, (c, d))
    y = rng.integers(0, c, n)
    return (centres[y] + rng.normal(0, 1, (n, d))).astype(np.float32), y


def test_one_neighbour_is_cluster_propagation():
    rng = np.random.default_rng(0)
    emb, _ = _clusters(rng)
    counts = rng.normal(0, 1, (50, 4))
    assign = rng.integers(0, 50, len(emb))
    graph = public_knn_graph(emb, 1)
    np.testing.assert_array_equal(graph[:, 0], np.arange(len(emb)))
    np.testing.assert_allclose(smooth_counts(counts, assign, graph), counts[assign])


def test_smoothing_recovers_labels_under_heavy_noise():
    rng = np.random.default_rng(1)
    emb, y = _clusters(rng)
    s = len(emb)                                    # every public sample a query
    exact = np.eye(4)[y] * 10.0
    noisy = exact + rng.laplace(0, 10.0, exact.shape)
    before = np.mean(noisy.argmax(1) == y)
    after = np.mean(smooth_counts(noisy, np.arange(s), public_knn_graph(emb, 20)).argmax(1) == y)
    assert after > before + 0.2 and after > 0.9


def test_finish_labels_reads_released_counts_and_public_data_only():
    """No private record is reachable: the data object carries public arrays and a record count."""
    rng = np.random.default_rng(2)
    emb, y = _clusters(rng, n=300)
    qs = select_queries(emb, 30, restarts=1)
    splits = types.SimpleNamespace(public_y=y, public_x=emb,
                                   private_y=np.zeros(3000, np.int64))   # only its length is read
    data = PreparedData(splits, np.arange(3000) % 100, 4, (5,), "synthetic")
    cfg = load_config(None, ["labels.smooth=auto", "queries.s=30", "privacy.eps=0.5"])
    counts = rng.normal(20, 5, (30, 4))
    lab, info = finish_labels(cfg, data, counts, qs, emb, rounds=[], progress=None)
    assert info["denoise"]["post_processing"] and info["denoise"]["neighbours"] >= 1
    assert lab.public_hard.shape == (300,) and info["confidence"].shape == (300,)
    # the same released counts give the same labels: a function of counts + public data
    lab2, _ = finish_labels(cfg, data, counts, qs, emb, rounds=[], progress=None)
    np.testing.assert_array_equal(lab.public_hard, lab2.public_hard)


def test_finish_labels_prints_a_label_accuracy_only_for_labelled_public_rows():
    """Unlabelled public rows (a user's table: every label -1) measure nothing: no "nan"."""
    rng = np.random.default_rng(3)
    emb, y = _clusters(rng, n=200)
    qs = select_queries(emb, 20, restarts=1)
    cfg = load_config(None, ["labels.smooth=auto", "queries.s=20", "privacy.eps=0.5"])
    counts = rng.normal(20, 5, (20, 4))
    said = {}
    for name, public_y in (("labelled", y), ("unlabelled", np.full_like(y, -1))):
        splits = types.SimpleNamespace(public_y=public_y, public_x=emb,
                                       private_y=np.zeros(2000, np.int64))
        lines = []
        finish_labels(cfg, PreparedData(splits, np.arange(2000) % 100, 4, (5,), "synthetic"),
                      counts, qs, emb, rounds=[], progress=types.SimpleNamespace(say=lines.append))
        (said[name],) = [line for line in lines if line.startswith("denoising")]
    assert "label accuracy 0." in said["labelled"] or "label accuracy 1." in said["labelled"]
    assert "accuracy" not in said["unlabelled"] and "nan" not in said["unlabelled"]


def test_neighbours_grow_with_noise_and_are_one_without():
    kw = dict(num_records=60000, k=1, r=1, s=1000, num_public=5000, num_classes=10)
    ms = [choose_neighbours(noise_std=sd, **kw).neighbours for sd in (0.0, 3.0, 30.0, 300.0)]
    assert ms[0] == 1 and ms == sorted(ms) and ms[-1] <= 10


def test_auto_s_is_monotone_in_eps_and_k_in_range():
    sigmas = [2 * np.sqrt(2) / eps for eps in (0.05, 0.1, 0.5, 1.0, 4.0)]   # Laplace 2/eps, k = 1
    picks = [choose_s_k(60000, 5000, 10, sd) for sd in sigmas]
    s_values = [p.s for p in picks]
    assert s_values == sorted(s_values) and s_values[-1] == 5000 and s_values[0] >= 20
    assert all(1 <= p.k <= 5 and p.k <= p.s for p in picks) and all(p.reason for p in picks)
    assert choose_s_k(60000, 5000, 10, 1.0, fixed_s=300).s == 300


def test_resolve_auto_on_digits_records_the_choice():
    cfg = load_config("jobs/configs/digits_central.yaml", ["queries.s=auto", "rknn.k=auto"])
    data = prepare_data(cfg)
    low, c_low = resolve_auto(cfg.with_overrides(["privacy.eps=0.1"]), data)
    high, c_high = resolve_auto(cfg.with_overrides(["privacy.eps=2.0"]), data)
    assert isinstance(high.queries.s, int) and isinstance(high.rknn.k, int)
    assert low.queries.s <= high.queries.s and "SNR" in c_high["reason"]
    plain = load_config("jobs/configs/digits_central.yaml")
    fixed, none = resolve_auto(plain, data)
    assert none is None and fixed.queries.s == plain.queries.s


def test_auto_s_accounts_for_smoothing_and_is_continuous():
    from rknn_ray.labeling.autotune import smoothed_snr_limit
    # Fashion-MNIST sizes: eps = 0.1 -> a few hundred coarse queries, k = 1; eps = 1 -> all 5000
    low = choose_s_k(60000, 5000, 10, 33.0)
    high = choose_s_k(60000, 5000, 10, 3.3)
    assert 150 <= low.s <= 300 and low.k == 1 and "sqrt" in low.reason
    assert (high.s, high.k) == (5000, 1)       # 12 votes a query, pooled over ~10 by smoothing
    assert choose_s_k(60000, 5000, 10, 3.3, smooth_neighbours=1, fixed_s=5000).k == 3   # no pooling
    # the two pieces of the rule meet where m*s = N, and the limit never decreases with signal
    limits = [smoothed_snr_limit(sig, 5000, 10, 8.0) for sig in np.linspace(100, 20000, 400)]
    assert all(b >= a for a, b in zip(limits, limits[1:]))
    assert smoothed_snr_limit(4000.0, 5000, 10, 8.0) == 500.0     # exactly on the seam


def test_auto_s_caps_multi_message_traffic_per_client():
    """Multi-message noise messages grow with the s*|Y| cells: auto s keeps a client's expected
    messages within shuffle.max_messages_per_client, exactly at the largest s that fits."""
    import dataclasses

    from rknn_ray.mechanisms import build
    from rknn_ray.mechanisms.stage import mechanism_params, multi_message_s_cap
    base = ["privacy.model=shuffle", "privacy.mechanism=multi", "privacy.delta=1e-6",
            "queries.s=auto", "rknn.k=auto", "data.partition=one_per_client"]
    cfg = load_config("jobs/configs/digits_central.yaml", base + ["privacy.eps=4",
                                                                  "shuffle.max_messages_per_client=40"])
    data = prepare_data(cfg)
    capped, choice = resolve_auto(cfg, data)
    s_cap, why = multi_message_s_cap(capped, data, capped.rknn.k)
    assert capped.queries.s == s_cap and "max_messages_per_client = 40" in choice["reason"]

    def expected_messages(s):
        params = dataclasses.replace(mechanism_params(capped, data), num_queries=s)
        return build("shuffle", "multi", params).describe()["messages_per_client_expected"]
    assert expected_messages(s_cap) <= 40 < expected_messages(s_cap + 1)
    free, free_choice = resolve_auto(cfg.with_overrides(["shuffle.max_messages_per_client=null",
                                                         "shuffle.max_messages_per_record=null"]),
                                     data)
    assert free.queries.s > s_cap and "capped" not in free_choice["reason"]
    central, c_choice = resolve_auto(cfg.with_overrides(["privacy.model=central",
                                                         "privacy.mechanism=laplace",
                                                         "privacy.delta=0"]), data)
    assert "capped" not in c_choice["reason"]
    assert multi_message_s_cap(central, data) is None
    assert choose_s_k(60000, 5000, 10, 3.3, max_s=(300, "budget")).s == 300
    assert choose_s_k(60000, 5000, 10, 3.3, max_s=(9000, "budget")).s == 5000


def test_auto_s_with_rounds_is_chosen_for_one_rounds_share_of_eps():
    """T rounds each release with eps/T: auto s must be the rule's choice at eps/T (not the
    job's eps), and T rounds of s new queries must fit the public set."""
    cfg = load_config("jobs/configs/digits_central.yaml", ["queries.s=auto", "rknn.k=auto",
                                                          "privacy.eps=0.6"])
    data = prepare_data(cfg)
    n_pub = len(data.splits.public_y)
    one_third, _ = resolve_auto(cfg.with_overrides(["privacy.eps=0.2"]), data)
    three, choice = resolve_auto(cfg.with_overrides(["rounds.count=3"]), data)
    assert three.queries.s == min(one_third.queries.s, n_pub // 3)
    assert choice["per_round_eps"] == pytest.approx(0.2) and "one round's eps" in choice["reason"]
    split, _ = resolve_auto(cfg.with_overrides(["rounds.count=3", "rounds.split_queries=true"]),
                            data)
    assert split.queries.s == min(n_pub, 3 * one_third.queries.s)
    many, _ = resolve_auto(cfg.with_overrides(["rounds.count=3", "privacy.eps=30"]), data)
    assert 3 * many.queries.s <= n_pub

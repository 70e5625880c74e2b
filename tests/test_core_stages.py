"""Answers, encoders, query selection, reverse k-NN and labels."""
import pickle

import numpy as np
import pytest

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.labeling.labels import accuracy, hard_labels, propagate, soft_labels
from rknn_ray.labeling.queries import kmeans_pp_init, nearest, select_queries
from rknn_ray.representation.represent import PCAEncoder, RawEncoder, make_encoder
from rknn_ray.errors import ConfigError
from rknn_ray.labeling.rknn import build_answers, reverse_knn


def blobs(n_per=100, centres=((0, 0), (10, 0), (0, 10), (10, 10)), seed=0):
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.normal(c, 0.5, (n_per, 2)) for c in centres]).astype(np.float32)
    y = np.repeat(np.arange(len(centres)), n_per)
    return x, y


def test_reverse_knn_matches_brute_force():
    rng = np.random.default_rng(0)
    rec, q = rng.normal(size=(300, 5)).astype(np.float32), rng.normal(size=(20, 5)).astype(np.float32)
    got = reverse_knn(rec, q, 3, batch_size=64)
    d = ((rec[:, None, :] - q[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(np.sort(got, 1), np.sort(np.argsort(d, 1)[:, :3], 1))
    with pytest.raises(ValueError, match="k = 21"):
        reverse_knn(rec, q, 21)


def test_answers_counts_and_sampling():
    x, y = blobs()
    ans = build_answers(x, y, np.repeat(np.arange(40), 10), x[[0, 100, 200, 300]], 1, 4)
    c = ans.counts()
    assert c.shape == (4, 4) and c.sum() == 400
    np.testing.assert_array_equal(np.diag(c), [100] * 4)   # well separated blobs
    one = ans.one_record_per_client(np.random.default_rng(0))
    assert one.num_records == 40 and np.array_equal(one.client_ids, np.arange(40))
    with pytest.raises(ValueError, match="sorted"):
        RecordAnswers(ans.neighbors, ans.labels, ans.client_ids[::-1].copy(), 4, 4)


def test_kmeans_finds_blobs_and_assigns_public():
    x, y = blobs()
    qs = select_queries(x, 4, restarts=2, seed=1)
    assert qs.features.shape == (4, 2)
    # each cluster is pure
    for q in range(4):
        assert len(set(y[qs.assignment == q])) == 1
    real = select_queries(x, 4, restarts=1, seed=1, use_nearest_public=True)
    assert any(np.allclose(real.features[0], row) for row in x)
    with pytest.raises(ValueError, match="s = 500"):
        select_queries(x, 500)


def test_kmeans_pp_spreads_seeds():
    x, _ = blobs()
    seeds = kmeans_pp_init(x, 4, np.random.default_rng(0))
    _, idx = nearest(np.array([[0, 0], [10, 0], [0, 10], [10, 10]], np.float32), seeds, 1)
    assert len(set(idx[:, 0].tolist())) >= 3   # D^2 sampling rarely doubles up on blobs


def test_encoders_and_pickling():
    rng = np.random.default_rng(0)
    pub = rng.normal(size=(200, 1, 8, 8)).astype(np.float32)
    raw = make_encoder("raw").fit(pub)
    assert raw.transform(pub).shape == (200, 64) and raw.dim == 64
    pca = PCAEncoder(dim=10).fit(pub)
    emb = pca.transform(pub)
    assert emb.shape == (200, 10) and emb.dtype == np.float32
    clone = pickle.loads(pickle.dumps(pca))      # shipped to Ray actors
    np.testing.assert_allclose(clone.transform(pub), emb, rtol=1e-5, atol=1e-5)
    # variance captured is decreasing along components
    v = emb.var(axis=0)
    assert np.all(np.diff(v) <= 1e-4)
    with pytest.raises(ConfigError, match="represent.dim"):
        PCAEncoder(dim=500).fit(pub)
    with pytest.raises(ConfigError, match="unknown encoder"):
        make_encoder("vit")
    assert isinstance(make_encoder("raw"), RawEncoder)


def test_labels_hard_soft_propagate():
    counts = np.array([[3.0, 1.0, -2.0], [-1.0, -4.0, -0.5], [0.0, 2.0, 2.0]])
    np.testing.assert_array_equal(hard_labels(counts), [0, 2, 1])
    soft, w = soft_labels(counts)
    np.testing.assert_allclose(soft[0], [0.75, 0.25, 0.0])
    np.testing.assert_allclose(soft.sum(1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(w, [1, 0, 1])       # query 1 has no positive signal
    prop = propagate(hard_labels(counts), np.array([2, 2, 0, 1]))
    np.testing.assert_array_equal(prop, [1, 1, 0, 2])
    assert accuracy(prop, np.array([1, 0, 0, 2])) == 0.75


def test_library_refuses_labels_out_of_range_and_nan_features():
    """Passed straight to the library (no job in front), bad records are an error, not a miscount."""
    import numpy as np
    import pytest

    from rknn_ray.data import validate_features
    from rknn_ray.errors import DataError
    from rknn_ray.labeling.rknn import build_answers
    q = np.eye(3, dtype=np.float32)
    x = np.random.default_rng(0).normal(size=(6, 3)).astype(np.float32)
    with pytest.raises(DataError, match="outside 0..3"):
        build_answers(x, np.array([0, 1, 2, 3, 4, 0]), np.arange(6), q, 1, 4)
    x[2, 1] = np.nan
    with pytest.raises(DataError, match="NaN"):
        build_answers(x, np.zeros(6, np.int64), np.arange(6), q, 1, 4)
    with pytest.raises(DataError, match="no records"):
        validate_features(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), 4, "private data")

"""Learned and HOG encoders: public data only, cache by digest, shapes, NT-Xent, augmentations."""
import numpy as np
import pytest
import torch

from rknn_ray.representation import contrastive
from rknn_ray.representation.augment import random_erase, strong_view, weak_view
from rknn_ray.config import load_config
from rknn_ray.representation.contrastive import ContrastiveEncoder, encoder_digest, nt_xent
from rknn_ray.job.stages import fit_queries
from rknn_ray.data.prepared import prepare_data
from rknn_ray.representation.represent import HOGEncoder, make_encoder


@pytest.fixture(scope="module")
def digits_data():
    cfg = load_config("jobs/configs/digits_central.yaml")
    return cfg, prepare_data(cfg)


def _spy(monkeypatch):
    seen = []
    real = contrastive.train_contrastive_loop

    def spy(x, cfg, *args, **kwargs):
        seen.append(np.array(x, copy=True))
        return real(x, cfg, *args, **kwargs)
    monkeypatch.setattr(contrastive, "train_contrastive_loop", spy)
    return seen


def test_simclr_trains_on_public_data_only(digits_data, monkeypatch, tmp_path):
    cfg, data = digits_data
    cfg = cfg.with_overrides(["represent.encoder=simclr", "represent.epochs=1", "represent.dim=16",
                              "represent.batch_size=64", "represent.trainer=local",
                              "represent.flip=false", f"represent.cache_dir={tmp_path}",
                              "queries.s=10"])
    seen = _spy(monkeypatch)
    encoder, public_emb, qs = fit_queries(cfg, data)
    assert len(seen) == 1
    x = seen[0]
    np.testing.assert_array_equal(x, data.splits.public_x)       # exactly the public inputs
    public = {row.tobytes() for row in data.splits.public_x.astype(np.float32)}
    private_only = {row.tobytes() for row in data.splits.private_x.astype(np.float32)} - public
    assert not any(row.tobytes() in private_only for row in x.astype(np.float32))
    assert public_emb.shape == (len(data.splits.public_x), 16) and qs.size == 10
    np.testing.assert_allclose(np.linalg.norm(public_emb, axis=1), 1.0, atol=1e-5)


def test_cache_hit_on_second_fit_and_miss_on_other_public_data(monkeypatch, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.random((40, 1, 8, 8)).astype(np.float32)
    seen = _spy(monkeypatch)
    kw = dict(dim=8, epochs=1, batch_size=16, flip=False, trainer="local", cache_dir=str(tmp_path))
    a = ContrastiveEncoder(**kw).fit(x)
    assert not a.cache_hit and len(seen) == 1
    b = ContrastiveEncoder(**kw).fit(x)
    assert b.cache_hit and len(seen) == 1                      # loaded, not trained again
    np.testing.assert_array_equal(a.transform(x), b.transform(x))
    c = ContrastiveEncoder(**kw).fit(x[::-1].copy())            # other public bytes: new digest
    assert not c.cache_hit and len(seen) == 2 and c.digest != a.digest
    d = ContrastiveEncoder(**{**kw, "epochs": 2}).fit(x)        # other config: new digest
    assert not d.cache_hit and d.digest != a.digest


def test_digest_covers_config_and_bytes():
    x = np.zeros((4, 1, 8, 8), np.float32)
    cfg = contrastive.ContrastiveConfig(dim=8)
    y = x.copy()
    y[0, 0, 0, 0] = 1e-3
    assert encoder_digest(cfg, x) == encoder_digest(cfg, x.copy())
    assert encoder_digest(cfg, x) != encoder_digest(cfg, y)
    assert encoder_digest(cfg, x) != encoder_digest(contrastive.ContrastiveConfig(dim=9), x)


def test_save_with_run_and_pickle(tmp_path):
    import pickle
    x = np.random.default_rng(1).random((20, 1, 8, 8)).astype(np.float32)
    e = ContrastiveEncoder(dim=8, epochs=1, batch_size=8, trainer="local", cache_dir=None).fit(x)
    path = e.save(str(tmp_path))
    payload = torch.load(path, weights_only=True)
    assert payload["digest"] == e.digest and payload["image_shape"] == [1, 8, 8]
    e2 = pickle.loads(pickle.dumps(e))
    np.testing.assert_allclose(e2.transform(x), e.transform(x), atol=1e-6)


def test_resnet_backbone_for_32x32_shapes():
    net = contrastive.build_backbone((3, 32, 32), 512)
    assert isinstance(net, contrastive.ResNet18Small)
    assert net(torch.zeros(2, 3, 32, 32)).shape == (2, 512)
    assert contrastive.build_backbone((1, 28, 28), 32)(torch.zeros(2, 1, 28, 28)).shape == (2, 32)


def test_nt_xent_prefers_aligned_views():
    z = torch.randn(16, 8)
    aligned = nt_xent(z, z + 0.01 * torch.randn(16, 8), 0.2)
    shuffled = nt_xent(z, z[torch.randperm(16)], 0.2)
    assert float(aligned) < float(shuffled)


def test_augmentations_keep_shape_and_erase_zeroes():
    g = torch.Generator().manual_seed(0)
    x = torch.ones(8, 1, 28, 28)
    for f in (weak_view, strong_view):
        assert f(x, g, True).shape == x.shape
    er = random_erase(x, g, p=1.0)
    assert (er == 0).any(dim=(1, 2, 3)).all() and er.shape == x.shape


def test_hog_encoder_public_fit_and_pca_reduction():
    x = np.random.default_rng(0).random((30, 1, 28, 28)).astype(np.float32)
    e = make_encoder("hog", dim=0).fit(x)
    f = e.transform(x[:5])
    assert f.shape == (5, 1296)          # 4-px cells: 6x6 blocks of 2x2 cells x 9 orientations
    np.testing.assert_array_equal(f, e.transform(x[:5]))
    r = HOGEncoder(dim=8).fit(x)
    assert r.transform(x).shape == (30, 8)


def test_feature_student_inputs_and_every_public_sample_a_query(digits_data, tmp_path):
    import pickle

    from rknn_ray.student.stage import feature_inputs
    cfg, data = digits_data
    n = len(data.splits.public_x)
    encoder, emb, qs = fit_queries(cfg.with_overrides([f"queries.s={n}"]), data)
    np.testing.assert_array_equal(qs.public_index, np.arange(n))      # no k-means needed
    np.testing.assert_array_equal(qs.assignment, np.arange(n))
    view, eval_emb, shape = feature_inputs(encoder, data.splits, emb, str(tmp_path))
    assert shape == (emb.shape[1],) and view.public_x.shape == emb.shape
    assert data.splits.public_x.ndim == 4                             # the original is untouched
    with open(tmp_path / "encoder.pkl", "rb") as fh:
        np.testing.assert_allclose(pickle.load(fh).transform(data.splits.eval_x), eval_emb, atol=1e-5)


@pytest.mark.parametrize("encoder, trainer, resume, expected", [
    ("simclr", "ray", False, [("ray", ["reserved"]), "encoder"]),    # reserve, Ray, then encoder
    ("simclr", "ray", True, [("ray", []), "encoder"]),               # --resume: nothing reserved
    ("simclr", "local", False, ["encoder"]),
    ("pca", "ray", False, ["encoder"])])
def test_the_job_starts_ray_before_an_encoder_that_trains_on_it(
        digits_data, monkeypatch, tmp_path, isolated_privacy_ledger, encoder, trainer, resume,
        expected):
    """The library never starts Ray, so the job does it first when the encoder trains on Ray
    Train: after the budget reservation (nothing randomized yet), before the encoder."""
    import rknn_ray.job.stages
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.job import run
    cfg, _ = digits_data
    cfg = cfg.with_overrides([f"represent.encoder={encoder}", f"represent.trainer={trainer}",
                              "run.progress=false"])
    events = []

    def start_ray():
        rows = [r for d in BudgetStore(str(isolated_privacy_ledger)).datasets()
                for r in d["releases"]]
        events.append(("ray", [r["status"] for r in rows]))
        return False

    def fit_queries(*args, **kwargs):
        events.append("encoder")
        raise RuntimeError("stop after the encoder")
    monkeypatch.setattr(rknn_ray.job.stages, "fit_queries", fit_queries)
    out = tmp_path / "run"
    out.mkdir()
    if resume:           # a saved release, tagged under this ledger's key (resume checks it first)
        from rknn_ray.job.release_file import TAG, release_tag, release_tag_key
        arrays = {"meta": np.array('{"job_id": "0123abcd"}')}
        arrays[TAG] = np.array(release_tag(release_tag_key(
            BudgetStore(str(isolated_privacy_ledger))), arrays))
        with open(out / "release.npz", "wb") as fh:
            np.savez(fh, **arrays)
    with pytest.raises(RuntimeError, match="stop after the encoder"):
        run(cfg, str(out), resume=resume, start_ray=start_ray)
    assert events == expected
    if not resume:           # the encoder failed before any client randomized: reservation back
        (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
        assert [r["status"] for r in dataset["releases"]] == ["unused"]

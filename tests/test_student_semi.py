"""Semi-supervised student: confidences, targets, encoder initialization, public-only training."""
from dataclasses import asdict

import numpy as np
import pytest
import torch

from rknn_ray.representation.contrastive import ContrastiveEncoder
from rknn_ray.student.semi import (SemiConfig, build_semi_model, label_confidence, semi_loop,
                                   train_semi_student)


def test_label_confidence_grows_with_gap_and_falls_with_noise():
    counts = np.array([[10, 0, 0], [10, 8, 0], [10, 10, 0], [0, 0, 0]], float)
    c = label_confidence(counts, noise_std=3.0)
    assert np.all((c >= 0) & (c <= 1))
    assert c[0] > c[1] > c[2] and c[3] == 0
    assert label_confidence(counts, 30.0)[0] < c[0]


@pytest.mark.parametrize("target", ["hard", "soft", "weighted"])
def test_semi_student_learns_digits_in_two_epochs_any_target(digits, target):
    xtr, ytr, xte, yte = digits
    xtr, ytr = xtr[:600], ytr[:600]
    weight = np.ones(len(ytr), np.float32)
    targets = np.eye(10, dtype=np.float32)[ytr] if target == "soft" else ytr
    res = train_semi_student(xtr, targets, weight, xte, yte, 10,
                             SemiConfig(epochs=2, batch_size=32, lr=3e-3, target=target,
                                        flip=False, trainer="local"))
    assert res.test_accuracy > 0.3 and len(res.history) == 2
    assert {"sup_loss", "unsup_loss", "mask_rate", "train_loss"} <= set(res.history[0])


def test_zero_weight_rows_do_not_train():
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 8, 8)).astype(np.float32)
    data = {"x": x, "targets": rng.integers(0, 3, 64), "weight": np.zeros(64, np.float32),
            "num_classes": 3, "encoder": None}
    out = semi_loop(data, {**asdict(SemiConfig(epochs=1, batch_size=32, flip=False)),
                           "threshold": 1.0})
    assert out["history"][0]["sup_loss"] == 0.0


def test_initialized_from_the_contrastive_backbone(tmp_path):
    x = np.random.default_rng(1).random((32, 1, 8, 8)).astype(np.float32)
    enc = ContrastiveEncoder(dim=16, epochs=1, batch_size=16, flip=False, trainer="local",
                             cache_dir=None).fit(x)
    meta = {"dim": 16, "backbone": "auto", "state_dict": enc.state_dict}
    model = build_semi_model((1, 8, 8), 10, meta)
    for k, v in enc.state_dict.items():
        torch.testing.assert_close(model.backbone.state_dict()[k], v)
    res = train_semi_student(x, np.zeros(32, np.int64), None, x, np.zeros(32, np.int64), 10,
                             SemiConfig(epochs=1, batch_size=16, flip=False, trainer="local"),
                             encoder=enc, checkpoint_dir=str(tmp_path))
    assert (tmp_path / "student.pt").exists() and res.epochs == 1

"""Student models, losses and the in-process training loop (fast; no Ray)."""
import json
import logging
import math

import numpy as np
import pytest
import torch

from rknn_ray.errors import ConfigError, DataError
from rknn_ray.student import (StudentConfig, accuracy, build_model, hard_label_loss, load_student,
                              resolve_arch, soft_label_loss, train_student_local)
from rknn_ray.student.train import _shard_indices
from rknn_ray.training.logs import _STATE_API_NOISE, _without_noise, quiet_train_logs




@pytest.mark.parametrize("shape, arch", [((1, 8, 8), "cnn8"), ((1, 28, 28), "cnn28"),
                                         ((3, 32, 32), "cnn32"), ((64,), "mlp")])
def test_models_output_shapes(shape, arch):
    assert resolve_arch(shape) == arch
    model = build_model(shape, 10)
    out = model(torch.zeros(5, *shape))
    assert out.shape == (5, 10)
    # the same net accepts a different class count
    assert build_model(shape, 3, arch)(torch.zeros(2, *shape)).shape == (2, 3)


def test_mlp_on_images_and_bad_shapes():
    assert build_model((1, 8, 8), 4, "mlp")(torch.zeros(2, 1, 8, 8)).shape == (2, 4)
    with pytest.raises(ConfigError, match="student.arch"):
        build_model((64,), 10, "cnn8")
    with pytest.raises(ConfigError, match="image_shape"):
        build_model((2, 8, 8), 10)
    with pytest.raises(ConfigError, match="unknown architecture"):
        build_model((1, 8, 8), 10, "resnet")


def test_soft_loss_equals_hard_loss_on_one_hot():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 7, generator=g)
    labels = torch.randint(0, 7, (32,), generator=g)
    one_hot = torch.nn.functional.one_hot(labels, 7).float()
    torch.testing.assert_close(soft_label_loss(logits, one_hot), hard_label_loss(logits, labels))
    w = torch.rand(32, generator=g)
    torch.testing.assert_close(soft_label_loss(logits, one_hot, w), hard_label_loss(logits, labels, w))


def test_soft_loss_closed_form_and_weights():
    # uniform logits: cross-entropy of any distribution against uniform is log(C)
    targets = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]])
    assert soft_label_loss(torch.zeros(2, 3), targets).item() == pytest.approx(math.log(3))
    # one row, hand computed: -(sum_c p_c * log softmax(z)_c)
    z = torch.tensor([[1.0, 2.0, 3.0]])
    logp = z - torch.logsumexp(z, 1, keepdim=True)
    expect = -(targets[:1] * logp).sum().item()
    assert soft_label_loss(z, targets[:1]).item() == pytest.approx(expect)
    # a zero weight removes a row exactly; an all-zero batch gives 0, not NaN
    zz = torch.cat([z, torch.tensor([[9.0, -9.0, 0.0]])])
    assert soft_label_loss(zz, targets, torch.tensor([1.0, 0.0])).item() == pytest.approx(expect)
    assert hard_label_loss(zz, torch.tensor([0, 1]), torch.zeros(2)).item() == 0.0


def test_shards_are_equal_size_and_cover_everything():
    shards = [_shard_indices(11, seed=3, rank=r, world=3) for r in range(3)]
    assert [len(s) for s in shards] == [4, 4, 4]          # ceil(11/3), padded like DistributedSampler
    assert set(np.concatenate(shards)) == set(range(11))


def test_local_training_reaches_90_percent_on_digits(digits, tmp_path):
    xtr, ytr, xte, yte = digits
    seen = []
    res = train_student_local(xtr, ytr, xte, yte, (1, 8, 8), 10, StudentConfig(epochs=10, seed=0),
                              storage_path=str(tmp_path), progress=seen.append)
    assert res.test_accuracy >= 0.9
    assert res.epochs == 10 and len(res.history) == 10 and seen == res.history
    assert res.history[-1]["train_loss"] < res.history[0]["train_loss"] / 5
    assert res.checkpoint_path == str(tmp_path / "student.pt")
    assert json.loads((tmp_path / "history.json").read_text()) == res.history
    # the checkpoint is the trained model: reloaded accuracy is the reported one
    assert accuracy(load_student(res.checkpoint_path), xte, yte) == res.test_accuracy
    assert res.device == "cpu" and res.num_workers == 1 and 0 < res.train_seconds <= res.seconds


def test_local_training_is_reproducible(digits):
    xtr, ytr, xte, yte = digits
    cfg = StudentConfig(epochs=2, seed=5)
    a = train_student_local(xtr[:400], ytr[:400], xte, yte, (1, 8, 8), 10, cfg)
    b = train_student_local(xtr[:400], ytr[:400], xte, yte, (1, 8, 8), 10, cfg)
    assert a.history == b.history and a.test_accuracy == b.test_accuracy
    c = train_student_local(xtr[:400], ytr[:400], xte, yte, (1, 8, 8), 10, StudentConfig(epochs=2, seed=6))
    assert c.history != a.history


def test_soft_labels_with_unlabeled_rows_on_flat_features(digits):
    """Soft targets + zero-weight rows: the unlabeled rows (garbage targets) must be ignored."""
    xtr, ytr, xte, yte = digits
    n = len(ytr)
    soft = np.full((n, 10), 0.02, dtype=np.float32)
    soft[np.arange(n), ytr] = 0.82                     # label smoothing: rows sum to 1
    weight = np.ones(n, dtype=np.float32)
    weight[::3] = 0.0                                  # a third unlabeled ...
    soft[::3] = 0.0                                    # ... with targets that are not distributions
    res = train_student_local(xtr.reshape(n, 64), soft, xte.reshape(-1, 64), yte, (64,), 10,
                              StudentConfig(epochs=15, label_type="soft", seed=1), sample_weight=weight)
    assert res.test_accuracy >= 0.9


def test_input_errors_name_the_fix(digits):
    xtr, ytr, xte, yte = digits
    args = (xte, yte, (1, 8, 8), 10)
    with pytest.raises(ConfigError, match="label_type"):
        train_student_local(xtr, np.eye(10)[ytr], *args)                       # soft targets, hard mode
    bad = ytr.copy()
    bad[0] = 10
    with pytest.raises(DataError, match="sample_weight=0"):
        train_student_local(xtr, bad, *args)
    with pytest.raises(DataError, match="every sample_weight is 0"):
        train_student_local(xtr, ytr, *args, sample_weight=np.zeros(len(ytr)))
    with pytest.raises(DataError, match="expected"):
        train_student_local(xtr.reshape(-1, 64), ytr, *args)
    with pytest.raises(DataError, match="not distributions"):
        train_student_local(xtr, np.full((len(ytr), 10), 0.5), *args, config=StudentConfig(label_type="soft"))
    with pytest.raises(ConfigError, match="student.epochs"):
        StudentConfig(epochs=0).validate()
    with pytest.raises(ConfigError, match="student.label_type"):
        StudentConfig(label_type="fuzzy").validate()


class _Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_state_api_noise_is_filtered():
    """Both paths: the Train logger in-process, and forwarded worker lines the driver prints."""
    quiet_train_logs()
    log = logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner")
    keep = _Keep()
    log.addHandler(keep)   # Ray's loggers do not propagate to root, so listen on the logger itself
    try:
        log.warning("Failed to query actor state. %s. Continuing to monitor.", _STATE_API_NOISE)
        log.warning("a real problem")
    finally:
        log.removeHandler(keep)
    assert keep.messages == ["a real problem"]

    printed = []
    emit = _without_noise(printed.append)
    emit({"pid": 1, "lines": [f"x {_STATE_API_NOISE} y"]})                 # all noise: nothing printed
    emit({"pid": 2, "lines": ["keep me", _STATE_API_NOISE, "and me"]})
    # abseil's mutex trace, as a Ray worker printed it in a CI run of the README demo
    emit({"pid": 3, "lines": [
        "[mutex.cc : 452] RAW: Lock blocking 0x560a8e404e70   @ 0x7f93eec2b1a2 0x7f93edcfb23c",
        "[mutex.cc : 452] RAW: Lock returning 0x560a8e404e70   @ 0x7f93eec2b1a2",
        "[mutex.cc : 452] RAW: Unlock 0x560a8e404e70   @ 0x7f93ee5c2125 0x7f93eec4c3b0"]})
    emit({"pid": 4, "lines": ["a mutex.cc problem of our own: RAW: Lock blocking", "kept"]})
    assert printed == [{"pid": 2, "lines": ["keep me", "and me"]},
                       {"pid": 4, "lines": ["a mutex.cc problem of our own: RAW: Lock blocking", "kept"]}]

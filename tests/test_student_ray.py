"""The student under real Ray Train (TorchTrainer, 2 CPU workers, DDP over gloo)."""
import json
import os
import threading
import time

import numpy as np
import pytest

from rknn_ray.errors import ConfigError
from rknn_ray.student import StudentConfig, accuracy, load_student, train_student




def test_more_workers_than_cpus_is_refused_before_training(ray_session, digits, tmp_path):
    xtr, ytr, xte, yte = digits
    cpus = int(ray_session.cluster_resources()["CPU"])
    with pytest.raises(ConfigError, match="student.num_workers"):
        train_student(xtr, ytr, xte, yte, (1, 8, 8), 10,
                      StudentConfig(epochs=1, num_workers=cpus + 1, use_gpu=False), storage_path=str(tmp_path))


@pytest.mark.slow  # ~35-70 s here: ~30 s is TorchTrainer's fixed start-up cost
def test_ray_train_two_workers_on_digits(ray_session, digits, tmp_path):
    xtr, ytr, xte, yte = digits
    # a sixth of the rows are "unlabeled queries": garbage labels, weight 0 -> must be ignored
    weight = np.ones(len(ytr), dtype=np.float32)
    weight[::6] = 0.0
    labels = ytr.copy()
    labels[::6] = (labels[::6] + 1) % 10
    seen, arrived = [], []

    def on_epoch(row):
        seen.append(row)
        arrived.append((threading.current_thread().name, time.monotonic()))

    t0 = time.monotonic()
    res = train_student(xtr, labels, xte, yte, (1, 8, 8), 10,
                        StudentConfig(epochs=8, num_workers=2, use_gpu=False, seed=0),
                        storage_path=str(tmp_path / "ray"), checkpoint_dir=str(tmp_path / "ckpt"),
                        progress=on_epoch, sample_weight=weight)
    returned = time.monotonic()
    assert res.num_workers == 2 and res.device == "cpu" and res.epochs == 8
    assert len(res.history) == 8 and seen == res.history       # each epoch once, in order
    assert [r["epoch"] for r in seen] == list(range(1, 9))
    # epochs reach the driver while Train still runs, not all at its end: the relay's poll
    # thread runs only inside trainer.fit(), so a row it delivered arrived live
    assert any(thread == "rknn-live-epochs" for thread, _ in arrived), arrived
    assert t0 < arrived[0][1] < returned - 0.5
    assert res.history[-1]["train_loss"] < res.history[0]["train_loss"] / 3
    assert res.history[-1]["train_accuracy"] > 0.9
    assert res.test_accuracy >= 0.9
    # the copied checkpoint is the model that was evaluated
    assert res.checkpoint_path == str(tmp_path / "ckpt" / "student.pt")
    assert accuracy(load_student(res.checkpoint_path), xte, yte) == res.test_accuracy
    with open(tmp_path / "ckpt" / "history.json") as f:
        assert json.load(f) == res.history
    assert set(res.timings) >= {"workers_start", "train", "evaluate"}
    # Ray Train's own copy (its student-<id>/ storage) is removed once checkpoint_dir has it
    stored = [os.path.join(dp, f) for dp, _, fs in os.walk(tmp_path / "ray") for f in fs if f == "student.pt"]
    assert stored == [] and not list((tmp_path / "ray").glob("student-*"))
    assert 0 < res.train_seconds < res.seconds
    print(f"\nray train: total {res.seconds:.1f}s, in epoch loop {res.train_seconds:.1f}s, "
          f"overhead {res.seconds - res.train_seconds:.1f}s, acc {res.test_accuracy:.3f}")


@pytest.mark.slow  # TorchTrainer's fixed start-up
def test_one_ray_worker_trains_the_student_train_student_local_trains(ray_session, digits, tmp_path):
    """One loop, two runners: on one Ray Train worker the same seed gives the in-process student
    (the same rows in the same order; only float sums over other thread counts may differ)."""
    from rknn_ray.student import train_student_local
    xtr, ytr, xte, yte = digits
    cfg = StudentConfig(epochs=2, num_workers=1, use_gpu=False, seed=4)
    ray_res = train_student(xtr[:500], ytr[:500], xte, yte, (1, 8, 8), 10, cfg,
                            storage_path=str(tmp_path))
    local = train_student_local(xtr[:500], ytr[:500], xte, yte, (1, 8, 8), 10, cfg)
    assert ray_res.num_workers == 1 and ray_res.checkpoint_path == str(tmp_path / "student.pt")
    assert [h["train_loss"] for h in ray_res.history] == \
        pytest.approx([h["train_loss"] for h in local.history], rel=1e-4)
    assert ray_res.test_accuracy == pytest.approx(local.test_accuracy, abs=2 / len(yte))
    assert not list(tmp_path.glob("student-*"))          # Train's own run folder is gone

"""Student epochs reach the driver while Ray Train is still running (not all at its end)."""
import threading
import time

import numpy as np

from rknn_ray.student import StudentConfig, train_student


def test_epochs_arrive_while_training_runs(ray_session, digits, tmp_path):
    x, y, tx, ty = digits
    seen = []

    def on_epoch(row):
        seen.append((row["epoch"], threading.current_thread().name, time.monotonic()))

    cfg = StudentConfig(epochs=6, batch_size=64, num_workers=2, seed=0)
    t0 = time.monotonic()
    res = train_student(x[:400], y[:400], tx[:200], ty[:200], (1, 8, 8), 10, cfg,
                        storage_path=str(tmp_path), progress=on_epoch)
    returned = time.monotonic()
    assert [e for e, _, _ in seen] == [1, 2, 3, 4, 5, 6]              # each epoch once, in order
    assert [r["epoch"] for r in res.history] == [1, 2, 3, 4, 5, 6]
    # the relay's poll thread runs only inside trainer.fit(): a row it delivered arrived live
    live = [e for e, thread, _ in seen if thread == "rknn-live-epochs"]
    assert live, f"no epoch arrived before fit() returned: {seen}"
    assert seen[0][2] < returned - 0.5 and seen[0][2] > t0
    assert np.isfinite(res.test_accuracy)

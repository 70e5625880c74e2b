"""The training loops under real Ray Train (a TorchTrainer of CPU workers)."""
import pytest

from rknn_ray.errors import ConfigError
from rknn_ray.student import StudentConfig, train_student


def test_more_workers_than_cpus_is_refused_before_training(ray_session, digits, tmp_path):
    xtr, ytr, xte, yte = digits
    cpus = int(ray_session.cluster_resources()["CPU"])
    with pytest.raises(ConfigError, match="student.num_workers"):
        train_student(xtr, ytr, xte, yte, (1, 8, 8), 10,
                      StudentConfig(epochs=1, num_workers=cpus + 1, use_gpu=False), storage_path=str(tmp_path))


@pytest.mark.slow  # one TorchTrainer start-up (~30 CPU s here) for the three loops
def test_every_loop_runs_on_a_ray_train_worker_as_it_runs_in_process(ray_session, digits,
                                                                    tmp_path, monkeypatch):
    """One loop, two runners, for each loop of the project: the supervised student, the semi
    student and the SimCLR encoder each build their loop's inputs and hand them, with
    trainer=ray, to the one launcher (``fit_on_ray``). Those very inputs then run on one Ray
    Train worker, in one TorchTrainer (its start-up is the cost here, not the loops), and
    give what this process gives: the same rows in the same order, so the same losses
    (only float sums over other thread counts may differ). Epoch rows arrive live.

    The DDP path (two workers) is proven end to end by the README demo's job
    (tests/test_progress_demo_console.py), the cluster path by tests/test_cluster_submit.py."""
    import torch

    import rknn_ray.training.ray_train as ray_train
    from rknn_ray.representation.contrastive import ContrastiveEncoder
    from rknn_ray.student.semi import SemiConfig, train_semi_student
    from rknn_ray.training import resolve_loop
    from rknn_ray.training.local import fit_local
    xtr, ytr, xte, yte = digits
    handed = []             # what each entry point gives the launcher; run here to finish it

    def in_process(loop, data, cfg, **kw):
        handed.append((loop, data, cfg, kw))
        return fit_local(loop, data, cfg, use_gpu=False, on_epoch=kw.get("on_epoch"))
    monkeypatch.setattr(ray_train, "fit_on_ray", in_process)
    student = train_student(xtr[:500], ytr[:500], xte, yte, (1, 8, 8), 10,
                            StudentConfig(epochs=2, num_workers=1, use_gpu=False, seed=4),
                            storage_path=str(tmp_path / "student"))
    semi = train_semi_student(xtr[:256], ytr[:256], None, xte, yte, 10,
                              SemiConfig(epochs=2, batch_size=32, flip=False, trainer="ray",
                                         use_gpu=False), progress=lambda row: None)
    encoder = ContrastiveEncoder(dim=8, epochs=1, batch_size=16, flip=False, trainer="ray",
                                 cache_dir="", use_gpu=False).fit(xtr[:64])
    monkeypatch.undo()
    assert [(kw["name"], kw["trainer_key"], kw["num_workers"]) for *_, kw in handed] == [
        ("student", "student.trainer", 1), ("semi student", "represent.trainer", 1),
        ("encoder", "represent.trainer", 1)]
    assert handed[1][3]["on_epoch"] is not None      # the caller's progress reaches the launcher
    local = [student.history, semi.history, encoder.history]

    def every_loop(jobs, cfg, device, on_epoch):
        """Each handed loop in turn on this worker; rows tagged so none is mistaken for another."""
        payloads, rows = [], []

        def tagged(which):
            def push(row):
                rows.append({**row, "loop": which, "epoch": len(rows) + 1})
                if on_epoch is not None:
                    on_epoch(rows[-1])
            return push
        for which, (loop, data, loop_cfg) in enumerate(jobs):
            payloads.append(resolve_loop(loop)(data, loop_cfg, device, tagged(which)))
        return {"payloads": payloads, "history": rows}

    seen = []
    run = ray_train.fit_on_ray(every_loop, [(loop, data, cfg) for loop, data, cfg, _ in handed],
                               {}, name="every-loop", num_workers=1, use_gpu=False,
                               on_epoch=seen.append, storage_path=str(tmp_path / "ray"))
    assert run.num_workers == 1 and run.device == "cpu"
    assert seen == run.payload["history"]            # every row once, in order
    assert [r["loop"] for r in seen] == [0, 0, 1, 1, 2]
    on_ray = [p["history"] for p in run.payload["payloads"]]
    for ray_rows, local_rows in zip(on_ray, local):
        assert [sorted(r) for r in ray_rows] == [sorted(r) for r in local_rows]
        loss = "loss" if "loss" in local_rows[0] else "train_loss"
        assert [r[loss] for r in ray_rows] == pytest.approx([r[loss] for r in local_rows], rel=1e-4)
    trained = run.payload["payloads"][2]["state_dict"]  # the encoder's weights, not only its loss
    for name, value in encoder.state_dict.items():
        torch.testing.assert_close(trained[name], value, rtol=1e-3, atol=1e-5)
    assert not list((tmp_path / "ray").glob("every-loop-*"))   # Train's own run folder is gone

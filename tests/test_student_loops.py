"""One way to run the training loops (rknn_ray.training): the same results as before it,
loops by name or callable, and no Ray started by surprise."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rknn_ray.errors import ConfigError
from rknn_ray.representation.contrastive import ContrastiveEncoder
from rknn_ray.student import StudentConfig, train_student_local
from rknn_ray.student.semi import SemiConfig, semi_loop, train_semi_student
from rknn_ray.training import resolve_loop, run_loop

ROOT = Path(__file__).resolve().parents[1]

# Recorded on digits with the code before rknn_ray.training existed (commit 3e4be3b: each loop
# with its own runner), same machine, same seeds: the local path must still give these.
BEFORE = {"supervised": [0.31155778894472363, [[2.288038492202759, 0.13125],
                                               [2.2292915026346845, 0.18125]]],
          "simclr": [4.843266725540161, 191.50211375465034],
          "semi": [0.254606365159129, [[1.3279680967330934, 0.0], [1.2437477469444276, 0.0]]]}


def test_the_three_loops_give_the_results_recorded_before_the_launcher(digits):
    xtr, ytr, xte, yte = digits
    acc = pytest.approx                             # float sums may differ in the last bits
    w = np.ones(600, np.float32)
    w[::5] = 0.0
    r = train_student_local(xtr[:600], ytr[:600], xte, yte, (1, 8, 8), 10,
                            StudentConfig(epochs=2, seed=3, augment="shift", batch_size=32),
                            sample_weight=w)
    assert r.test_accuracy == acc(BEFORE["supervised"][0], abs=1.5 / len(yte))
    assert [v for h in r.history for v in (h["train_loss"], h["train_accuracy"])] == \
        acc(np.ravel(BEFORE["supervised"][1]).tolist(), rel=1e-5)
    enc = ContrastiveEncoder(dim=16, epochs=1, batch_size=64, flip=False, trainer="local",
                             cache_dir="").fit(xtr[:256])         # "": trains, never a cached one
    assert not enc.cache_hit
    weights = sum(float(v.double().sum()) for v in enc.state_dict.values() if v.is_floating_point())
    assert [enc.history[0]["loss"], weights] == acc(BEFORE["simclr"], rel=1e-5)
    r = train_semi_student(xtr[:300], ytr[:300], np.linspace(0.2, 1, 300).astype(np.float32), xte,
                           yte, 10, SemiConfig(epochs=2, batch_size=32, lr=3e-3, target="weighted",
                                               flip=False, trainer="local"), encoder=enc)
    assert r.test_accuracy == acc(BEFORE["semi"][0], abs=1.5 / len(yte))
    assert [v for h in r.history for v in (h["train_loss"], h["mask_rate"])] == \
        acc(np.ravel(BEFORE["semi"][1]).tolist(), rel=1e-5)


def test_a_loop_runs_by_name_or_callable_and_a_bad_trainer_names_its_key():
    assert resolve_loop("rknn_ray.student.semi:semi_loop") is semi_loop
    assert resolve_loop(semi_loop) is semi_loop
    seen = []
    run = run_loop("tests.test_student_loops:_toy_loop", {"n": 3}, {"scale": 2.0},
                   on_epoch=seen.append, use_gpu=False)
    assert run.payload == {"history": [{"epoch": 1, "value": 6.0}], "device": "cpu"}
    assert seen == run.payload["history"] and run.device == "cpu" and run.num_workers == 1
    with pytest.raises(ConfigError, match="represent.trainer"):
        run_loop(_toy_loop, {"n": 1}, {"scale": 1.0}, trainer="slurm", trainer_key="represent.trainer")


def _toy_loop(data, cfg, device, on_epoch=None):
    row = {"epoch": 1, "value": data["n"] * cfg["scale"]}
    if on_epoch is not None:
        on_epoch(row)
    return {"history": [row], "device": str(device)}


NO_RAY = """
import numpy as np
from rknn_ray.errors import RknnError
from rknn_ray.representation.contrastive import ContrastiveEncoder
from rknn_ray.student import StudentConfig, train_student
x = np.random.default_rng(0).random((32, 1, 8, 8)).astype(np.float32)
y = np.arange(32) % 10
for name, fit in [("student", lambda: train_student(x, y, x, y, (1, 8, 8), 10, StudentConfig(epochs=1))),
                  ("encoder", lambda: ContrastiveEncoder(dim=8, epochs=1, batch_size=16,
                                                         cache_dir=None).fit(x))]:
    try:
        fit()
        print(name, "trained")
    except RknnError as exc:
        print(name, "|", exc)
import ray
print("ray running:", ray.is_initialized())
"""


def test_ray_train_without_a_running_ray_says_how_to_fix_it_and_starts_nothing():
    """The library never starts Ray itself (the job does, rknn_ray.job.ray_env.ensure_ray)."""
    out = subprocess.run([sys.executable, "-c", NO_RAY], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "RAY_ADDRESS": ""})
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout + out.stderr
    student, encoder, running = lines
    for line, key in ((student, "student.trainer"), (encoder, "represent.trainer")):
        assert "Ray is not running" in line and "ensure_ray() first" in line, line
        assert f"{key}=local" in line, line
    assert running == "ray running: False"


def test_distribute_takes_in_process_cuda_without_an_index(monkeypatch):
    """The in-process runner asks for "cuda" (no index); torch.cuda.set_device refuses that
    (found on a lent H100 by benchmarks.gpu_parity), so only a Ray Train worker's cuda:N is set."""
    import torch

    from rknn_ray.training import distribute
    chosen, moved = [], []

    def set_device(device):
        if torch.device(device).index is None:      # what torch itself raises on
            raise ValueError("Expected a torch.device with a specified index")
        chosen.append(device)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(torch.nn.Module, "to", lambda self, d: moved.append(str(d)) or self)
    model = torch.nn.Linear(2, 2)
    assert distribute(model, "cuda") is model and chosen == [] and moved == ["cuda"]
    distribute(model, torch.device("cuda", 1))
    assert chosen == [torch.device("cuda", 1)] and moved == ["cuda", "cuda:1"]


def test_a_semi_run_of_one_epoch_and_ten_steps_trains(digits):
    """OneCycleLR divides by zero when its warm-up ends at step 0 (pct_start 0.1 of 10 steps);
    rknn_ray.training.one_cycle gives that run a 2-step warm-up instead of a crash."""
    import torch

    from rknn_ray.training import one_cycle
    xtr, ytr, xte, yte = digits
    res = train_semi_student(xtr[:1280], ytr[:1280], None, xte, yte, 10,
                             SemiConfig(epochs=1, batch_size=128, trainer="local", flip=False))
    assert len(res.history) == 1 and np.isfinite(res.history[0]["train_loss"])
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    lrs = []
    for total in (1, 2, 10, 40):
        sched = one_cycle(opt, 0.1, total, pct_start=0.1)
        for _ in range(total):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
    assert all(np.isfinite(lrs))
    assert isinstance(one_cycle(opt, 0.1, 40, 0.1), torch.optim.lr_scheduler.OneCycleLR)


class _Controller:
    def run(self):
        import time
        time.sleep(120)


@pytest.mark.parametrize("setup_s, interrupt_after_s", [(0.0, 3.0), (2.0, 0.1)],
                         ids=["blocked_in_run", "controller_not_yet_created"])
def test_an_interrupted_fit_is_ended_while_ray_is_up(ray_session, setup_s, interrupt_after_s):
    """What fit_off_main_thread does on an interrupt: the helper thread blocked in
    ray.get(controller.run.remote()) (Ray Train's _initialize_and_run_controller) gets its
    controller killed, so it ends before the job shuts Ray down (a thread left inside Ray's
    native code crashed the process with SIGSEGV in 3 of 5 SIGINT probes). An interrupt
    that lands while fit() still sets up (no controller yet: on a busy machine the SIGINT
    probe hit that window, waited out its 15 s and crashed) is watched until the
    controller exists, which is then killed at once."""
    import threading
    import time

    from rknn_ray.training import ray_train
    done, errors = threading.Event(), []

    def _initialize_and_run_controller():
        time.sleep(setup_s)                        # Ray Train's set-up before the controller
        controller = ray_session.remote(num_cpus=0)(_Controller).remote()
        ray_session.get(controller.run.remote())

    def target():
        try:
            _initialize_and_run_controller()
        except BaseException as exc:  # noqa: BLE001 - what fit() raises in its thread
            errors.append(exc)
        finally:
            done.set()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    time.sleep(interrupt_after_s)
    t0 = time.monotonic()
    assert ray_train._stop_fit(thread, done, wait=30) and time.monotonic() - t0 < 30
    assert isinstance(errors[0], ray_session.exceptions.RayActorError)
    assert not ray_train.ABANDONED_FITS

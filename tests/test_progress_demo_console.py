"""The README demo's console, captured from a fresh process (its own local Ray): only the
project's lines and the result, and epoch lines while the student trains. It is also the
suite's end-to-end proof of the job's Ray Train path with DDP (the session's shared digits
runs train in the driver; tests/test_student_ray.py runs every loop on one Train worker):
two workers train a student that learns, the epochs arrive while it trains, and the run
folder holds the checkpoint Train wrote (the very model evaluated) and not Train's copies."""
import json
import os
import re
import subprocess
import sys

import pytest

PROJECT_LINE = re.compile(r"^\[ *(\d+\.\d)s\] (.*)$")
# what the console showed before these fixes (issue 13): none of it may come back
FIXED = ("Grad strides do not match", "Token authentication is enabled", "PreemptionWatcher",
         "core_worker.cc", "Reporting training result", "Requesting resources",
         "Setting up process group", "Wrapping provided model", "Moving model to device",
         "Started training worker group", "Checkpoint successfully created")
# a condition of a shared test machine, not of the demo: an overloaded CPU (load 25 on 2 cores
# seen here) times out Train's controller's 5 s resource request. Its traceback is excused only
# when the message that names the condition is there.
ENVIRONMENT = {"Failed to send resource request": "(TrainController pid="}


@pytest.mark.slow
def test_readme_demo_console_is_clean_and_live(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = os.getcwd()
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "jobs.distill", "--config",
                           "jobs/configs/digits_central.yaml", "--out", str(out),
                           "--set", "student.epochs=8", "--set", "queries.restarts=1"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stdout = proc.stdout.splitlines()
    assert len(stdout) == 2 and stdout[0] == f"run folder: {out}"
    assert stdout[1].startswith("central/laplace eps=1 delta=0 (record-level, replace-one)")
    lines = proc.stderr.splitlines()
    for needle in FIXED:
        assert not any(needle in line for line in lines), (needle, proc.stderr[-3000:])
    foreign = [line for line in lines if not PROJECT_LINE.match(line)]
    excused = [prefix for cause, prefix in ENVIRONMENT.items() if cause in proc.stderr]
    unexplained = [line for line in foreign if not any(p in line for p in excused)]
    assert not unexplained, "\n".join(unexplained)
    if foreign:
        print(f"{len(foreign)} lines from this machine's conditions:\n" + "\n".join(foreign[:5]))
    stamps = {m.group(2).strip(): float(m.group(1)) for m in map(PROJECT_LINE.match, lines) if m}
    first = [s for k, s in stamps.items() if k.startswith("student epochs: 1/8")]
    last = [s for k, s in stamps.items() if k.startswith("student epochs: 8/8")]
    done = [s for k, s in stamps.items() if k.startswith("student: Ray Train") and "done in" in k]
    assert first and last and done, proc.stderr[-3000:]
    assert first[0] < last[0] <= done[0]          # the first epoch was shown before the last ran
    report = json.loads((out / "report.json").read_text())
    student = report["student"]
    assert (student["trainer"], student["num_workers"], student["epochs"]) == ("ray", 2, 8)
    assert student["checkpoint"] == str(out / "student.pt") and 0 <= student["test_accuracy"] <= 1
    history = json.loads((out / "history.json").read_text())    # rank 0's rows, every epoch
    assert [row["epoch"] for row in history] == list(range(1, 9))
    # two DDP shards make one model that learns (8 epochs on 359 noisily labelled queries:
    # loss 2.29 -> 1.51-1.59, train accuracy 0.16 -> 0.74, test 0.86 in runs here; chance 0.1)
    assert history[-1]["train_loss"] < history[0]["train_loss"] * 0.85
    assert history[-1]["train_accuracy"] > 0.5 and student["test_accuracy"] >= 0.6
    from rknn_ray.config import load_config
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.student import accuracy, load_student
    splits = prepare_data(load_config(str(out / "config.yaml"))).splits
    model = load_student(student["checkpoint"])   # the copied checkpoint is what was evaluated
    assert accuracy(model, splits.eval_x, splits.eval_y) == student["test_accuracy"]
    assert report["timings_s"]["student"] > 0
    assert not list(out.glob("student-*"))        # Ray Train's storage removed once copied

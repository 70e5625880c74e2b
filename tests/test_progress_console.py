"""Progress output without Ray: bars on a terminal, periodic lines otherwise, nothing when off;
the console fixes that need no cluster (DDP-friendly strides, the local Ray environment)."""
import io
import re
import threading

import pytest
import torch

from rknn_ray.job.progress import Bar, NullBar, PolledBar, Progress, bar_for


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_mode_follows_the_terminal_and_quiet():
    assert Progress(True, io.StringIO()).mode == "lines"            # a log file, CI, ray job submit
    assert Progress(True, FakeTTY()).mode == "bars"
    assert Progress.for_console(True, quiet=True, stream=FakeTTY()).mode == "lines"
    assert Progress.for_console(False, stream=FakeTTY()).mode == "off"
    with pytest.raises(ValueError):
        Progress(True, io.StringIO(), mode="fancy")


def test_a_library_job_says_its_lines_through_logging(caplog, capsys):
    """From Python (``run(cfg)``): stage lines and bar counts are INFO records of the
    ``rknn_ray.job`` logger, nothing is written to stderr; ``run.progress=false``: no record."""
    import logging
    p = Progress.for_library(True)
    with caplog.at_level(logging.INFO, logger="rknn_ray"):
        with p.stage("labels", "labels from the released counts"):
            with p.bar("reports opened", 10, "reports") as bar:
                bar.set(10)
        Progress.for_library(False).say("silent")
    records = [r for r in caplog.records if r.name == "rknn_ray.job"]
    messages = [r.getMessage() for r in records]
    assert messages[:2] == ["labels from the released counts ...",
                            "reports opened: 10/10 reports (100%)"]
    assert len(messages) == 3 and messages[2].startswith("labels from the released counts done in ")
    assert all(r.levelno == logging.INFO and "silent" not in r.getMessage() for r in records)
    assert capsys.readouterr().err == ""
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("rknn_ray").handlers)


def test_lines_mode_prints_periodically_and_the_final_count(monkeypatch):
    out = io.StringIO()
    p = Progress(True, out, interval=3600)          # only the first update and the close print
    with p.bar("clients sealed", 100, "clients") as bar:
        for _ in range(10):
            bar.update(10)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith("clients sealed: 10/100 clients (10%)")
    assert lines[1].endswith("clients sealed: 100/100 clients (100%)")
    out2 = io.StringIO()
    p2 = Progress(True, out2, interval=0.0)         # every update prints, the close adds nothing new
    with p2.bar("reports opened", None, "reports") as bar:
        bar.set(5)
        bar.set(7)
    assert [ln.split("] ")[1] for ln in out2.getvalue().splitlines()] == \
        ["  reports opened: 5 reports", "  reports opened: 7 reports"]


def test_bars_mode_draws_tqdm_bars_and_keeps_lines_above_them():
    out = FakeTTY()
    p = Progress(True, out)
    bar = p.bar("clients sealed", 4, "clients")
    p.say("a line while a bar is open")
    bar.update(4)
    bar.close()
    text = out.getvalue()
    assert "clients sealed" in text and "4/4" in text and "100%" in text
    assert "a line while a bar is open" in text


def test_bar_redraws_clear_their_line_and_worker_lines_go_above_the_bars():
    """Every redraw clears the rest of its line (a closed bar kept the tail of a longer line
    drawn there: ``reports/s]gs/s]``), and a line Ray forwards while a bar is open is written
    on a line of its own, the bar drawn again below it (not appended to the bar's line)."""
    from rknn_ray.job.progress import CLEAR_LINE, console_write
    out = FakeTTY()
    p = Progress(True, out)
    bar = p.bar("clients sealed", 4, "clients")
    bar.update(2)
    assert out.getvalue().count("\r") == out.getvalue().count("\r" + CLEAR_LINE) > 0
    before = len(out.getvalue())
    with console_write():
        out.write("(Shard pid=7) a worker's line\n")
    written = out.getvalue()[before:]
    ahead, _, after = written.partition("(Shard pid=7)")
    assert ahead.endswith("\r" + CLEAR_LINE) and "clients sealed" not in ahead   # cleared first
    assert "clients sealed" in after                                              # drawn again
    bar.close()
    closed = out.getvalue()
    with console_write():                  # no bar open: nothing added around the line
        out.write("x\n")
    assert out.getvalue() == closed + "x\n"


def test_off_mode_prints_nothing_but_keeps_timings():
    out = io.StringIO()
    p = Progress(False, out)
    with p.stage("data"):
        with p.bar("clients sealed", 3) as bar:
            bar.update(3)
        ep = p.epochs(2)
        ep({"epoch": 1, "train_loss": 1.0})
        ep.bar.close()
    assert out.getvalue() == "" and "data" in p.timings
    assert isinstance(bar_for(None, "x"), NullBar)


def test_epoch_bar_shows_latest_metrics():
    out = io.StringIO()
    p = Progress(True, out, interval=0.0)
    with p.epochs(3) as on_epoch:
        for e in (1, 2, 3):
            on_epoch({"epoch": e, "train_loss": 1.0 / e, "train_accuracy": 0.3 * e})
    last = out.getvalue().splitlines()[-1]
    assert re.search(r"student epochs: 3/3 epoch \(100%\), train_loss 0\.3333, train_accuracy 0\.9", last)
    assert [r["epoch"] for r in on_epoch.rows] == [1, 2, 3] and len(on_epoch.times) == 3


def test_bar_is_thread_safe():
    p = Progress(True, io.StringIO(), interval=3600)
    bar = p.bar("x", None)
    threads = [threading.Thread(target=lambda: [bar.update(1) for _ in range(1000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert bar.n == 4000
    bar.close()


def test_polled_bar_follows_the_poll_and_sets_the_final_value():
    p = Progress(True, io.StringIO(), interval=0.0)
    values = iter(range(1, 1000))
    bar = p.bar("reports opened", None)
    polled = PolledBar(bar, lambda: next(values), interval=0.01)
    import time
    deadline = time.time() + 5
    while bar.n < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert bar.n >= 3
    polled.close(final=5000)
    assert bar.n == 5000 and bar.closed
    broken = PolledBar(p.bar("y", None), lambda: 1 / 0, interval=0.01)   # a failing poll is skipped
    time.sleep(0.05)
    broken.close()
    assert isinstance(broken.bar, Bar) and broken.bar.closed


def test_a_counter_that_has_not_moved_prints_no_line_until_it_closes():
    """A polled bar's first poll comes while the clients still seal: 'reports opened: 0' said
    nothing (and looked like a stall). The first line comes with the first count; closing
    still says the final one, zero included."""
    out = io.StringIO()
    p = Progress(True, out, interval=0.0)
    bar = p.bar("reports opened", None, "reports")
    bar.set(0)
    bar.set(0)
    assert out.getvalue() == ""
    bar.set(7)
    bar.close()
    assert [ln.split("] ")[1] for ln in out.getvalue().splitlines()] == [
        "  reports opened: 7 reports"]
    idle = p.bar("messages", None, "msgs")
    idle.set(0)
    idle.close()
    assert out.getvalue().splitlines()[-1].endswith("  messages: 0 msgs")


def test_random_shift_returns_standard_strides_for_one_channel():
    """With one channel, .contiguous() kept channels-last strides and DDP warned
    'Grad strides do not match bucket view strides'; the shift now copies to NCHW."""
    from rknn_ray.student.train import random_shift
    gen = torch.Generator().manual_seed(0)
    for c in (1, 3):
        x = torch.rand(5, c, 8, 8)
        out = random_shift(x, gen)
        assert out.shape == x.shape
        assert out.stride() == torch.empty(5, c, 8, 8).stride()


def test_local_ray_env_sets_defaults_and_respects_the_user(monkeypatch):
    import ray._raylet
    from rknn_ray.job import ray_env
    calls = []

    class FakeConfig:                   # Ray's own is immutable; the real refresh is tested end to end
        @staticmethod
        def initialize(s):
            calls.append(s)
    monkeypatch.setattr(ray._raylet, "Config", FakeConfig)
    for key in ("RAY_AUTH_MODE", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"):
        # setenv first: delenv of an unset key records nothing, and what local_ray_env sets
        # below then outlived the test (RAY_AUTH_MODE=token made the next Ray start fail
        # against this process's cached 'disabled' config)
        monkeypatch.setenv(key, "unset-by-this-test")
        monkeypatch.delenv(key)
    ray_env.local_ray_env()
    import os
    assert os.environ["RAY_AUTH_MODE"] == "token" and calls == [""]
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "0"
    assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")        # an explicit choice wins
    monkeypatch.setenv("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "1")
    calls.clear()
    ray_env.local_ray_env()
    assert os.environ["RAY_AUTH_MODE"] == "disabled" and calls == []
    assert os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] == "1"


def test_forwarded_cleaner_traceback_of_a_shared_host_is_dropped_other_lines_kept():
    from rknn_ray.training.logs import _without_noise
    got = []
    emit = _without_noise(got.append)
    tb = ["Exception in thread PlacementGroupCleanerMonitor:", "Traceback (most recent call last):",
          "ConnectionError: Found multiple active Ray instances: {'127.0.0.1:1', '127.0.0.1:2'}."]
    emit({"actor_name": "PlacementGroupCleaner", "pid": 1, "is_err": True, "lines": tb})
    assert got == []
    # split over batches, as Ray forwards it: held back, then dropped
    for part in (tb[:1], tb[1:2] + ["  File \"x.py\", line 1, in f", "    ^^^^"], tb[2:]):
        emit({"actor_name": "PlacementGroupCleaner", "pid": 3, "is_err": True, "lines": part})
    assert got == []
    # another traceback of the cleaner is passed on whole
    other = tb[:2] + ["ValueError: something else"]
    for part in (other[:1], other[1:]):
        emit({"actor_name": "PlacementGroupCleaner", "pid": 4, "is_err": True, "lines": part})
    assert [d["lines"] for d in got] == [other]
    got.clear()
    emit({"actor_name": "RayTrainWorker", "pid": 2, "is_err": True, "lines": tb})   # not the cleaner
    emit({"actor_name": "PlacementGroupCleaner", "pid": 1, "is_err": True,
          "lines": ["some other error"]})
    assert [d["actor_name"] for d in got] == ["RayTrainWorker", "PlacementGroupCleaner"]


def test_controllers_resource_request_timeout_traceback_is_dropped_other_errors_kept():
    """Under load Train's controller logged 'Failed to send resource request' with a whole
    GetTimeoutError traceback in the middle of the student bar (the job succeeded): dropped,
    also split over batches; the same warning with another exception still shows."""
    from rknn_ray.training.logs import _without_noise
    got = []
    emit = _without_noise(got.append)
    warning = ("2026-11-27 09:00:00,000\tWARNING autoscaling_coordinator_client.py:77 -- Failed "
               "to send resource request for train-abc. If this only happens transiently during "
               "network partition or CPU being overloaded, it's safe to ignore this error.")
    tb = [warning, "Traceback (most recent call last):",
          '  File "/ray/train/v2/_internal/execution/scaling_policy/x.py", line 60, in send',
          "    ray.get(", "    ^^^^^^^^",
          "ray.exceptions.GetTimeoutError: Get timed out: some object(s) not ready."]
    emit({"actor_name": "TrainController", "pid": 9, "is_err": True, "lines": tb})
    for part in (tb[:1], tb[1:4], tb[4:]):
        emit({"actor_name": "TrainController", "pid": 9, "is_err": True, "lines": part})
    assert got == []
    emit({"actor_name": "TrainController", "pid": 9, "is_err": True,
          "lines": ["an ordinary controller line"]})
    other = tb[:-1] + ["ray.exceptions.RayActorError: The actor died unexpectedly"]
    for part in (other[:2], other[2:]):
        emit({"actor_name": "TrainController", "pid": 9, "is_err": True, "lines": part})
    assert [line for d in got for line in d["lines"]] == ["an ordinary controller line"] + other
    got.clear()
    emit({"actor_name": "RayTrainWorker", "pid": 2, "is_err": True, "lines": tb})   # not Train's controller
    assert [d["lines"] for d in got] == [tb]


def test_local_ray_start_is_retried_only_after_the_startup_timeout(monkeypatch, capsys):
    """Ray's fixed 30 s raylet wait can expire on a busy machine; ensure_ray tries again
    (after shutting the half-started instance down) and re-raises any other error."""
    import ray

    from rknn_ray.job import ray_env
    calls, shutdowns = [], []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: shutdowns.append(1))
    monkeypatch.setattr(ray_env, "local_ray_env", lambda: None)     # leaves os.environ alone

    def flaky_init(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise Exception("The current node timed out during startup. This could happen ...")
    monkeypatch.setattr(ray, "init", flaky_init)
    assert ray_env.ensure_ray(num_cpus=1) is True
    assert len(calls) == 2 and len(shutdowns) == 1
    assert "starting it again (2/3)" in capsys.readouterr().err

    def broken_init(**kwargs):
        raise ValueError("bad address")
    monkeypatch.setattr(ray, "init", broken_init)
    import pytest
    with pytest.raises(ValueError, match="bad address"):
        ray_env.ensure_ray(num_cpus=1)


def test_the_jobs_ray_start_is_a_stage_that_says_starting_or_joining(monkeypatch):
    """20-28 s passed without a line while Ray started: the start is a stage of its own
    ("starting Ray ...", or "joining Ray at ADDRESS ..." with RAY_ADDRESS), timed as
    ray_start; a Ray the caller started already is used without a line."""
    import ray

    from rknn_ray.job.runner import _RayStart
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    for address, said in ((None, "starting Ray"), ("10.0.0.5:6379", "joining Ray at 10.0.0.5:6379")):
        if address:
            monkeypatch.setenv("RAY_ADDRESS", address)
        else:
            monkeypatch.delenv("RAY_ADDRESS", raising=False)
        out = io.StringIO()
        p = Progress(True, out, interval=0.0)
        calls = []
        start = _RayStart(lambda: calls.append(1) or address is None, p)
        start()
        start()                                    # once per job
        lines = [ln.split("] ", 1)[1] for ln in out.getvalue().splitlines()]
        assert lines[0] == f"{said} ..." and lines[1].startswith(f"{said} done in ")
        assert len(lines) == 2 and calls == [1] and start.started is (address is None)
        assert "ray_start" in p.timings
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    out = io.StringIO()
    start = _RayStart(lambda: False, Progress(True, out))
    start()
    assert out.getvalue() == "" and start.up and not start.started


def test_workers_are_pinned_to_their_ray_only_when_another_ray_runs_here(monkeypatch):
    """The setup hook (a job runtime env) costs every worker ~0.7 CPU s and the prestarted
    workers: a lone local instance starts without it, one beside another instance with it
    (the scan itself, against a real second instance: tests/test_edge_probes.py)."""
    import ray

    from rknn_ray.job import ray_env
    calls = []
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setattr(ray_env, "local_ray_env", lambda: None)     # leaves os.environ alone
    for other, expected in ((True, ray_env.WORKER_RUNTIME_ENV), (False, None)):
        monkeypatch.setattr(ray_env, "other_ray_on_this_machine", lambda other=other: other)
        assert ray_env.ensure_ray(num_cpus=1) is True
        assert calls[-1].get("runtime_env") == expected
        assert calls[-1].get("_system_config") == (
            {"prestart_worker_first_driver": False} if other else None)


def test_forwarded_noise_is_dropped_from_ray_start_not_only_from_training(monkeypatch):
    """ray.init adds the handler that prints forwarded worker lines; ensure_ray wraps it right
    after, so noise a worker prints before any training starts (abseil's mutex trace, seen once
    in the README demo's console) is dropped too."""
    import ray
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    from rknn_ray.job import ray_env
    printed = []
    monkeypatch.setattr(dispatcher, "handlers", [])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_env, "local_ray_env", lambda: None)     # leaves os.environ alone
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: dispatcher.add_handler("ray_print_logs",
                                                                          printed.append))
    assert ray_env.ensure_ray(num_cpus=1) is True
    dispatcher.emit({"pid": 7, "lines": ["[mutex.cc : 452] RAW: Unlock 0x55a   @ 0x7f93", "kept"]})
    assert printed == [{"pid": 7, "lines": ["kept"]}]


def test_untimed_spans_stay_out_of_stage_timings_and_the_console_clock():
    """Issue 21: the release's noise draw (an exact sampler runs longer for larger noise) is
    in no stage timing and no console timestamp; a fake clock makes this exact."""
    now = [0.0]
    p = Progress(False, clock=lambda: now[0])
    with p.stage("round_0"):
        now[0] += 2.0
        with p.untimed("release"):
            now[0] += 30.0
            assert p.elapsed() == 2.0            # the console's clock stands still
        now[0] += 1.0
    with p.stage("labels"):
        now[0] += 4.0
    assert p.timings == {"round_0": 3.0, "labels": 4.0}
    assert p.elapsed() == 7.0
    assert p.untimed_spans == {"round_0": ["release"]}

"""Edge probes (issue 18, failures; issue 21 item 6a): what a failure at the edges leaves behind.

One test per bullet of the issue, each asserting what the user is promised: the exit code,
one line naming the cause and the fix, which files exist, and what the privacy ledger holds.
Signals are real signals sent to a real ``python -m jobs.distill`` subprocess at a stage;
the full disk is an ``OSError(ENOSPC)`` raised at the real write call (a monkeypatch here,
not a production parameter).
"""
import errno
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jobs.distill import main
from rknn_ray.accounting.budget_store import BudgetStore
from tests.job_args import FAST, distill_args as _args

ROOT = Path(__file__).resolve().parents[1]


class Job:
    """A real ``python -m jobs.distill`` in its own process group (so a test can signal it,
    and clean up after a SIGKILL everything it started)."""

    def __init__(self, args, ledger, ray_address: str | None = None, wrapper=()):
        env = {**os.environ, "RKNN_RAY_LEDGER": str(ledger), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
               "PYTHONUNBUFFERED": "1"}
        env.pop("RAY_ADDRESS", None)
        if ray_address:          # join that Ray (as under `ray job submit`); else start its own
            env["RAY_ADDRESS"] = ray_address
        self.proc = subprocess.Popen([*wrapper, sys.executable, "-m", "jobs.distill", *args], cwd=ROOT,
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)
        self.lines: list[str] = []

    def wait_for(self, needle: str, timeout: float = 240) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if needle in line:
                return
        raise AssertionError(f"never saw {needle!r}:\n{''.join(self.lines)}")

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, "".join(self.lines) + out

    def signal_after(self, needle: str, delay: float, sig: int) -> tuple[int, str]:
        """Send ``sig`` ``delay`` s after the line holding ``needle``; (exit code, output).
        The job's process group is killed afterwards whatever happened."""
        try:
            self.wait_for(needle)
            time.sleep(delay)
            self.proc.send_signal(sig)
            return self.finish()
        finally:
            self.kill_group()

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)      # this job's own process group only
        except ProcessLookupError:
            pass


def _address(ray) -> str:
    """The address of this test process's Ray, for a job that joins it."""
    return ray.get_runtime_context().gcs_address


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


# ---------------------------------------------------------------------- 1. signals

def test_sigterm_during_the_client_round_exits_143_with_one_line_and_a_record(ray_session, tmp_path):
    """The job joins this session's Ray (a job under `ray job submit` does; the SIGINT probe
    below covers a job that started its own Ray and must shut it down)."""
    out, ledger = tmp_path / "term", tmp_path / "ledger.sqlite"
    # multi-message: ~67,000 messages, a client stage of ~5 s here (a collision round of the
    # 1,079 clients is over in ~0.4 s). The round's first line comes before its first client
    # works (a signal right on it lands before the round starts, and the reservation is
    # rightly returned), so the signal waits 1.5 s
    job = Job(_args("digits_shuffle.yaml", out, "privacy.mechanism=multi"), ledger,
              _address(ray_session))
    code, text = job.signal_after("round 1/1", 1.5, signal.SIGTERM)
    assert code == 143, text
    (line,) = _error_lines(text)
    assert "interrupted by SIGTERM during private round 1" in line and "incomplete.json" in line
    assert "Traceback" not in text, text
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["reason"].startswith("interrupted by SIGTERM") and marker["release_saved"] is False
    assert not (out / "report.json").exists() and not (out / "release.npz").exists()
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]      # interrupted mid-round: the job settles it itself
    assert dataset["reserved"] == 0, row
    if "eps is counted in the ledger" in line:      # reports had reached the server: spent
        assert row["status"] == "released" and "counted as spent" in row["note"], row
    else:           # the shuffler still collected: no report reached the server, returned
        assert "nothing was released" in line and row["status"] == "unused", (line, row)


def test_sigint_during_the_student_exits_130_and_resume_finishes(ray_session, tmp_path, monkeypatch):
    out, ledger = tmp_path / "int", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_central.yaml", out, "student.epochs=50"), ledger)
    code, text = job.signal_after("student: Ray Train", 2, signal.SIGINT)   # inside fit()
    assert code == 130, text
    (line,) = _error_lines(text)
    assert "interrupted by SIGINT during student" in line and f"--resume {out}" in line
    assert "Traceback" not in text
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is True and marker["next_step"].endswith(f"--resume {out}")
    (dataset,) = BudgetStore(str(ledger)).datasets()
    assert dataset["released"] == 1 and dataset["reserved"] == 0
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(ledger))
    (out / "student-0000dead").mkdir()              # what an interrupted Train run may leave
    assert main(["--resume", str(out), "--quiet", "--set", "student.epochs=1",
                 "--set", "student.trainer=local"]) == 0
    assert (out / "report.json").exists() and not (out / "incomplete.json").exists()
    assert not list(out.glob("student-*"))         # Ray Train's own storage does not pile up
    (dataset,) = BudgetStore(str(ledger)).datasets()
    assert dataset["released"] == 1 and dataset["spent"]["eps"] == pytest.approx(1.0)


def test_a_signal_before_any_client_randomized_returns_the_reservation(
        tmp_path, monkeypatch, capsys, isolated_privacy_ledger):
    """SIGTERM while the public side runs (before Ray starts): exit 143, incomplete.json, and
    the reservation is returned at once (nothing could be released), not left open."""
    import rknn_ray.job.stages
    from jobs.signals import JobInterrupted

    def terminated(*args, **kwargs):
        raise JobInterrupted(signal.SIGTERM)
    monkeypatch.setattr(rknn_ray.job.stages, "fit_queries", terminated)
    out = tmp_path / "early"
    assert main(_args("digits_central.yaml", out)) == 143
    (line,) = _error_lines(capsys.readouterr().err)
    assert "interrupted by SIGTERM during queries" in line and "nothing was released" in line
    assert json.loads((out / "incomplete.json").read_text())["release_saved"] is False
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "unused" and "before any client randomized" in row["note"]


def test_signal_exit_codes_follow_the_shell():
    from jobs.signals import JobInterrupted, as_interrupt
    assert JobInterrupted(signal.SIGINT).exit_code == 130
    assert JobInterrupted(signal.SIGTERM).exit_code == 143
    assert as_interrupt(KeyboardInterrupt()).name == "SIGINT"
    assert pickle.loads(pickle.dumps(JobInterrupted(signal.SIGTERM))).signum == signal.SIGTERM



class _SignalsItselfWhenCollected:
    """Sends this process SIGINT from inside ``__del__`` and runs on, so the handler's
    exception is raised where Python can only print it ("Exception ignored")."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(100_000):       # bytecodes: the handler runs here, inside __del__
            pass


def test_an_interrupt_python_drops_is_raised_at_the_next_stage():
    """A SIGINT whose exception lands in a __del__ or weakref callback was lost: the probe
    saw a Ctrl-C during the student's start-up finish the job with exit 0. It is kept and
    raised again at the next safe point (a stage's start here), once."""
    from jobs import signals
    from rknn_ray import interrupts
    from rknn_ray.job.progress import Progress
    progress = Progress(False)
    with signals.handled():
        _SignalsItselfWhenCollected()             # collected at once: the SIGINT is dropped
        assert interrupts.received == signal.SIGINT   # it did arrive
        with pytest.raises(signals.JobInterrupted) as caught:
            with progress.stage("student"):
                pytest.fail("a stage must not start after a dropped interrupt")
        assert caught.value.exit_code == 130
        with progress.stage("cleanup"):           # raised once, not again
            pass
    assert interrupts.received is None and signal.getsignal(signal.SIGINT) is not signals._raise


def test_an_interrupt_wrapped_by_python_is_still_an_interrupt():
    """A SIGINT during an import can land in a class body's ``__set_name__``; Python 3.11
    wraps it in a RuntimeError (a probe printed 'the job failed: RuntimeError: Error calling
    __set_name__' and exited 1). The job still sees the interrupt behind it (exit 130)."""
    from jobs.signals import JobInterrupted, as_interrupt

    class Interrupting:
        def __set_name__(self, owner, name):
            raise JobInterrupted(signal.SIGINT)
    try:
        type("Imported", (), {"field": Interrupting()})
    except BaseException as exc:                 # noqa: BLE001 - whatever Python made of it
        caught = exc
    assert as_interrupt(caught).exit_code == 130
    assert as_interrupt(RuntimeError("unrelated")) is None

# ---------------------------------------------------------------------- 2. disk full

def test_a_full_disk_at_the_release_counts_it_in_the_ledger_and_says_so(
        ray_session, tmp_path, monkeypatch, capsys, isolated_privacy_ledger):
    """release.npz cannot be written: the round WAS released, so the ledger commits it as
    released-and-lost with its eps; the console and incomplete.json say so; one line."""
    real_savez = np.savez

    def no_space(file, *args, **kwargs):
        if str(getattr(file, "name", file)).endswith("release.npz"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_savez(file, *args, **kwargs)
    monkeypatch.setattr(np, "savez", no_space)
    out = tmp_path / "full"
    code = main(_args("digits_central.yaml", out))
    err = capsys.readouterr().err
    assert code == 2
    (line,) = _error_lines(err)
    assert "out of disk space" in line and "release.npz" in line and "Fix: free space" in line
    assert "the release was NOT saved (its eps is counted in the ledger)" in line
    assert "Traceback" not in err
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["released_and_lost"] is True and marker["release_saved"] is False
    assert not (out / "release.npz").exists() and not list(out.glob(".tmp-*"))
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (released,) = [r for r in dataset["releases"] if r["status"] == "released"]
    assert released["eps"] == pytest.approx(1.0) and "lost" in released["note"]
    assert dataset["spent"]["eps"] == pytest.approx(1.0)


# the release is on disk before the ledger commits it: test_distill_job.py's
# test_failure_after_the_release_is_recorded_and_resume_finishes_without_a_new_round


def test_a_checkpoint_write_that_runs_out_of_space_leaves_no_truncated_file(
        tmp_path, monkeypatch):
    import shutil

    from rknn_ray.errors import OutOfSpaceError
    from rknn_ray.runio import copy_file
    src = tmp_path / "src.pt"
    src.write_bytes(b"x" * 4096)

    def half_then_full(a, b):
        Path(b).write_bytes(b"x" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(shutil, "copyfile", half_then_full)
    with pytest.raises(OutOfSpaceError, match="out of disk space writing .*student.pt"):
        copy_file(str(src), str(tmp_path / "run" / "student.pt"))
    assert os.listdir(tmp_path / "run") == []        # neither a truncated file nor a temp


def test_incomplete_json_on_a_full_disk_costs_one_clause_not_a_traceback(tmp_path, monkeypatch):
    from rknn_ray.job import failure

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(failure, "mark_incomplete", full)
    said = failure.record_incomplete(str(tmp_path), "why", RuntimeError("x"))
    assert "incomplete.json could not be written: No space left on device" in said


def test_a_second_failure_keeps_the_first_reason(tmp_path):
    from rknn_ray.job.failure import record_incomplete
    record_incomplete(str(tmp_path), "interrupted by SIGINT during student", KeyboardInterrupt())
    record_incomplete(str(tmp_path), "out of disk space", RuntimeError("x"))
    marker = json.loads((tmp_path / "incomplete.json").read_text())
    assert marker["reason"] == "out of disk space"
    assert marker["earlier_reasons"] == ["interrupted by SIGINT during student"]


# ---------------------------------------------------------------------- 3. kill -9

def test_a_killed_driver_leaves_a_reservation_that_budget_lists_and_settle_counts(
        ray_session, tmp_path, capsys):
    from jobs.budget import main as budget_main
    out, ledger = tmp_path / "killed", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_central.yaml", out), ledger, _address(ray_session))   # joins Ray
    try:
        job.wait_for("starting 2 client shards")   # clients may randomize from here
        job.kill_group()                            # kill -9 of the driver (Ray ends its actors)
        job.proc.wait(timeout=30)
    finally:
        job.kill_group()
    assert job.proc.returncode == -signal.SIGKILL
    assert budget_main(["--ledger", str(ledger)]) == 0
    listed = capsys.readouterr().out
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "reserved"
    assert f"job {row['job_id']}  age " in listed and "driver gone" in listed
    assert f"settle it: rknn-ray budget settle {row['job_id']}" in listed
    assert budget_main(["settle", row["job_id"], "--ledger", str(ledger)]) == 0
    assert "counted as spent" in capsys.readouterr().out
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "released" and dataset["spent"]["eps"] == pytest.approx(1.0)
    assert dataset["reserved"] == 0


def test_settle_returns_only_what_provably_was_not_released(tmp_path):
    from rknn_ray.accounting.budget_store import mark_started, open_reservations, settle
    from rknn_ray.errors import PrivacyBudgetError
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("d", "data", "early", 1.0, 0.0, (10.0, 0.0))
    store.reserve("d", "data", "late", 2.0, 0.0, (10.0, 0.0))
    mark_started(store, "d", "late")
    (early, late) = open_reservations(store)
    assert (early["started"], late["started"]) == (False, True)
    assert late["driver_alive"] is True           # this process holds it: not settled
    with pytest.raises(PrivacyBudgetError, match="still running"):
        settle(store, "late")
    assert [r["status"] for r in settle(store, "early")] == ["unused"]
    assert store.spent("d").eps == pytest.approx(2.0)
    with pytest.raises(PrivacyBudgetError, match="no open reservation"):
        settle(store, "nope")


# ---------------------------------------------------------------------- 4. --out / --resume refusals

def test_refusals_write_nothing_into_a_folder_they_do_not_own(tmp_path, capsys):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "incomplete.json").write_text('{"reason": "an earlier failure"}')
    assert main(_args("digits_central.yaml", out)) == 2
    assert "not empty" in capsys.readouterr().err
    assert (out / "incomplete.json").read_text() == '{"reason": "an earlier failure"}'
    assert main(["--resume", str(out), "--quiet"]) == 2          # no release.npz
    assert "has no release.npz" in capsys.readouterr().err
    assert (out / "incomplete.json").read_text() == '{"reason": "an earlier failure"}'


def test_an_unresumed_release_points_to_resume_and_overwrite_keeps_it(tmp_path, capsys):
    from rknn_ray.runio import prepare_run_dir
    out = tmp_path / "paid"
    (out / "student-1234abcd").mkdir(parents=True)
    for name in ("release.npz", "config.yaml", "incomplete.json"):
        (out / name).write_text("x")
    assert main(_args("digits_central.yaml", out)) == 2
    err = capsys.readouterr().err
    assert f"--resume {out}" in err and "budget is already spent" in err
    assert main(_args("digits_central.yaml", out, extra=["--overwrite"])) == 2
    assert "--discard-release" in capsys.readouterr().err
    assert (out / "release.npz").exists() and (out / "incomplete.json").read_text() == "x"
    prepare_run_dir(str(out), overwrite=True, discard_release=True)   # explicit: deleted
    assert os.listdir(out) == []                                       # Train's folders too


# ---------------------------------------------------------------------- 5. every key before the budget

def test_student_workers_beyond_the_cpus_are_refused_before_any_budget(
        tmp_path, capsys, isolated_privacy_ledger):
    out = tmp_path / "workers"
    assert main(_args("digits_central.yaml", out, "student.num_workers=999")) == 2
    err = capsys.readouterr().err
    assert "student.num_workers" in err and "Fix: set student.num_workers<=" in err
    assert "--resume RUN --set student.num_workers=N" in err
    assert not out.exists() and BudgetStore(str(isolated_privacy_ledger)).datasets() == []


def test_resume_may_change_only_post_release_keys(tmp_path, capsys):
    """Issue 21 item 6a: a resume must not write a NOT PRIVATE diagnostics folder into a
    private run, nor a report whose eps disagrees with its release."""
    import yaml

    from rknn_ray.config import load_config
    out = tmp_path / "saved"
    out.mkdir()
    cfg = load_config("jobs/configs/digits_central.yaml")
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (out / "release.npz").write_bytes(b"x")
    (out / "incomplete.json").write_text("before")
    for bad in (["run.diagnostics=true"], ["privacy.eps=50"], ["queries.s=30"]):
        assert main(["--resume", str(out), "--quiet", *sum((["--set", b] for b in bad), [])]) == 2
        err = capsys.readouterr().err
        assert bad[0].split("=")[0] in err and "student.*" in err and "Fix" in err
    assert (out / "incomplete.json").read_text() == "before" and not (out / "diagnostics").exists()
    from rknn_ray.job.resume import check_resume_overrides
    check_resume_overrides(cfg, load_config(str(out / "config.yaml"),
                                            ["student.epochs=1", "student.num_workers=1",
                                             "labels.type=soft", "run.progress=false"]))


# ---------------------------------------------------------------------- 6. key files, actor errors

def test_a_pem_key_of_the_wrong_type_is_refused_before_ray_starts(tmp_path, capsys):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    key = tmp_path / "ed25519.pem"
    key.write_bytes(Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    key.chmod(0o600)
    out = tmp_path / "k"
    assert main(_args("digits_central.yaml", out, extra=["--key-file", str(key)])) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "Ed25519PrivateKey, not an X25519 key" in line and "Fix:" in line
    assert not out.exists()


class _Boom:
    def fail(self):
        from rknn_ray.errors import ConfigError
        raise ConfigError("server.key", "a problem inside the actor", "the fix")


def test_an_error_raised_in_an_actor_reaches_the_console_as_its_own_line(ray_session):
    import ray

    from rknn_ray.job.failure import failure_line
    from rknn_ray.errors import ConfigError, OutOfSpaceError, ReportError
    for err in (ConfigError("a", "b", "c"), ReportError("tampered", "tag"), OutOfSpaceError("/x")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
    actor = ray.remote(num_cpus=0)(_Boom).remote()
    with pytest.raises(ConfigError) as info:
        ray.get(actor.fail.remote())
    assert failure_line(info.value) == "config 'server.key': a problem inside the actor. Fix: the fix"
    ray.kill(actor)


# ---------------------------------------------------------------------- 7. rknn-ray report

def test_report_names_bad_files_and_a_folder_report_skips_them(tmp_path, capsys):
    from jobs.report import main as report_main
    bad = {"list": "[]", "str_section": '{"privacy": "x"}', "truncated": '{"accuracy": {"lab'}
    for name, text in bad.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(text)
        assert report_main([str(tmp_path / name), "--no-html"]) == 2
        (line,) = _error_lines(capsys.readouterr().err)
        assert str(tmp_path / name / "report.json") in line
    good = tmp_path / "good"
    good.mkdir()
    (good / "incomplete.json").write_text('{"status": "incomplete", "reason": "test"}')
    assert report_main([str(tmp_path), "--no-html"]) == 0
    text = capsys.readouterr().out
    assert "1 run(s)" in text and "skipped 3 unreadable run folder(s)" in text
    for name in bad:
        assert f"  {name}: " in text


# ---------------------------------------------------------------------- 8. dropout before the round

def test_shuffle_dropout_that_the_round_would_refuse_is_refused_before_any_budget(
        tmp_path, capsys, isolated_privacy_ledger):
    import ray
    out = tmp_path / "drop"
    started = ray.is_initialized()
    assert main(_args("digits_shuffle.yaml", out, "shuffle.dropout=0.1")) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "shuffle.dropout" in line and "distinct senders" in line and "expected_dropout" in line
    assert ray.is_initialized() == started                    # refused before Ray started
    assert BudgetStore(str(isolated_privacy_ledger)).datasets() == []


# ---------------------------------------------------------------------- 9. small ones

def test_small_ones_missing_data_fix_and_the_reject_names(tmp_path, capsys):
    code = main(_args("fmnist_central.yaml", tmp_path / "m", f"data.data_root={tmp_path}/none"))
    err = capsys.readouterr().err
    assert code == 2 and "--set data.data_root=DIR" in err and "--data-root" not in err
    from sealing.credentials import CREDENTIAL_REJECT_KINDS
    assert "duplicate_message" in CREDENTIAL_REJECT_KINDS
    threat = " ".join((ROOT / "docs" / "threat-model.md").read_text().split())
    assert "re-sends are dropped at admission as `rejected.duplicate_message`" in threat


SIGTERM_IN_RAY_GET = """
import time
import ray
from jobs import signals
from rknn_ray.job.ray_env import ensure_ray
ensure_ray(num_cpus=1)                 # a local instance, started as the job starts it
signals.install()                      # after ray.init, as the job does
import psutil
from ray._private import ray_constants, worker
time.sleep(2.0)                        # what Ray prestarts, it starts as the driver registers
raylet = worker._global_node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
print("PRESTARTED", sum(c.cmdline()[:1] == ["ray::IDLE"] or "default_worker.py" in
                        " ".join(c.cmdline()) for c in psutil.Process(raylet).children()),
      flush=True)

@ray.remote(num_cpus=0)
def resolve():
    from ray._private.services import canonicalize_bootstrap_address_or_die
    return canonicalize_bootstrap_address_or_die(None)

print("OWN", ray.get_runtime_context().gcs_address, flush=True)
print("RESOLVED", ray.get(resolve.remote()), flush=True)

@ray.remote
def nap():
    time.sleep(60)
ref = nap.remote()
print("blocked", flush=True)
try:
    ray.get(ref)
except BaseException as exc:
    print(type(exc).__name__, signals.as_interrupt(exc).name, flush=True)
ray.shutdown()
"""


def test_a_sigterm_inside_ray_get_is_still_named_sigterm_and_workers_find_their_own_ray(
        ray_session):
    """Ray's blocking get turns the exception our handler raises into a bare
    KeyboardInterrupt; the job must still say SIGTERM (and exit 143), not SIGINT (the
    full-job probe caught it as 'interrupted by SIGINT' once).

    The same process (a job's local Ray, started beside this session's instance) shows that
    its workers name their own cluster: Ray Train's PlacementGroupCleaner looks its
    controller up through the State API without an address, and with a second instance on
    the machine it died on "Found multiple active Ray instances" (a CI failure). Those pinned
    workers run a setup hook, so the plain workers Ray prestarts for a first driver would
    serve nothing: none is started."""
    assert ray_session.is_initialized()          # the other instance: this test session's
    from rknn_ray.job.ray_env import other_ray_on_this_machine
    assert other_ray_on_this_machine()           # so the job's local Ray pins its workers
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_IN_RAY_GET], cwd=ROOT, text=True,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        prestarted, own, resolved, blocked = (proc.stdout.readline().split() for _ in range(4))
        assert prestarted == ["PRESTARTED", "0"], prestarted   # none: pinned workers serve it
        assert own[0] == "OWN" and resolved == ["RESOLVED", own[1]], (own, resolved)
        assert own[1] != ray_session.get_runtime_context().gcs_address
        assert blocked == ["blocked"]
        time.sleep(1.0)                   # inside ray.get by now
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert out.split()[-1] == "SIGTERM", out


def test_an_interrupted_fit_thread_is_waited_for_after_ray_shutdown(monkeypatch):
    """An interrupt that cannot end trainer.fit() (no controller to kill yet: see
    test_an_interrupted_fit_is_ended_while_ray_is_up) leaves it running in its thread; the
    job waits for it after ray.shutdown (exiting under it crashed the driver with SIGSEGV
    in 2 of 10 SIGINT probes)."""
    import threading

    from jobs.signals import JobInterrupted
    from rknn_ray.training import ray_train as train
    monkeypatch.setattr(train, "FIT_STOP_WAIT", 0.2)

    release = threading.Event()

    class SlowFit:                     # stands for a fit() whose Ray calls end after shutdown
        def fit(self):
            release.wait(10)
            return "done"

    def interrupt_soon():
        time.sleep(0.3)
        signal.raise_signal(signal.SIGINT)
    old = signal.signal(signal.SIGINT, lambda *a: (_ for _ in ()).throw(JobInterrupted()))
    try:
        threading.Thread(target=interrupt_soon).start()
        with pytest.raises(JobInterrupted):
            train.fit_off_main_thread(SlowFit())
    finally:
        signal.signal(signal.SIGINT, old)
    assert len(train.ABANDONED_FITS) == 1 and not train.ABANDONED_FITS[0].is_set()
    assert train.join_abandoned_fits(timeout=0.2) is False      # still inside fit()
    release.set()
    assert train.join_abandoned_fits(timeout=5) is True and train.ABANDONED_FITS == []


# ---------------------------------------------------------------------- issue 34: signals to the group

def _student_interrupted_by_the_group(out: Path, code: int, text: str, ledger) -> None:
    """What a group SIGTERM during the student must leave: 143, one line, incomplete.json,
    the release saved and finished by --resume."""
    assert code == 143, text
    (line,) = _error_lines(text)
    assert "interrupted by SIGTERM during student" in line and f"--resume {out}" in line, line
    assert "Traceback" not in text and "Failed to connect to GCS" not in text, text
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is True and marker["next_step"].endswith(f"--resume {out}")
    # resumed in this process, on the session's Ray (a process and a Ray start of its own
    # would prove nothing more about what the signal left)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RKNN_RAY_LEDGER", str(ledger))
        assert main(["--resume", str(out), "--quiet", "--set", "student.epochs=1",
                     "--set", "student.trainer=local"]) == 0
    assert (out / "report.json").exists() and not (out / "incomplete.json").exists()


def test_sigterm_to_the_whole_process_group_during_the_student_reaches_the_driver_only(
        ray_session, tmp_path):
    """`kill -TERM -- -PGID` (systemd, Slurm's scancel): Ray's own GCS and raylet are not in the
    job's group, so the driver still has its Ray to shut down and writes its record (it hung
    60 s on 'Failed to connect to GCS', exited 1 and wrote no incomplete.json)."""
    out, ledger = tmp_path / "group", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_central.yaml", out, "student.epochs=50"), ledger)   # setsid
    try:
        job.wait_for("student: Ray Train")
        time.sleep(2)
        os.killpg(job.proc.pid, signal.SIGTERM)        # the job's whole process group
        code, text = job.finish(timeout=50)            # well under Ray's 60 s GCS wait
    finally:
        job.kill_group()
    _student_interrupted_by_the_group(out, code, text, ledger)


def test_timeout_ending_the_job_during_the_student_leaves_a_record(ray_session, tmp_path):
    """GNU timeout forwards the signal it gets (or its own at the deadline) to the job and to
    its whole process group."""
    out, ledger = tmp_path / "timeout", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_central.yaml", out, "student.epochs=50"), ledger,
              wrapper=["timeout", "--preserve-status", "600"])
    try:
        job.wait_for("student: Ray Train")
        time.sleep(2)
        job.proc.send_signal(signal.SIGTERM)           # to timeout, which signals the group
        code, text = job.finish(timeout=50)
    finally:
        job.kill_group()
    _student_interrupted_by_the_group(out, code, text, ledger)


# ---------------------------------------------------------------------- issue 34: wording, one line each

def _one_error_line(err: str) -> str:
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("error: ") and "Fix:" in line, line
    return line


def _refused(capsys, ledger, *args) -> str:
    """``main(args)`` refuses in one line with exit 2, before any budget or Ray."""
    import ray
    started = ray.is_initialized()
    assert main(list(args)) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert ray.is_initialized() == started
    assert not Path(ledger).exists() or BudgetStore(str(ledger)).datasets() == []
    return line


def test_a_seed_beyond_a_c_int_is_refused_and_the_largest_one_runs_k_means(
        tmp_path, capsys, isolated_privacy_ledger):
    """faiss takes its k-means seed as a C int: 2**31 - 1 plus a restart overflowed."""
    out = tmp_path / "seed"
    line = _refused(capsys, isolated_privacy_ledger, *_args("digits_central.yaml", out,
                                                            "run.seed=2147483648"))
    assert "run.seed" in line and "2147483647" in line and not out.exists()
    from rknn_ray.labeling.queries import select_queries
    x = np.random.default_rng(0).standard_normal((50, 4)).astype(np.float32)
    assert select_queries(x, 5, restarts=2, niter=2, seed=2 ** 31 - 1).size == 5


def test_a_config_nested_100000_deep_is_one_line(tmp_path, capsys, isolated_privacy_ledger):
    deep = tmp_path / "deep.yaml"
    deep.write_text("privacy:" + " {a:" * 100_000 + " 1" + "}" * 100_000 + "\n")
    line = _refused(capsys, isolated_privacy_ledger, "--config", str(deep),
                    "--out", str(tmp_path / "o"))
    assert "nested too deeply" in line


@pytest.mark.parametrize("override", ["data.synthetic.num_samples=1e10",
                                      "data.synthetic.dim=1e8"])
def test_a_synthetic_mixture_larger_than_memory_is_refused_up_front(
        tmp_path, capsys, isolated_privacy_ledger, override):
    """Was a MemoryError (num_samples) or ~80 s of QR on a 1e8-dimensional basis that did not
    answer SIGTERM (dim): refused before anything is allocated."""
    started = time.monotonic()
    line = _refused(capsys, isolated_privacy_ledger, *_args(
        "digits_central.yaml", tmp_path / "syn", "data.dataset=synthetic", override))
    assert "data.synthetic" in line and "GiB" in line
    assert time.monotonic() - started < 30


def test_a_key_store_others_can_open_is_refused_before_ray_starts(tmp_path):
    """A mode-777 cluster.key_store was found by every shard, after Ray started (22 Ray
    frames before the line that named it): the whole console is now that one line."""
    store, ledger, out = tmp_path / "keys", tmp_path / "ledger.sqlite", tmp_path / "ks"
    store.mkdir()
    store.chmod(0o777)
    env = {**os.environ, "RKNN_RAY_LEDGER": str(ledger), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "jobs.distill",
                           *_args("digits_central.yaml", out, f"cluster.key_store={store}")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and done.stdout == "", done.stdout
    line = _one_error_line(done.stderr)
    assert str(store) in line and "mode 777" in line and f"chmod 700 {store}" in line
    assert not out.exists() and not ledger.exists()


def test_a_folder_report_survives_one_malformed_side_json(tmp_path, capsys):
    from jobs.report import main as report_main
    run = tmp_path / "run"
    run.mkdir()
    (run / "incomplete.json").write_text('{"status": "incomplete", "reason": "test"}')
    (run / "history.json").write_text('[{"epoch": 1, ')              # cut off
    (tmp_path / "summary.json").write_text('{"cells": [1, 2')          # cut off
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    assert report_main([str(tmp_path), "--no-html"]) == 0
    text = capsys.readouterr().out
    assert "1 run(s)" in text and "summary.json: could not read" in text
    assert "deep.json: could not read" in text and "nested too deeply" in text
    assert report_main([str(run), "--no-html"]) == 0                  # the run alone, too


def test_budget_into_a_closed_pipe_exits_quietly(tmp_path):
    """`rknn-ray budget | head`: the reader went away; no BrokenPipeError 'please report it'."""
    ledger = tmp_path / "l.sqlite"
    store = BudgetStore(str(ledger))
    for i in range(400):                  # more than a pipe buffer of listing
        store.set_budget(f"dataset-{i:04d}", 4.0, 0.0, description="a dataset " + "x" * 100)
    for i in range(1200):                 # and a folder report longer than a pipe buffer
        (tmp_path / "runs" / f"r{i:04d}").mkdir(parents=True)   # (~117 bytes a run: 140 KB)
        (tmp_path / "runs" / f"r{i:04d}" / "incomplete.json").write_text(
            '{"status": "incomplete", "reason": "' + "why " * 60 + '"}')
    for cmd in (["jobs.cli", "budget", "--ledger", str(ledger)], ["jobs.budget", "--ledger", str(ledger)],
                ["jobs.report", str(tmp_path / "runs"), "--no-html"]):
        proc = subprocess.Popen([sys.executable, "-m", *cmd], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        proc.stdout.readline()            # `head -1`: one line, then the reader is gone
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141 and err == "", (cmd, err)


def test_budget_set_refuses_infinity_and_json_never_prints_it(tmp_path, capsys):
    from jobs.budget import main as budget_main
    ledger = tmp_path / "l.sqlite"
    BudgetStore(str(ledger)).set_budget("d", 4.0, 0.0)
    for bad in ("inf", "nan", "-1"):
        assert budget_main(["set", "d", "--eps", bad, "--ledger", str(ledger)]) == 2
        line = _one_error_line(capsys.readouterr().err)
        assert "finite" in line
    assert BudgetStore(str(ledger)).budget("d")[0] == 4.0
    import sqlite3
    with sqlite3.connect(ledger) as con:                  # what an older version let through
        con.execute("UPDATE datasets SET budget_eps = ? WHERE identity = 'd'", (float("inf"),))
    assert budget_main(["--json", "--ledger", str(ledger)]) == 0

    def refuse(name):
        raise AssertionError(f"not JSON: {name}")
    (row,) = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert row["budget"]["eps"] == "inf"


def test_a_key_written_twice_is_refused(tmp_path, capsys, isolated_privacy_ledger):
    cfg = tmp_path / "twice.yaml"
    cfg.write_text("privacy:\n  model: central\n  eps: 1.0\n  eps: 8.0\n")
    line = _refused(capsys, isolated_privacy_ledger, "--config", str(cfg),
                    "--out", str(tmp_path / "o"))
    assert "'eps'" in line and "twice" in line and "line 4" in line
    line = _refused(capsys, isolated_privacy_ledger, *_args(
        "digits_central.yaml", tmp_path / "o2", "privacy.options={a: 1, a: 2}"))
    assert "twice" in line


def test_an_empty_config_file_is_refused_not_the_default_job(tmp_path, capsys,
                                                             isolated_privacy_ledger):
    for text in ("", "# nothing here\n", "{}\n"):
        cfg = tmp_path / "empty.yaml"
        cfg.write_text(text)
        out = tmp_path / "o"
        line = _refused(capsys, isolated_privacy_ledger, "--config", str(cfg), "--out", str(out))
        assert "sets nothing" in line and not out.exists()


def test_a_budget_refusal_names_eps_and_delta_of_what_is_spent(tmp_path):
    from rknn_ray.errors import PrivacyBudgetError
    store = BudgetStore(str(tmp_path / "l.sqlite"))
    store.reserve("d", "data", "first", 1.0, 0.0, (1.5, 0.0))
    with pytest.raises(PrivacyBudgetError) as info:
        store.reserve("d", "data", "second", 1.0, 0.0, (1.5, 0.0))
    assert "eps=1, delta=0 is already spent or reserved" in str(info.value)
    assert "1 / 0 is" not in str(info.value)


def test_queries_beyond_the_public_set_are_refused_before_any_data_loads(
        tmp_path, capsys, isolated_privacy_ledger):
    """digits' and synthetic's public sizes follow from the config (359 of 1,797 digits)."""
    from rknn_ray.config import load_config
    from rknn_ray.errors import ConfigError
    for overrides, key in ((["queries.s=400"], "queries.s"), (["rounds.count=7"], "rounds.count"),
                           (["data.dataset=synthetic", "data.synthetic.num_samples=100",
                             "queries.s=30"], "queries.s")):
        with pytest.raises(ConfigError, match=key):
            load_config("jobs/configs/digits_central.yaml", overrides)
    line = _refused(capsys, isolated_privacy_ledger, *_args(
        "digits_central.yaml", tmp_path / "q", "queries.s=400"))
    assert "exceeds the 359 public samples" in line and not (tmp_path / "q").exists()


# ---------------------------------------------------------------------- issue 34 item 12: RAY_ADDRESS

def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["nothing_listening", "http", "not_host_port"])
def test_a_ray_address_that_leads_nowhere_is_one_line_before_any_budget(tmp_path, kind):
    """Nothing listening retried for minutes (Ray rewrites 127.0.0.1 to this machine's
    address); http:// and garbage gave 40-50-line tracebacks. Now: a bounded check (its
    TCP wait is 5 s), one line, exit 2, and no budget reserved."""
    port = _free_port()
    address = {"nothing_listening": f"127.0.0.1:{port}", "http": f"http://127.0.0.1:{port}",
               "not_host_port": "garbage:notaport"}[kind]
    out, ledger = tmp_path / "addr", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_central.yaml", out), ledger, ray_address=address)
    try:
        code, text = job.finish(timeout=60)       # Ray alone retried far longer than this
    finally:
        job.kill_group()
    assert code == 2, text
    line = _one_error_line(text)
    assert "RAY_ADDRESS" in line and address in line and "unset it" in line
    assert not out.exists() and not ledger.exists()


def test_a_cluster_gone_when_the_job_joins_it_returns_the_reservation(
        tmp_path, isolated_privacy_ledger):
    """The address was checked up front but nothing answers when the job starts Ray (after
    its reservation): nothing was randomized, so the reservation is returned."""
    from functools import partial

    from rknn_ray.config import load_config
    from rknn_ray.errors import ConfigError
    from rknn_ray.job import run
    from rknn_ray.job.ray_env import check_ray_address
    from rknn_ray.runio import prepare_run_dir
    cfg = load_config("jobs/configs/digits_central.yaml", FAST + ["run.progress=false"])
    out = prepare_run_dir(str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match="nothing answers"):
        run(cfg, out, start_ray=partial(check_ray_address, f"127.0.0.1:{_free_port()}"))
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "unused" and "reservation returned" in row["note"]
    assert dataset["spent"]["eps"] == 0


def test_queries_beyond_an_mnist_public_set_are_refused_before_the_private_files_are_read(
        tmp_path, capsys, isolated_privacy_ledger):
    """The paper's public set is half the test file, counted from its labels' header: the
    refusal comes although the private train images are unreadable (they are never opened)."""
    from tests.data_files import write_mnist
    write_mnist(str(tmp_path / "data"), n_train=40, n_test=20, gz=False)
    (tmp_path / "data" / "train-images-idx3-ubyte").write_bytes(b"not an IDX file")
    assert main(_args("fmnist_central.yaml", tmp_path / "m", f"data.data_root={tmp_path / 'data'}",
                      "queries.s=50", "rknn.k=1")) == 2
    err = capsys.readouterr().err              # the data stage's start line, then the refusal
    (line,) = _error_lines(err)
    assert "queries.s" in line and "exceeds the 10 public samples" in line and "Traceback" not in err
    assert BudgetStore(str(isolated_privacy_ledger)).datasets() == []

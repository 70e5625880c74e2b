"""Edge probes (issue 34, items 6-8, 10, 11): releases that cannot be edited or deleted by
accident, shard secrets gone after a party dies, a full disk at the student.

Real jobs (``jobs.distill.main``) on real run folders and ledgers; a job is cut after its
release by an interrupt raised where the student would train (as
test_distill_job.py's resume test does), a party dies through tests/faulty_parties.py, and
a full disk is a real small file system (tmpfs in a private mount namespace).
"""
import json
import os
import shutil

import numpy as np
import pytest

from jobs.distill import main
from rknn_ray.accounting.budget_store import BudgetStore
from tests.job_args import distill_args as _args



def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def saved_release(tmp_path_factory, ray_session):
    """A real digits_central job cut after its release (an interrupt where the student
    trains): (run folder with release.npz and no report.json, its ledger). Tests copy it."""
    import rknn_ray.student
    base = tmp_path_factory.mktemp("saved")
    out, ledger = base / "run", base / "ledger.sqlite"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RKNN_RAY_LEDGER", str(ledger))
        mp.setattr(rknn_ray.student, "train_student", interrupted)
        mp.setattr(rknn_ray.student, "train_student_local", interrupted)
        assert main(_args("digits_central.yaml", out)) == 130
    assert (out / "release.npz").exists() and not (out / "report.json").exists()
    return out, ledger


def _copy(saved, tmp_path, monkeypatch):
    """The saved run folder and its ledger, copied (the ledger becomes this test's)."""
    out, ledger = saved
    run = tmp_path / "run"
    shutil.copytree(out, run)
    for f in ledger.parent.glob(ledger.name + "*"):          # the SQLite file and its WAL
        shutil.copy(f, tmp_path / f.name)
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(tmp_path / ledger.name))
    return run


def _edit_release(path, **changes):
    """Rewrite release.npz with arrays changed (``name=None`` drops one), as a person with
    numpy would."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    for name, value in changes.items():
        if value is None:
            arrays.pop(name)
        else:
            arrays[name] = value(arrays[name]) if callable(value) else value
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


# ---------------------------------------------------------------------- 6. an edited release

def test_an_edited_release_is_refused_by_resume_and_nothing_is_deleted(
        saved_release, tmp_path, monkeypatch, capsys):
    """counts_0 += 1000 in a saved release.npz: --resume refuses it in one line (exit 2)
    before any work, and leaves the folder as it was; so does a release whose tag was
    stripped, and the right file under another ledger. The file as saved resumes."""
    run = _copy(saved_release, tmp_path, monkeypatch)
    release = run / "release.npz"
    original = release.read_bytes()
    _edit_release(release, counts_0=lambda c: c + 1000)
    edited = release.read_bytes()
    assert main(["--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    (line,) = _error_lines(err)
    assert "fails its authentication tag" in line and "Fix:" in line and "Traceback" not in err
    assert release.read_bytes() == edited and not (run / "report.json").exists()
    assert json.loads((run / "incomplete.json").read_text())["release_saved"] is True

    release.write_bytes(original)
    _edit_release(release, tag=None)                        # no tag: not taken as an old file
    assert main(["--resume", str(run), "--quiet"]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "carries no authentication tag" in line and "Fix:" in line

    release.write_bytes(original)
    other = tmp_path / "other-ledger.sqlite"
    assert main(["--resume", str(run), "--quiet", "--ledger", str(other)]) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "fails its authentication tag" in line and "another ledger" in line

    assert main(["--resume", str(run), "--quiet", "--set", "student.trainer=local"]) == 0
    assert json.loads((run / "report.json").read_text())["job_id"]


def test_a_refused_release_is_not_sent_back_to_resume(saved_release, tmp_path, monkeypatch,
                                                      capsys):
    """Issue 49 item 5: an edited (or foreign) release was refused, but the line ended "its
    release is saved: finish it with --resume RUN" and incomplete.json was rewritten with
    next_step --resume; random bytes were said with numpy's advice to load with
    allow_pickle. Now the line and incomplete.json say the file cannot be finished as it is."""
    run = _copy(saved_release, tmp_path, monkeypatch)
    release = run / "release.npz"
    _edit_release(release, counts_0=lambda c: c + 1)
    for content in (None, os.urandom(4096)):
        if content is not None:
            release.write_bytes(content)
        assert main(["--resume", str(run), "--quiet"]) == 2
        err = capsys.readouterr().err
        (line,) = _error_lines(err)
        assert "Traceback" not in err and "--resume" not in line and "pickle" not in line, line
        assert "its release cannot be finished as it is" in line
        marker = json.loads((run / "incomplete.json").read_text())
        assert "--resume" not in marker["next_step"] and "cannot be finished" in marker["next_step"]
    assert "not an .npz archive of arrays" in line and "restore the file" in line
    assert release.exists()                                # never deleted


# ---------------------------------------------------------------------- 7. a malformed report.json

def test_a_malformed_report_json_hides_no_unresumed_release(
        saved_release, tmp_path, monkeypatch, capsys):
    """release.npz never finished, report.json malformed: the guards look at the release.
    --overwrite keeps it without --discard-release; --resume finishes it (no 'already
    complete'), and only then is the folder complete."""
    run = _copy(saved_release, tmp_path, monkeypatch)
    (run / "report.json").write_text('{"accuracy": {"lab')          # truncated
    saved = (run / "release.npz").read_bytes()
    assert main(_args("digits_central.yaml", run, extra=["--overwrite"])) == 2
    (line,) = _error_lines(capsys.readouterr().err)
    assert "never finished" in line and "--discard-release" in line and f"--resume {run}" in line
    assert (run / "release.npz").read_bytes() == saved
    assert main(["--resume", str(run), "--quiet", "--set", "student.trainer=local"]) == 0
    assert "already complete" not in capsys.readouterr().err
    report = json.loads((run / "report.json").read_text())
    assert report["privacy"]["eps"] == pytest.approx(1.0)
    assert main(["--resume", str(run), "--quiet"]) == 2             # finished now
    assert "already complete" in capsys.readouterr().err
    (dataset,) = BudgetStore(os.environ["RKNN_RAY_LEDGER"]).datasets()
    assert dataset["spent"]["eps"] == pytest.approx(1.0) and dataset["released"] == 1


# ---------------------------------------------------------------------- 8. --overwrite then refused

@pytest.mark.parametrize("refusal", ["budget", "queries.s", "empty ledger"])
def test_overwrite_keeps_the_old_run_when_the_new_job_is_refused(
        tmp_path, monkeypatch, capsys, refusal):
    """A complete run, --overwrite, and a new job refused (its budget, a queries.s beyond the
    public set, an empty-file ledger): exit 2, one line, and the old run is all still there."""
    from tests.run_folders import write_run
    old = write_run(str(tmp_path / "old"), "central", "gaussian")
    before = {name: (tmp_path / "old" / name).read_bytes() for name in os.listdir(old)}
    overrides = {"budget": ["privacy.budget_eps=0.5"], "queries.s": ["queries.s=100000"],
                 "empty ledger": []}[refusal]
    if refusal == "empty ledger":
        ledger = tmp_path / "empty.sqlite"
        ledger.write_bytes(b"")
        monkeypatch.setenv("RKNN_RAY_LEDGER", str(ledger))
    assert main(_args("digits_central.yaml", old, *overrides, extra=["--overwrite"])) == 2
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1 and "Traceback" not in err
    after = {name: (tmp_path / "old" / name).read_bytes() for name in os.listdir(old)}
    assert after == before                       # nothing deleted, nothing written


# ---------------------------------------------------------------------- 10. secrets after a death

@pytest.mark.parametrize("faulty,party,config", [
    ("ServerDyingAtOpen", "server", "digits_local.yaml"),
    ("ShufflerDyingAtSubmit", "shuffler", "digits_shuffle.yaml")])
def test_live_shards_delete_their_secrets_after_a_server_or_shuffler_death(
        ray_session, tmp_path, monkeypatch, capsys, faulty, party, config):
    """The Server (local model) or the Shuffler dies as the first batch reaches it, while the
    shards still stream (one client a batch: their streams block on backpressure). The job
    fails naming the party, and the live shards have deleted their shard-*.key files (the
    threat model: live shards delete them on close), the job's key folder with them."""
    import functools

    import jobs.distill as distill
    from rknn_ray.job.session import Parties
    from tests import faulty_parties
    monkeypatch.setattr(distill, "run", functools.partial(
        distill.run, parties=Parties(**{party: getattr(faulty_parties, faulty)})))
    keys = tmp_path / "keys"
    code = main(_args(config, tmp_path / "run", f"cluster.key_store={keys}",
                      "cluster.batch_clients=1"))
    err = capsys.readouterr().err
    assert code == 2 and f"the {party} died; no counts were released" in err, err
    assert keys.is_dir() and os.listdir(keys) == []     # the job's folder and every key gone


# ---------------------------------------------------------------------- 11. full disk at student.pt

def _private_mount() -> list[str] | None:
    """The command prefix that runs a process in its own mount namespace where it may mount a
    tmpfs (root: unshare -m; else a user namespace: unshare -rm), None where neither works."""
    import subprocess
    import tempfile
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    with tempfile.TemporaryDirectory() as probe:
        try:
            done = subprocess.run([*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                                   probe], capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
    return prefix if done.returncode == 0 else None


def test_a_full_disk_at_student_pt_is_one_line_leaves_no_partial_file_and_resumes(tmp_path):
    """The run folder's file system fills up as the student starts (a real 4 MiB tmpfs,
    tests/full_disk_job.py), with the student on Ray Train (the job) and in the driver (its
    --resume): each exits 2 with one line "out of disk space writing <path>" and the fix, no
    traceback (torch's inline_container.cc, Ray Train's worker errors), no student.pt or Ray
    Train checkpoint_*/payload.pt left, and the saved release resumes once there is space
    again."""
    import subprocess
    import sys
    from pathlib import Path
    prefix = _private_mount()
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m / -rm) for a small tmpfs")
    root = Path(__file__).resolve().parents[1]
    mount, result = tmp_path / "disk", tmp_path / "result.json"
    mount.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own Ray, in there
    env.update(PYTHONPATH=str(root), RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
               RKNN_RAY_LEDGER=str(tmp_path / "ledger.sqlite"))
    done = subprocess.run([*prefix, sys.executable, str(root / "tests" / "full_disk_job.py"),
                           str(mount), str(result)], cwd=root, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert done.returncode == 0 and result.exists(), done.stdout
    got = json.loads(result.read_text())
    said = dict(part.split("\n", 1) for part in
                done.stdout.split("RESUMING")[0].split("ATTEMPT ")[1:])
    for trainer, written in (("ray", "/run/student-"), ("local", "/run/student.pt")):
        text, attempt = said[trainer], got[trainer]
        assert attempt["code"] == 2, text
        (line,) = _error_lines(text)
        assert "out of disk space writing " in line and "Fix: free space" in line, line
        assert written in line, line
        # Ray's TrainController may print a traceback of its own as Ray shuts down after a
        # failed fit (autoscaling_coordinator_client, a Ray-internal race): not the job's
        ours = "\n".join(ln for ln in text.splitlines() if "(TrainController pid=" not in ln)
        assert "Traceback" not in ours and "inline_container" not in ours, text
        assert attempt["files"] == ["config.yaml", "incomplete.json", "release.npz"], attempt
        assert attempt["incomplete"]["release_saved"] is True
    assert got["resume_code"] == 0 and "report.json" in got["resumed"], done.stdout

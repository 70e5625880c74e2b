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

FAST = ["student.epochs=1", "queries.restarts=1"]


def _args(config: str, out, *overrides, extra=()):
    args = ["--config", f"jobs/configs/{config}", "--out", str(out), "--quiet", *extra]
    for o in [*FAST, *overrides]:
        args += ["--set", o]
    return args


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

"""What the CLI asks of the orchestration layer before and after a job: which run folder
--resume may finish (rknn_ray.job.resume), a seeded run's consent (rknn_ray.rng), and a
failure said in one line (rknn_ray.job.failure). No Ray: these run before it or after it."""
import errno

import pytest
import yaml

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.job.failure import UNEXPECTED, failure_line, record_incomplete
from rknn_ray.job.resume import resume_config
from rknn_ray.rng import check_consent

CONFIG = "jobs/configs/digits_central.yaml"


def _saved_run(tmp_path, *files):
    out = tmp_path / "run"
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(yaml.safe_dump(load_config(CONFIG).to_dict(), sort_keys=False))
    for name in files:
        (out / name).write_bytes(b"x")
    return out


def test_resume_needs_a_saved_release_and_an_unfinished_run(tmp_path):
    with pytest.raises(ConfigError, match="has no release.npz"):
        resume_config(str(_saved_run(tmp_path)))
    import json

    import numpy as np
    done = _saved_run(tmp_path / "b")
    with open(done / "release.npz", "wb") as fh:
        np.savez(fh, meta=np.array(json.dumps({"job_id": "0123abcd"})))
    (done / "report.json").write_text(json.dumps({"job_id": "0123abcd"}))
    with pytest.raises(ConfigError, match="already complete"):
        resume_config(str(done))
    # a report.json of another job, or a malformed one, finishes nothing (issue 34 item 7)
    for report in ('{"job_id": "ffffffff"}', '{"job_id": "0123', "[]"):
        (done / "report.json").write_text(report)
        assert resume_config(str(done)).privacy.eps == load_config(CONFIG).privacy.eps


def test_resume_takes_the_folders_config_with_post_release_overrides_only(tmp_path):
    out = _saved_run(tmp_path, "release.npz")
    cfg = resume_config(str(out), ["student.epochs=1", "labels.type=soft"])
    assert cfg.student.epochs == 1 and cfg.privacy.eps == load_config(CONFIG).privacy.eps
    with pytest.raises(ConfigError, match="privacy.eps"):
        resume_config(str(out), ["privacy.eps=50"])


def test_a_seeded_run_needs_consent_and_says_it_is_not_private(capsys):
    seeded = load_config(CONFIG, ["run.rng=seeded"])
    with pytest.raises(ConfigError, match="--insecure-seeded"):
        check_consent(seeded, insecure_seeded=False)
    check_consent(seeded, insecure_seeded=True)
    assert "NOT PRIVATE" in capsys.readouterr().err
    check_consent(load_config(CONFIG), insecure_seeded=False)     # secure: nothing to consent to


def test_a_failure_is_one_line_and_a_bug_is_marked_unexpected():
    assert failure_line(ConfigError("a", "b", "c")) == "config 'a': b. Fix: c"
    full = failure_line(OSError(errno.ENOSPC, "No space left on device", "/x/release.npz"))
    assert full.startswith("out of disk space writing /x/release.npz") and "Fix:" in full
    assert failure_line(ZeroDivisionError("boom\nsecond line")) == \
        f"{UNEXPECTED}: ZeroDivisionError: boom"


def test_incomplete_json_says_whether_a_release_is_saved(tmp_path):
    import json
    out = _saved_run(tmp_path, "release.npz")
    said = record_incomplete(str(out), "interrupted by SIGINT during student", KeyboardInterrupt())
    assert f"--resume {out}" in said
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is True and marker["next_step"].endswith(f"--resume {out}")
    bare = tmp_path / "bare"
    bare.mkdir()
    assert "nothing was released" in record_incomplete(str(bare), "x", RuntimeError("x"))

"""Holders off the cluster, end to end: ``rknn-ray trial`` on the shipped breast-cancer table.

Every party is its own OS process over real TLS on loopback: 74 holders (each its own
folder, key, secret and ledger; ``holder join-many`` over 25 at a time here, the
acceptance run in docs/lab-notes uses one process per holder), the shuffler service and
the operator's job (``cluster.holders: remote``) under strace. What is checked is what
each party saw and kept: the job's report names the remote holders and the n opened; each
holder's own ledger holds its own charge, at its own accountant's eps; the parties never
tried to import what they must not use; the operator's processes never opened a holder's
file; the published specification verifies with the operator's key and binds the
encoder files the holders used. A round whose holders stay below the floor releases
nothing and ends in one line, its reservation returned.
"""
from __future__ import annotations

import csv
import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sealing.round_spec import verify

ROOT = Path(__file__).resolve().parents[1]
# only the traced calls stop a traced process (strace >= 5.3): the same trace, less CPU
STRACE_STOP = "--seccomp-bpf"


def _ptrace_works() -> bool:
    import shutil
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=%file", "-o", os.devnull, "true"],
                          capture_output=True)
    return done.returncode == 0


def env_for(ray=None) -> dict:
    """The trial's environment; with ``ray`` (the worker's session, ``ray_session``) the
    operator's job joins it as under ``ray job submit`` instead of starting its own."""
    # read now, not at import: the session's Ray set what joining it needs in os.environ
    env = {k: v for k, v in {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                             "PYTHONPATH": str(ROOT)}.items() if k != "RAY_ADDRESS"}
    if ray is not None:
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    return env


def trial(tmp: Path, *extra: str, timeout: float = 400, ray=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jobs.cli", "trial", "--config", "table_shuffle",
                           "--ledger", str(tmp / "operator-ledger.sqlite"), "--out",
                           str(tmp / "run"), "--holders-per-process", "25", "--parallel", "3",
                           *extra], cwd=ROOT, env=env_for(ray), capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trial")
    traced = _ptrace_works()
    strace = f"strace -f -qq {STRACE_STOP} -e trace=%file -o {tmp / 'operator.trace'}"
    wrap = ["--operator-wrap", strace] if traced else []
    out = trial(tmp, *wrap)        # its own Ray: every process the job starts is under strace
    return tmp, out, traced


def test_each_party_apart_the_job_labels_and_trains(done):
    tmp, out, _ = done
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    report = json.loads((tmp / "run" / "report.json").read_text())
    remote = report["remote"]
    assert remote["registered"] == remote["reported"] == remote["released"] == 74
    assert remote["opened"] == report["counts"]["messages"] == 74
    assert report["counts"]["holders"]["remote"] is True
    assert report["privacy"]["rounds"][0]["n"] == 74
    assert "off the cluster" in report["privacy"]["relation"]
    assert report["shuffler"][0]["answers"]["accepted"] == 74
    assert sum(report["shuffler"][0]["answers"].values()) == 74      # nothing refused
    # the student learns from the released labels: above the evaluation rows' majority class
    # (0.624). The holders' secrets are real (the OS CSPRNG, fresh each trial), so their coins
    # and the student's accuracy vary from trial to trial: 0.72-0.95 in 12 trials, then
    # 0.659-0.965 in 6 more (2026-12-06), in the cluster 0.82-0.97 (docs/results.md); a fixed
    # 0.8 failed 1 trial in 3, majority + 0.05 (0.674) 1 in 6 and once in a test run. How
    # close the remote student comes to the in-cluster one (3 seeds each) is in
    # docs/results.md, "Holders off the cluster", not this test's to judge.
    with open(ROOT / "jobs/configs/data/breast_cancer/evaluation.csv", newline="") as fh:
        labels = [row["label"] for row in csv.DictReader(fh)]
    majority = max(labels.count(c) for c in set(labels)) / len(labels)
    assert report["student"]["test_accuracy"] > majority, (report["student"], majority)
    assert "imports the parties tried of what they must not use: 0" in out.stdout
    assert "holder processes: 3 ended 0, 0 did not" in out.stdout
    assert not (tmp / "run.parties" / "blocked.log").exists()


def test_each_holder_ledger_holds_its_own_charge(done):
    tmp, out, _ = done
    assert out.returncode == 0
    report = json.loads((tmp / "run" / "report.json").read_text())
    ledgers = sorted((tmp / "run.parties" / "holders").glob("holder-*/ledger.db"))
    assert len(ledgers) == 74
    spec_eps = report["privacy"]["details"][0]["eps"]
    for path in ledgers:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        rows = db.execute("SELECT eps, status FROM releases").fetchall()
        db.close()
        spent = [eps for eps, status in rows if status == "released"]
        # one charge, at the eps the holder's own accountant computed (at the spec's floor of
        # senders: never below what the job's guarantee states at the 74 that reported)
        assert len(spent) == 1, rows
        assert spent[0] >= report["privacy"]["eps"] - 1e-9
        assert spent[0] <= spec_eps + 1e-6


def test_the_published_specification_is_what_holders_answered(done):
    tmp, out, _ = done
    assert out.returncode == 0
    pub = (tmp / "run.parties" / "operator" / "operator.key.pub").read_text().strip()
    spec = verify((tmp / "run" / "published" / "round.spec").read_bytes(), bytes.fromhex(pub))
    report = json.loads((tmp / "run" / "report.json").read_text())
    assert spec.content_hash().hex() == report["remote"]["spec_hash"]
    assert spec.model == "shuffle" and spec.allowance == 1 and spec.min_senders <= 74
    import hashlib
    for f in spec.encoder:           # the files in the run folder are the ones it names
        body = (tmp / "run" / "published" / f.name).read_bytes()
        assert hashlib.sha256(body).hexdigest() == f.sha256
    # no private value in what was published: the encoder is fitted on public rows only
    assert spec.queries.shape == (10, 8)


def test_the_operator_never_opens_a_holder_file(done):
    tmp, out, traced = done
    if not traced:
        pytest.skip("needs strace and ptrace (apt-get install strace)")
    assert out.returncode == 0
    trace = (tmp / "operator.trace").read_text()
    assert "jobs.distill" in trace or "execve" in trace       # the job really was traced
    holders = str(tmp / "run.parties" / "holders")
    opened = [line for line in trace.splitlines() if holders in line]
    assert opened == []
    assert "raylet" in trace           # Ray's processes were under it too (children of the job)


def test_too_few_holders_release_nothing_and_say_so(tmp_path, ray_session):
    out = trial(tmp_path, "--set", "shuffle.min_senders=74", "--absent", "1", "--window", "12",
                ray=ray_session)
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, out.stderr[-2000:]
    # at most 73 (one is absent; under load, the window may close on others still uploading)
    found = re.search(r"round 1: (\d+) of 74 registered holders reported, below the floor of 74 "
                      r"the guarantee assumes: the shuffler released no batch", errors[0])
    assert found and int(found.group(1)) <= 73, errors[0]
    assert "nothing was released" in errors[0]
    assert not (tmp_path / "run" / "release.npz").exists()
    db = sqlite3.connect(f"file:{tmp_path / 'operator-ledger.sqlite'}?mode=ro", uri=True)
    states = [s for (s,) in db.execute("SELECT status FROM releases")]
    db.close()
    assert states and "released" not in states   # the reservation was returned, none spent


@pytest.mark.parametrize("config, model, extra", [
    ("table_shuffle", "local", ["--set", "privacy.delta=0"]),
    ("table_central", "central", ["--set", "rknn.connection=balanced_min"])])
def test_local_and_central_models_reach_the_server_through_a_relay(tmp_path, config, model, extra,
                                                                   ray_session):
    """No shuffler in these models: the service runs as a relay (no key, no anonymity
    promised); holders seal for the server only; the job's guarantee is the model's own.
    Run from the user's own folder with relative paths, as the README writes the command
    (the parties run from the project's folder)."""
    out = subprocess.run([sys.executable, "-m", "jobs.cli", "trial", "--config", config,
                          "--set", f"privacy.model={model}", "--set", "student.epochs=5", *extra,
                          "--ledger", "ledger.sqlite", "--out", "run",
                          "--holders-per-process", "74"],
                         cwd=tmp_path, env=env_for(ray_session), capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 0, out.stderr[-3000:] + out.stdout[-2000:]
    assert f"relay (no shuffling: the {model} model)" in out.stdout
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["privacy"]["model"] == model
    assert report["remote"]["reported"] == report["remote"]["opened"] == 74
    spec = (tmp_path / "run" / "published" / "round.spec").read_bytes()
    pub = (tmp_path / "run.parties" / "operator" / "operator.key.pub").read_text().strip()
    published = verify(spec, bytes.fromhex(pub))
    assert published.shuffler_keys == ()                 # sealed for the server only
    assert (published.eps0 is None) == (model == "central")
    balanced = "rknn.connection=balanced_min" in extra     # the plan's rule and prices go out
    assert published.connection_rule == ("balanced_min" if balanced else "rknn")
    assert (published.connection_prices is not None) == balanced
    if balanced:
        assert report["connection"]["rules"] == ["balanced_min"]
        import hashlib
        assert report["connection"]["prices_digest"] == [hashlib.sha256(
            np.ascontiguousarray(published.connection_prices, "<f8").tobytes()).hexdigest()[:16]]
    assert not (tmp_path / "run.parties" / "shuffler" / "shuffler.key").exists()
    ledgers = sorted((tmp_path / "run.parties" / "holders").glob("holder-*/ledger.db"))
    assert len(ledgers) == 74
    assert (tmp_path / "ledger.sqlite").is_file()           # the user's, where they named it

"""Holders off the cluster, the mistakes a user makes wiring the parties together: a CA file
that is missing or is a key, another CA than the one that signed the service, the operator's
public key given for its private key, a service that is not (yet) up.

Each party as its own OS process over real TLS on 127.0.0.1 (the service of
tests/test_holder.py): the holder answers one line naming the file or the URL and the fix,
charging nothing; the operator's job answers before it reserves budget or starts Ray; a
holder with ``--wait`` waits for a service that starts after it.
"""
import os
import socket
import subprocess
import sys
import time

import pytest

from benchmarks.holder_world import (HOLDER_SHIM, holder_blocked_attempts, join_args,
                                     make_holder_world, run_holder)
from benchmarks.shuffler_world import ROOT, start_service, stop_all
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.remote.operator_key import public_file, save_operator_key
from sealing.upload_client import client_context
from shuffler.certs import make_certs

DATA = os.path.join(ROOT, "jobs", "configs", "data", "breast_cancer")


@pytest.fixture
def world(tmp_path):
    made, dirs = make_holder_world(tmp_path / "w", holders=1, floor=1)
    yield made, dirs[0]
    stop_all(made)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def holder_line(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: rknn-ray holder join: ")
    return done.stderr


def test_a_ca_file_is_a_certificate_or_one_line_naming_it(tmp_path):
    certs = make_certs(tmp_path / "tls")
    assert client_context(certs.ca) is not None
    for path, words in ((tmp_path / "none.pem", "does not exist"),
                        (certs.key, "holds no CA certificate")):
        with pytest.raises(ValueError) as err:
            client_context(path)
        assert str(path) in str(err.value) and words in str(err.value)
        assert "Fix: give the CA certificate" in str(err.value)


def test_a_holder_names_the_file_or_the_service_it_could_not_use(world, tmp_path):
    w, holder = world
    _, url = start_service(w)
    other = make_certs(tmp_path / "other")
    port = free_port()
    cases = [
        (join_args(w, url, holder, "--cafile", str(w.certs.key)),
         [f"{w.certs.key} holds no CA certificate (PEM)", "not a key file"]),
        (join_args(w, url, holder, "--cafile", str(other.ca)),
         [f"the service at {url} did not prove itself", str(other.ca), "give as --cafile"]),
        (join_args(w, f"https://127.0.0.1:{port}", holder),
         [f"at https://127.0.0.1:{port} cannot be reached (ConnectionRefusedError",
          "join with --wait SECONDS"]),
    ]
    for args, words in cases:          # the last --cafile given is the one argparse keeps
        line = holder_line(run_holder(w, args))
        assert all(x in line for x in words), line
    assert not (holder / "ledger.db").exists()          # nothing charged, nothing made
    assert holder_blocked_attempts(w) == []


def test_a_holder_with_wait_waits_for_a_service_that_starts_after_it(world):
    w, holder = world
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "RKNN_BLOCK_LOG": str(w.folder / "holder-blocked.log")}
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_SHIM,
                             *join_args(w, f"https://127.0.0.1:{port}", holder, "--wait", "90")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    w.procs.append(proc)
    time.sleep(3)                      # refused until the service listens on that port
    assert proc.poll() is None, proc.communicate()
    start_service(w, port=port)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "{'accepted': 1}; charged eps=" in out


def operator_config(tmp_path, **remote) -> str:
    """A table job whose holders run off the cluster (the breast-cancer table's public and
    evaluation parts; three registered holders)."""
    registry = tmp_path / "holders.txt"
    registry.write_text("".join(f"{c * 64} 4\n" for c in "abc"))
    values = {"shuffler": "https://127.0.0.1:9", "ca": "ca.pem", "operator_key": "op.key",
              "registry": str(registry), **remote}
    path = tmp_path / "job.yaml"
    path.write_text(f"""run: {{name: remote_mistakes, seed: 0}}
data:
  dataset: table
  classes: [malignant, benign]
  max_records_per_client: 8
  private: {{label: label}}
  public: {{path: {DATA}/public.csv, id: row_id}}
  evaluation: {{path: {DATA}/evaluation.csv, label: label}}
represent: {{encoder: pca, dim: 8}}
queries: {{s: 10, restarts: 1}}
rknn: {{k: 1}}
privacy: {{model: shuffle, mechanism: collision, eps: 4.0, delta: 1.0e-6}}
shuffle: {{onion_layers: 0}}
student: {{epochs: 1}}
cluster: {{holders: remote}}
remote: {{{", ".join(f"{k}: {v}" for k, v in values.items())}}}
""")
    return str(path)


def test_the_operators_job_answers_a_bad_remote_before_budget_and_ray(world, tmp_path):
    w, _ = world
    _, url = start_service(w)
    key = tmp_path / "op.key"
    save_operator_key(key)
    other = make_certs(tmp_path / "other")
    cases = [
        ({"ca": str(w.certs.key)}, ["remote.ca:", "holds no CA certificate"]),
        ({"ca": str(w.certs.ca), "operator_key": str(public_file(key))},
         ["remote.operator_key:", "is the operator's public key", f"({key},"]),
        ({"ca": str(w.certs.ca)}, ["https://127.0.0.1:9 cannot be reached",
                                   "correct remote.shuffler / remote.ca"]),
        ({"ca": str(other.ca), "shuffler": url}, [f"the service at {url} did not prove itself",
                                                 "give as remote.ca"]),
    ]
    ledger = tmp_path / "ledger.sqlite"
    for i, (remote, words) in enumerate(cases):
        cfg = operator_config(tmp_path, **{"operator_key": str(key), **remote})
        done = subprocess.run([sys.executable, "-m", "jobs.distill", "--config", cfg, "--ledger",
                               str(ledger), "--out", str(tmp_path / f"run{i}")], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and all(x in last for x in words), last
        assert "Traceback" not in done.stderr and "starting Ray" not in done.stdout + done.stderr
    assert BudgetStore(str(ledger)).datasets() == []      # nothing reserved, nothing returned


def test_a_holders_own_file_that_cannot_answer_is_one_line_and_charges_nothing(world, tmp_path):
    w, holder = world
    _, url = start_service(w)
    rows = (holder / "data.csv").read_text().splitlines()
    header, first = rows[0], rows[1].split(",")
    cases = {"empty.csv": (header + "\n", "holds no rows"),
             "latin1.csv": (None, "does not read as CSV"),
             "nan.csv": (header + "\n" + ",".join([""] + first[1:]) + "\n",
                         "the input: column")}
    for name, (text, words) in cases.items():
        path = tmp_path / name
        if text is None:            # not UTF-8: a Latin-1 header
            path.write_bytes(header.encode() + b",caf\xe9\n" + rows[1].encode() + b",1\n")
        else:
            path.write_text(text)
        line = holder_line(run_holder(w, [*join_args(w, url, holder), "--data", str(path)]))
        assert words in line and "data.input" not in line, line
    assert not (holder / "ledger.db").exists()          # refused before any charge
    assert holder_blocked_attempts(w) == []


def test_a_ledger_a_holder_cannot_use_is_its_own_one_line_refusal(tmp_path):
    w, dirs = make_holder_world(tmp_path / "many", holders=2, floor=1)
    try:
        _, url = start_service(w)
        (tmp_path / "a-file").write_text("")
        (dirs[0] / "ledger.db").write_bytes(b"not a ledger at all" * 100)
        for ledger in (tmp_path / "a-file" / "ledger.db", dirs[0] / "ledger.db"):
            line = holder_line(run_holder(w, [*join_args(w, url, dirs[0]), "--ledger",
                                              str(ledger)]))
            assert f"{ledger}" in line and "ledger" in line and "Fix:" in line, line
        done = run_holder(w, ["holder", "join-many", url, "--cafile", str(w.certs.ca),
                              "--holders-dir", str(dirs[0].parent), "--operator-key",
                              str(w.operator_file)])
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        refusals = done.stderr.strip().splitlines()
        assert len(refusals) == 1 and refusals[0].startswith(
            f"error: rknn-ray holder join-many: {dirs[0].name}: "), done.stderr
        assert "2 holders: 1 charged, 0 retries, 1 refused" in done.stdout, done.stdout
        assert holder_blocked_attempts(w) == []
    finally:
        stop_all(w)


def test_trial_arguments_out_of_range_are_one_line_and_leave_no_folder(tmp_path):
    for extra, words in ((["--parallel", "0"], "--parallel 0: give 1 or more"),
                         (["--holders-per-process", "0"], "give 1 or more"),
                         (["--window", "0"], "--window 0: give seconds"),
                         (["--absent", "75"], "the table has 74 holders; give at most 74")):
        done = subprocess.run([sys.executable, "-m", "jobs.cli", "trial", "--config",
                               "table_shuffle", "--ledger", "l.sqlite", "--out", "run", *extra],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("error: rknn-ray trial: ") and words in done.stderr
        assert sorted(os.listdir(tmp_path)) == []          # nothing made: it can be rerun

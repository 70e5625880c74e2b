"""Issue 55, items 2-4: a party lost mid-job ends it honestly, and the job settles its ledger.

Real ``jobs.distill`` processes (tests/lost_party_driver.py) on a small user table, joined to
this session's Ray as a job under ``ray job submit`` is (or to a two-node ``rknn-ray
cluster`` for a site node); one party writes its process id when it is surely mid-work and
waits, and the test kills that process (or its node's raylet) with ``kill -9``. Each job
ends in one ``error:`` line, exit 2, no traceback, and leaves no open reservation: returned
where no report reached the server, spent where one did. A table's shard cannot be restarted
with its rows (they are handed over once), so its loss ends the round, unless
``privacy.allow_partial_release`` asks for a release from the clients that reported, which
report.json and the console then state.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rknn_ray.accounting.budget_store import BudgetStore, open_reservations
from tests.job_args import distill_args
from tests.table_files import table_config, write_parts

ROOT = Path(__file__).resolve().parents[1]


def _table_job(tmp_path, rounds: int = 1, **privacy) -> Path:
    """A small table job's config file (1,100 records of ~300 holders, 2 shards of ~8 batches
    each), with ``privacy`` keys changed."""
    write_parts(str(tmp_path))
    cfg = table_config(str(tmp_path))
    cfg["privacy"].update(privacy)
    cfg["rounds"] = {"count": rounds}
    cfg["cluster"].update({"batch_clients": 20, "shard_cpus": 0.5, "server_cpus": 0.5})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run_and_kill(ray_session, tmp_path, party: str, config: Path, victim: str,
                  wait_for: str | None = None, wrapper=(), kill=None) -> tuple[int, str]:
    """Run the job with ``party`` pausing; ``kill -9`` the pid in ``victim``.pid (``kill(pid)``:
    another process) once ``wait_for``.pid (default: the victim's) is there; (exit code, the
    job's console). It joins this session's Ray, or (``ray_session`` None) ``wrapper``'s."""
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {**os.environ, "RKNN_RAY_LEDGER": str(tmp_path / "ledger.sqlite"),
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    if ray_session is not None:
        env["RAY_ADDRESS"] = ray_session.get_runtime_context().gcs_address
    args = distill_args(str(config), tmp_path / "run", "student.trainer=local")
    log = (tmp_path / "console.txt").open("w")
    proc = subprocess.Popen([*wrapper, sys.executable, "-m", "tests.lost_party_driver", party,
                             str(markers), *args], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready, pid_file = markers / f"{wait_for or victim}.pid", markers / f"{victim}.pid"
        end = time.monotonic() + 300
        while not ready.exists():
            assert proc.poll() is None, (tmp_path / "console.txt").read_text()
            assert time.monotonic() < end, "the party never paused"
            time.sleep(0.1)
        (kill or _kill_9)(int(pid_file.read_text()))
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    return code, (tmp_path / "console.txt").read_text()


def _kill_9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def _one_line(code: int, text: str) -> str:
    """The job's one error line (exit 2, no traceback anywhere on its console)."""
    assert code == 2 and "Traceback" not in text, text
    (line,) = [ln for ln in text.splitlines() if ln.startswith("error:")]
    return line


def _settled(tmp_path) -> dict:
    """The ledger's one source, with no reservation left open."""
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    assert open_reservations(store) == []
    (source,) = store.datasets()
    assert source["reserved"] == 0
    return source


@pytest.mark.parametrize("model", ["central", "shuffle"])
def test_a_table_shard_killed_mid_round_ends_the_job_in_one_line(ray_session, tmp_path, model):
    """kill -9 of client shard 0 after its first batch: its rows were handed over once, so the
    round ends (no partial release, no wrong "no client randomized"), exit 2. Central: the
    other shard's reports reached the server, so the job counts its reservation as spent
    itself; shuffle: the shuffler only collected sealed reports, so it is returned."""
    privacy = ({"model": "shuffle", "mechanism": "rr", "eps": 4.0, "delta": 1e-5}
               if model == "shuffle" else {})
    code, text = _run_and_kill(ray_session, tmp_path, "shard", _table_job(tmp_path, **privacy),
                               "shard")
    line = _one_line(code, text)
    assert "client shard 0 was lost mid-round after sending" in line, line
    assert "cannot be restarted" in line and "No client randomized" not in line, line
    assert "allow_partial_release" in line and "re-sends" not in text, text
    assert not (tmp_path / "run" / "release.npz").exists()
    (job,) = _settled(tmp_path)["releases"]
    if model == "central":
        assert job["status"] == "released" and "counted as spent" in job["note"], job
        assert "eps is counted in the ledger" in line, line
    else:
        assert job["status"] == "unused" and "nothing was released" in job["note"], job
        assert "nothing was released" in line, line


@pytest.mark.parametrize("victim", ["scanner", "holder"])
def test_a_scan_process_killed_during_the_scan_ends_the_job_in_one_line(
        ray_session, tmp_path, victim):
    """kill -9 of the scan's actor, or of the parts' holder, while the scan runs: one line,
    exit 2, before any reservation (nothing reserved, nothing released)."""
    code, text = _run_and_kill(ray_session, tmp_path, "scan", _table_job(tmp_path), victim,
                               wait_for="scanner")
    line = _one_line(code, text)
    who = "the scan's actor" if victim == "scanner" else "the parts' holder"
    assert f"{who} died during the private scan" in line, line
    assert "no budget was reserved" in line, line
    store = BudgetStore(str(tmp_path / "ledger.sqlite"))
    assert open_reservations(store) == [] and store.datasets() == []


def test_a_partial_release_is_allowed_only_by_the_option_and_said(ray_session, tmp_path):
    """privacy.allow_partial_release: true: the same lost shard, and each of the job's two
    rounds is released from the other shard's clients (the second without asking the lost
    one); report.json and the console say so, and the job closes its reservation."""
    code, text = _run_and_kill(ray_session, tmp_path, "shard",
                               _table_job(tmp_path, rounds=2, allow_partial_release=True), "shard")
    assert code == 0 and "Traceback" not in text, text
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    first, second = report["privacy"]["partial_release"]
    clients = report["counts"]["clients"]
    for t, partial in enumerate((first, second)):
        assert partial["lost_shards"] == [0], partial
        assert partial["option"] == "privacy.allow_partial_release"
        assert partial["clients"] == clients and 0 < partial["clients_lost"] < clients
        assert report["counts"]["missing"][t] > 0
        assert (f"PARTIAL RELEASE: round {t + 1} was released without client shard(s) 0: up "
                f"to {partial['clients_lost']} of {clients} clients did not report") in text, text
    assert second["clients_lost"] > first["clients_lost"]    # its first batch counted in round 1
    source = _settled(tmp_path)
    released = [r["round"] for r in source["releases"] if r["status"] == "released"]
    assert released == [0, 1] and source["spent"]["eps"] == pytest.approx(2.0)


def _kill_its_raylet(pid: int) -> None:
    """kill -9 of the raylet that started worker ``pid`` (its parent): the whole node is lost."""
    ppid = int(next(ln.split()[1] for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if ln.startswith("PPid:")))
    assert Path(f"/proc/{ppid}/comm").read_text().strip() == "raylet"
    os.kill(ppid, signal.SIGKILL)


def test_a_site_node_lost_mid_round_ends_the_job_in_one_line(tmp_path):
    """``rknn-ray cluster`` of two nodes, site a's on the head (with the server), site b's on
    its own; kill -9 of site b's raylet while its shard is mid-round: the node is gone with the
    site's rows, so the job ends in one line at once (no wait for a restart that cannot come),
    exit 2, and settles its reservation (spent: site a's reports reached the server)."""
    from tests.test_table_sites import _config, _write_sites
    where = _write_sites(str(tmp_path))
    sites = {n: {"path": where[n], "labels": {"site": n}} for n in ("a", "b")}
    cfg = _config(str(tmp_path), sites, cluster={"batch_clients": 5})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    wrapper = [sys.executable, "-m", "jobs.local_cluster", "--node", "server+client:site=a",
               "--node", "client:site=b", "--"]
    start = time.monotonic()
    code, text = _run_and_kill(None, tmp_path, "shard:1", tmp_path / "job.yaml", "shard",
                               wrapper=wrapper, kill=_kill_its_raylet)
    line = _one_line(code, text)
    assert "client shard 1 was lost mid-round after sending" in line, line
    assert "reports opened" not in text and time.monotonic() - start < 240, text
    (job,) = _settled(tmp_path)["releases"]
    assert job["status"] == "released" and "counted as spent" in job["note"], job


def test_a_party_lost_in_a_later_round_returns_only_what_no_round_used(
        ray_session, tmp_path, monkeypatch, capsys, isolated_privacy_ledger):
    """digits_shuffle in two rounds, the shuffler dying as it is asked to shuffle round 2: round
    1 stays released and spent, and since no report of round 2 reached the server the job
    returns the rest of its reservation itself (no open reservation)."""
    import functools

    import jobs.distill as distill
    from rknn_ray.job.session import Parties
    from tests.faulty_parties import ShufflerDyingInRound2
    monkeypatch.setattr(distill, "run", functools.partial(
        distill.run, parties=Parties(shuffler=ShufflerDyingInRound2)))
    code = distill.main(distill_args("digits_shuffle.yaml", tmp_path / "run", "rounds.count=2",
                                     "run.rng=seeded", extra=["--insecure-seeded"]))
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and "the shuffler died" in line and "Traceback" not in err, err
    assert "its release is saved" in line, line        # round 1, for --resume
    store = BudgetStore(str(isolated_privacy_ledger))
    assert open_reservations(store) == []
    (source,) = store.datasets()
    released = [r for r in source["releases"] if r["status"] == "released"]
    (rest,) = [r for r in source["releases"] if r["status"] == "unused"]
    assert [r["round"] for r in released] == [0] and "nothing was released" in rest["note"]
    assert source["spent"]["eps"] == pytest.approx(released[0]["eps"])
    assert 0 < released[0]["eps"] < 2.0


def test_a_dataset_shard_killed_mid_round_is_restarted_and_counted_once(clean_shuffle_round,
                                                                        tmp_path):
    """A built-in dataset's shard (its records by reference, readable again) killed with
    kill -9 after its first batch is restarted by Ray and re-sends the round: the same
    reports, the copies dropped, the release that of the round without the fault."""
    import threading

    import numpy as np

    from rknn_ray.job.session import Parties
    from tests.digits_rounds import session_round
    from tests.faulty_parties import pausing_shard
    cfg, clean = clean_shuffle_round
    marker = tmp_path / "shard.pid"

    def kill_when_paused():
        end = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < end:
            time.sleep(0.1)
        _kill_9(int(marker.read_text()))
    killer = threading.Thread(target=kill_when_paused, daemon=True)
    killer.start()
    parties = Parties(shards={0: pausing_shard(marker)})
    _, _, _, _, (hit,) = session_round(cfg, job_id="job-clean", parties=parties)
    killer.join(timeout=5)
    np.testing.assert_array_equal(hit.counts, clean.counts)
    assert hit.messages == clean.messages and hit.rejected["duplicate_message"] > 0
    assert hit.partial is None and hit.shuffler["senders"] == clean.shuffler["senders"]


def test_a_party_process_that_died_is_one_line_naming_it(ray_session):
    """Any party's actor killed under the job (the server actor of a remote round, kill -9 by
    pid: exit 1 and a traceback before) is said in one line that names it, not as a bug."""
    from rknn_ray.job.failure import UNEXPECTED, failure_line
    ray = ray_session

    @ray.remote(num_cpus=0)
    class ServerImpl:                       # a real actor of that name, killed for real
        def pid(self):
            return os.getpid()

    actor = ServerImpl.remote()
    pid = ray.get(actor.pid.remote())
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(Exception) as caught:
        for _ in range(50):
            ray.get(actor.pid.remote())
            time.sleep(0.1)
    line = failure_line(caught.value)
    assert type(caught.value).__name__ == "ActorDiedError", caught.value
    assert not line.startswith(UNEXPECTED) and "\n" not in line, line
    assert f"(ServerImpl, pid {pid})" in line and "Fix:" in line, line

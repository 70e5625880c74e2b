"""Edge probes (issue 34, items 1-5): a budget no interrupted round hands back, no published
number derived from the private records, keyed fingerprints, near-duplicate sources.

Items 1 and 2 interrupt real rounds: a real SIGTERM to a real ``python -m jobs.distill``
after the server has opened reports, and a Server actor killed by SIGKILL mid-round.
"""
import functools
import json
import signal

import pytest

from jobs.budget import main as budget_main
from rknn_ray.accounting.budget_store import BudgetStore, open_reservations
from tests.test_edge_probes import Job, _address, _args, _error_lines


def _settled_as_spent(ledger, capsys, eps: float) -> None:
    """`rknn-ray budget` lists the job's open reservation as spent if settled; settle spends it."""
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "reserved", row
    capsys.readouterr()
    assert budget_main(["--ledger", str(ledger)]) == 0
    listed = capsys.readouterr().out
    assert "if settled: counted as spent" in listed and "(started)" in listed, listed
    assert budget_main(["settle", row["job_id"], "--ledger", str(ledger)]) == 0
    said = capsys.readouterr().out
    assert "counted as spent" in said and "returned" not in said, said
    (dataset,) = BudgetStore(str(ledger)).datasets()
    (row,) = dataset["releases"]
    assert row["status"] == "released" and dataset["reserved"] == 0
    assert dataset["spent"]["eps"] == pytest.approx(eps)


# ---------------------------------------------------------------------- 1. started is a state

def test_sigterm_after_the_server_opened_reports_is_settled_as_spent(ray_session, tmp_path,
                                                                     capsys):
    """digits_local, one client per batch: the signal comes once the server has opened
    reports (its progress line), while the round runs. The failure path rewrites the
    reservation's note; settle must still count the whole reservation as spent."""
    out, ledger = tmp_path / "term", tmp_path / "ledger.sqlite"
    job = Job(_args("digits_local.yaml", out, "cluster.batch_clients=1"), ledger,
              _address(ray_session))
    code, text = job.signal_after("reports opened:", 0.0, signal.SIGTERM)
    assert code == 143, text
    (line,) = _error_lines(text)
    assert "interrupted by SIGTERM during private round 1" in line, text
    assert "its eps is counted in the ledger" in line and "nothing was released" not in line
    marker = json.loads((out / "incomplete.json").read_text())
    assert marker["release_saved"] is False and "stays counted" in marker["next_step"]
    (pending,) = open_reservations(BudgetStore(str(ledger)))
    assert pending["started"] and pending["driver_alive"] is not True
    _settled_as_spent(ledger, capsys, 4.0)


# ---------------------------------------------------------------------- 2. a dead server

def test_a_server_killed_mid_round_keeps_the_whole_reservation(
        ray_session, tmp_path, monkeypatch, capsys, isolated_privacy_ledger):
    """kill -9 of the Server after it opened 11 reports (local model): no counts came out,
    but each opened report is a local-DP release to the server: nothing is returned."""
    import jobs.distill as distill
    from jobs.distill import main
    from rknn_ray.job.session import Parties
    from tests.faulty_parties import ServerKilledWhileOpening, configured
    server = configured(ServerKilledWhileOpening, after=11)
    monkeypatch.setattr(distill, "run", functools.partial(distill.run, parties=Parties(server=server)))
    out = tmp_path / "killed"
    code = main(_args("digits_local.yaml", out, "cluster.batch_clients=1"))
    err = capsys.readouterr().err
    assert code == 2 and "the server died" in err and "Traceback" not in err, err
    assert "nothing was released" not in err and "eps is counted in the ledger" in err, err
    (dataset,) = BudgetStore(str(isolated_privacy_ledger)).datasets()
    (row,) = dataset["releases"]
    assert "reservation kept" in row["note"] and "returned" not in row["note"], row
    assert row["status"] == "reserved" and dataset["spent"]["eps"] == pytest.approx(4.0)
    (pending,) = open_reservations(BudgetStore(str(isolated_privacy_ledger)))
    assert pending["started"]             # settled once this driver (the test) is gone: spent
    assert budget_main(["--ledger", str(isolated_privacy_ledger)]) == 0
    assert "if settled: counted as spent" in capsys.readouterr().out

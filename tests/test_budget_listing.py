"""``rknn-ray budget`` says per job what was reserved, spent, returned or is still held, in
words (issue 36: a job that spent eps = 2 was listed as "round - unused eps=3.596e-06")."""
from jobs.budget import main
from rknn_ray.accounting.budget_store import BudgetStore


def _laplace(eps):
    """A discrete Laplace release of sensitivity 2 that costs ``eps``."""
    return {"type": "DiscreteLaplaceDpEvent", "noise_parameter": eps / 2, "sensitivity": 2}


def test_budget_lists_each_job_in_words(tmp_path, capsys):
    path = str(tmp_path / "ledger.sqlite")
    store = BudgetStore(path)
    store.reserve("ds1", "digits", "job-a", 2.0, 0.0, (10.0, 0.0))
    store.commit_round("ds1", "job-a", 0, 1.0, 0.0, _laplace(1.0))
    store.commit_round("ds1", "job-a", 1, 0.999, 0.0, _laplace(0.999))
    store.close_job("ds1", "job-a", "job finished: 2 round(s) released")
    store.reserve("ds1", "digits", "job-b", 1.0, 0.0, (10.0, 0.0))
    store.mark_failed("ds1", "job-b", "server died mid-round")
    assert main(["--ledger", path]) == 0
    out = capsys.readouterr().out
    assert ("job job-a: reserved eps=2, spent eps=1.999 in 2 rounds, returned eps=0.001; "
            "job finished: 2 round(s) released") in out
    assert "round 1: released eps=1  DiscreteLaplaceDpEvent" in out
    assert "round 2: released eps=0.999  DiscreteLaplaceDpEvent" in out
    assert ("job job-b: reserved eps=1, spent eps=0 in 0 rounds, still held eps=1 (open "
            "reservation); server died mid-round") in out
    assert "unused" not in out and "round -" not in out


def test_a_budget_with_a_delta_says_its_spend_is_a_sum_pld_jobs_compose(tmp_path, capsys):
    # a pld job's rounds, calibrated together, have own eps that add up to more than the
    # job's eps: the listing must not let that sum pass for what a pld job is checked against
    path = str(tmp_path / "ledger.sqlite")
    store = BudgetStore(path)
    store.reserve("ds1", "digits", "job-a", 2.0, 1e-6, (10.0, 1e-5))
    store.commit_round("ds1", "job-a", 0, 1.0, 0.0, _laplace(1.0))
    store.commit_round("ds1", "job-a", 1, 0.999, 0.0, _laplace(0.999))
    store.close_job("ds1", "job-a", "job finished: 2 round(s) released")
    store.reserve("ds2", "pure", "job-b", 1.0, 0.0, (10.0, 0.0))
    store.commit_round("ds2", "job-b", 0, 1.0, 0.0, _laplace(1.0))
    store.close_job("ds2", "job-b", "job finished: 1 round(s) released")
    assert main(["--ledger", path]) == 0
    out = capsys.readouterr().out
    head, pure = out.split("\nds2")
    assert "own costs added up; a job with privacy.accountant=pld is checked against" in head
    assert "added up" not in pure             # a pure budget composes by the sum: nothing to say


def test_notes_carry_no_terminal_colour_codes_or_ray_actor_handles(tmp_path, capsys):
    """Issue 57: a failed job's note held Ray's error text as it was: colour codes and an actor
    handle. The ledger keeps words only."""
    path = str(tmp_path / "ledger.sqlite")
    store = BudgetStore(path)
    store.reserve("ds1", "digits", "job-c", 1.0, 0.0, (10.0, 0.0))
    store.spend_job("ds1", "job-c", "round 1 failed: \x1b[36mray::ClientShardImpl.stream_reports()"
                    "\x1b[39m: Actor(ClientShardImpl, 6b9ef2a2c1d6a5e3f7c1a3b6) died\n\tunexpectedly")
    assert main(["--ledger", path]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "6b9ef2a2" not in out and "Actor(" not in out
    assert ("round 1 failed: ray::ClientShardImpl.stream_reports(): the ClientShardImpl actor "
            "died unexpectedly") in out

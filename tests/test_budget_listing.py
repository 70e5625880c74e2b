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

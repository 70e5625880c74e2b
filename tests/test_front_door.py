"""Issue 48's wording on the report page and the console: the local eps0 a shuffle round ran
at, rounds counted from 1, "1 worker", the student's trainer (no job run here: fast); and rknn_ray.run's refusal of
shards beyond the CPUs of the Ray it starts (a job run to that refusal)."""
import os
from jobs.report import eps0_words, run_sections


def _sections(report: dict) -> dict:
    return {k: dict(v) for k, v in run_sections({"report": report, "path": "run",
                                                 "incomplete": None})}


def test_the_report_page_shows_each_rounds_local_eps0():
    shuffled = {"type": "ShuffledLocalDpEvent", "eps0": 2.3125, "num_senders": 1000}
    report = {"privacy": {"model": "shuffle", "rounds": [{"event": shuffled}]}, "counts": {},
              "accuracy": {}, "timings_s": {"round_0": 1.0}}
    sections = _sections(report)
    assert sections["Privacy"]["local eps0"] == "2.312 (each client's report)"
    assert sections["Timings"]["round 1"] == "1.0 s"
    two = {"rounds": [{"event": shuffled}, {"event": {**shuffled, "eps0": 1.5}}]}
    assert eps0_words(two) == "2.312 (round 1), 1.5 (round 2)"
    central = {"rounds": [{"event": {"type": "DiscreteLaplaceDpEvent"}}]}
    assert eps0_words(central) is None
    assert "local eps0" not in _sections({**report, "privacy": central})["Privacy"]


def test_the_student_line_says_where_it_trained():
    base = {"privacy": {}, "counts": {}, "accuracy": {}, "timings_s": {}}
    ray = {"epochs": 40, "num_workers": 1, "device": "cpu", "train_samples": 359,
           "trainer": "ray"}
    line = _sections({**base, "student": ray})["Timings"]["student run"]
    assert line == "40 epochs, 1 Ray Train worker on cpu, 359 samples"
    auto = {**ray, "trainer": "local", "trainer_configured": "auto",
            "trainer_reason": "auto: 14,360 samples x epochs <= 100,000 (cnn), in this process"}
    line = _sections({**base, "student": auto})["Timings"]["student run"]
    assert line.startswith("40 epochs, in process on cpu, 359 samples (auto: 14,360")


def test_faiss_loader_lines_stay_out_of_an_info_log():
    import os
    import subprocess
    import sys
    code = ("import logging; logging.basicConfig(level=logging.INFO); "
            "import rknn_ray.labeling.rknn")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": root}, timeout=120)
    assert done.returncode == 0 and "faiss.loader" not in done.stderr, done.stderr


def test_rknn_ray_run_refuses_shards_beyond_the_cpus_of_the_ray_it_starts(tmp_path):
    """rknn_ray.run on a machine without Ray starts a local Ray of this machine's CPUs; shards
    that need more used to wait for them forever. Now a ConfigError naming cluster.shards,
    and the reservation made before Ray started is returned (nothing spent)."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ledger = tmp_path / "ledger.sqlite"
    code = ("import os, rknn_ray\n"
            "from rknn_ray.errors import ConfigError\n"
            "try:\n"
            f"    rknn_ray.run('digits_central', out_dir={str(tmp_path / 'run')!r}, "
            f"ledger={str(ledger)!r}, cluster={{'shards': 4 * (os.cpu_count() or 1)}})\n"
            "except ConfigError as exc:\n"
            "    print('REFUSED', exc)\n")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=root)
    done = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=240)
    assert "REFUSED" in done.stdout, (done.stdout + done.stderr)[-3000:]
    assert "cluster.shards" in done.stdout and "CPUs" in done.stdout
    from rknn_ray.accounting.budget_store import BudgetStore
    for source in BudgetStore(str(ledger)).datasets():
        assert source["spent"]["eps"] == 0 and source["reserved"] == 0

"""Shared fixtures: one session-scoped local Ray instance (num_cpus=2, loopback)."""
import atexit
import os
import shutil
import tempfile

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# The calibration cache (rknn_ray/accounting/calibration_cache.py): one folder per test run,
# never the developer's. Every process of the run (the jobs tests start, Ray workers, xdist
# workers) inherits it, so the run starts cold and calibrates each shuffle mechanism once.
if "RKNN_RAY_TEST_CALIBRATION_CACHE" not in os.environ:
    os.environ["RKNN_RAY_TEST_CALIBRATION_CACHE"] = tempfile.mkdtemp(prefix="rknn-ray-calibration-")
    atexit.register(shutil.rmtree, os.environ["RKNN_RAY_TEST_CALIBRATION_CACHE"], True)
os.environ["RKNN_RAY_CACHE_DIR"] = os.environ["RKNN_RAY_TEST_CALIBRATION_CACHE"]

# Under pytest-xdist (-n N) N test processes share the cores. Each OpenMP pool (torch, faiss,
# BLAS) sized for every core spins against the others': a semi-student test of 1.3 s alone
# took 12.9 s beside the other worker here. Each worker gets its share of the cores, set
# before any of those libraries loads (the jobs that tests start inherit it).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                 "RKNN_RAY_TORCH_THREADS"):     # the last: Ray Train workers, the project's knob
        os.environ.setdefault(_var, str(_share))

import pytest  # noqa: E402

from tests.parallel import ProgressLines, longest_first, make_scheduler  # noqa: E402
from tests.run_cleanup import start_run, stop_on_sigterm, sweep_run  # noqa: E402

start_run()     # before xdist starts its workers: they inherit the run's folder


def pytest_configure(config):
    """SIGTERM ends the run as Ctrl-C does (fixtures torn down: Ray shut down), and nothing
    the run started outlives it (tests/run_cleanup.py)."""
    stop_on_sigterm(worker=hasattr(config, "workerinput"))


@pytest.hookimpl(trylast=True)      # after the terminal reporter is registered
def pytest_sessionstart(session):
    """-n N -q: a line of progress at least every 30 s (tests/parallel.py ProgressLines)."""
    config = session.config
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if (not hasattr(config, "workerinput") and config.getoption("numprocesses", None)
            and reporter is not None and config.get_verbosity() <= 0):
        every = float(os.environ.get("RKNN_RAY_TEST_PROGRESS_S", "30"))
        config.pluginmanager.register(ProgressLines(reporter, every), "rknn-progress-lines")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        sweep_run()


def pytest_collection_modifyitems(config, items):
    """On an xdist worker (``-n N``): longest units first; one process keeps the collected order."""
    if hasattr(config, "workerinput"):
        longest_first(items)


@pytest.hookimpl(optionalhook=True)     # a hook of pytest-xdist (the test extra installs it)
def pytest_xdist_make_scheduler(config, log):
    """Under ``-n N`` (``--dist load``, xdist's default): one unit per module or
    shared-fixture group, longest first (tests/parallel.py). Other ``--dist`` modes as asked."""
    if config.getoption("dist") != "load":
        return None
    return make_scheduler(config, log)


@pytest.fixture(autouse=True)
def isolated_privacy_ledger(tmp_path, monkeypatch):
    """Every test gets its own persistent privacy ledger (never the user's), and its own
    encoder cache: a SimCLR encoder cached by an earlier run (or by the user) would make a
    training test pass without training."""
    path = tmp_path / "privacy-ledger.sqlite"
    monkeypatch.setenv("RKNN_RAY_LEDGER", str(path))
    monkeypatch.setenv("RKNN_RAY_CACHE", str(tmp_path / "rknn-ray-cache"))
    return path


def start_local_ray(ray) -> None:
    """ray.init for the test session, tried again when Ray's fixed 30 s raylet wait expires on
    a busy machine (as rknn_ray.job.ray_env.ensure_ray does for a job): one slow start must not turn
    every Ray test of the session into a setup error (seen at load 50 on 2 cores)."""
    from rknn_ray.job.ray_env import (START_ATTEMPTS, STARTUP_TIMEOUT, variables_set_while,
                                      workers_started_without_ray_twice)
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            # address="local": always a fresh instance of our own, never a cluster that a
            # `ray start` (the multi-node tests, another user) left running on this machine
            # workers start as a job's own instance starts them. The log monitor globs its
            # logs folder every 0.1 s while under 1,000 files, and this instance collects
            # hundreds of workers' logs (28 CPU s a session); above the threshold it looks for
            # new files every 0.5 s (1.0 -> 0.34 CPU s in 30 s with 297 files): the jobs that
            # join this instance see a new worker's first lines up to 0.5 s later
            with workers_started_without_ray_twice(), \
                    variables_set_while(RAY_LOG_MONITOR_MANY_FILES_THRESHOLD="1"):
                ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
            return
        except Exception as exc:  # noqa: BLE001 - Ray raises a bare Exception for this
            if STARTUP_TIMEOUT not in str(exc) or attempt == START_ATTEMPTS:
                raise
            ray.shutdown()          # stop the half-started processes before the next try


@pytest.fixture(scope="session")
def ray_session():
    import ray
    from rknn_ray.job.ray_env import quiet_ray_logs
    quiet_ray_logs()
    started = False
    if not ray.is_initialized():
        start_local_ray(ray)
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def digits():
    """sklearn's real 8x8 digits as (N, 1, 8, 8) in [0, 1], split 1200 train / 597 test."""
    import numpy as np
    from sklearn.datasets import load_digits
    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    p = np.random.default_rng(0).permutation(len(y))
    return x[p[:1200]], y[p[:1200]], x[p[1200:]], y[p[1200:]]


# The digits demo configs run once per test session, each into its own folder with its own
# ledger; test_distill_job, test_report_runs and test_budget read them instead of each running
# the same job again (issue 19 item 7). Readers must not change what is there (report.html,
# which `rknn-ray report` writes beside a run, is the exception).
DIGITS_RUNS = {
    # central carries a small total budget: test_budget's second job must be refused by it
    "digits_central": ["privacy.budget_eps=1.5"],
    "digits_local": [],
    "digits_shuffle": [],   # eps 2 in the config: eps0 > eps shows
}
# the student trains in the driver: Ray Train's start-up is ~10 s of a digits job, and the
# job's Ray Train path is proven end to end by test_progress_demo_console (the README's
# command on 2 workers, its run folder checked); test_student_ray runs every loop on Train
DIGITS_RUNS_FAST = ["student.epochs=1", "queries.restarts=1", "student.trainer=local"]


@pytest.fixture(scope="session")
def digits_runs(ray_session, tmp_path_factory):
    """Folder holding digits_central/, digits_local/, digits_shuffle/ (finished secure-rng runs,
    one student epoch, trained in the driver) and <name>.ledger.sqlite, the ledger each run
    was charged to."""
    from jobs.distill import main
    base = tmp_path_factory.mktemp("digits_runs")
    for name, extra in DIGITS_RUNS.items():
        args = ["--config", f"jobs/configs/{name}.yaml", "--out", str(base / name), "--quiet",
                "--ledger", str(base / f"{name}.ledger.sqlite")]
        for o in [*DIGITS_RUNS_FAST, *extra]:
            args += ["--set", o]
        assert main(args) == 0, name
    return base


@pytest.fixture(scope="session")
def clean_shuffle_round(ray_session):
    """(cfg, result): one seeded digits shuffle round (eps 2, job id job-clean) on real
    actors, without a fault: the reference that test_protocol's killed-shard round and
    test_shuffle_distributed's distributed round must release exactly (same job id, seeded
    shard secrets and server noise), run once for both."""
    from tests.digits_rounds import digits_cfg, session_round
    cfg = digits_cfg("privacy.eps=2.0")
    return cfg, session_round(cfg, job_id="job-clean")[4][0]

"""How the suite splits over pytest-xdist workers (``python -m pytest -n 2 tests``).

A test module is one unit of work (its module fixtures, e.g. a protocol session, start once);
modules that read one session fixture share a unit, so the fixture runs once in the suite and
not once per worker. Units start longest first (longest-processing-time order): with two
workers the suite then ends with short modules instead of one worker finishing a long one
alone. Each worker starts its own local Ray (``ray_session``), so no two tests ever share
actors across workers.
"""
from __future__ import annotations

import os

import pytest

# modules that read the same session-scoped fixture (tests/conftest.py) run on one worker
SHARED_FIXTURE_UNITS = {
    "test_budget.py": "digits_runs",
    "test_distill_job.py": "digits_runs",
    "test_report_runs.py": "digits_runs",
    "test_protocol.py": "clean_shuffle_round",
    "test_lost_parties.py": "clean_shuffle_round",
    "test_shuffle_distributed.py": "clean_shuffle_round",
}

# the longest units, longest first: summed test times (``--durations``) of a full run on this
# 2-core machine (two workers, 2026-12-06), less the cuts made since; every other module
# follows in collection order. A stale order costs time, never correctness: a long unit left
# to the end of the collection order (test_value_domain, test_composed_rounds were) runs
# alone while the other worker idles.
LONGEST_FIRST = [
    "clean_shuffle_round",              # test_lost_parties' killed jobs, two-node site
    "test_composed_rounds.py",
    "test_edge_probes.py",
    "test_calibration_cache.py",
    "test_table_sites.py",              # three nodes under strace, neighbours, refusals
    "test_table_holders.py",
    "test_remote_trial.py",             # holders, shuffler and operator as their own processes
    "test_experiments.py",              # Tune trials: a distill cell, four cells at once
    "test_examples.py",                 # five notebooks, a kernel each
    "test_cluster_submit.py",
    "test_amplification_job.py",
    "test_report_budget_view.py",       # the merge example's three jobs
    "test_edge_probes_release.py",
    "test_accounting_bitrr.py",
    "test_budget_edges.py",
    "test_multi_record_each.py",
    "test_predict.py",
    "test_progress_demo_console.py",
    "test_ledger_files.py",
    "test_console_tmux.py",
    "test_edge_probes_inputs.py",
    "test_table_data.py",
    "test_shard_secrets.py",
    "test_collision_lower_bound.py",
    "test_front_door.py",
    "test_multinode.py",
    "test_run_cleanup.py",
    "test_value_domain.py",
    "test_secret_memory.py",
    "test_cli.py",
    "test_table_jobs.py",
    "test_bench_honest_fraction.py",
    "test_student_ray.py",
    "digits_runs",
    "test_accounting_tight.py",
    "test_warm_round.py",
    "test_holder.py",                   # holder processes against a shuffler service
    "test_baselines_compare.py",
    "test_grid.py",
    "test_connection_jobs.py",
    "test_baselines_methods.py",
    "test_one_ledger.py",
    "test_encapsulation.py",
    "test_shuffle_pld.py",
    "test_cover.py",
    "test_public_choices.py",
    "test_accumulator.py",
    "test_report_pages.py",
    "test_shard_sources.py",
]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its shared-fixture group, else its module file."""
    module = os.path.basename(nodeid.split("::", 1)[0])
    return SHARED_FIXTURE_UNITS.get(module, module)


def longest_first(items: list) -> None:
    """Reorder collected tests in place so the longest units come first (a stable sort: the
    order inside a unit, and of all other units, stays as collected)."""
    rank = {unit: i for i, unit in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(unit_of(item.nodeid), len(rank)))


def make_scheduler(config, log):
    """An xdist scheduler whose units are :func:`unit_of`, sent in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False      # keep longest_first's order
    return UnitScheduling(config, log)


class ProgressLines:
    """Under ``-q`` a run prints one dot per test on a line that ends only at the terminal's
    width: the first units are the longest, so a log read line by line (CI's) showed nothing
    but xdist's "bringing up nodes..." for minutes. Every ``every`` seconds of an unfinished
    line this ends it with how far the run is (tests done of those collected, time since the
    start); nothing changes on a line that pytest ends itself sooner."""

    def __init__(self, reporter, every: float = 30.0):
        import time
        self.clock = time.monotonic
        self.reporter, self.every = reporter, every
        self.start = self.line_start = self.clock()
        self.done, self.total, self.width = 0, 0, 0

    def pytest_xdist_node_collection_finished(self, node, ids):
        self.total = max(self.total, len(ids))

    @pytest.hookimpl(trylast=True)      # after the terminal reporter wrote its letter
    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.passed:
            return                      # no letter on the line (a setup or teardown that passed)
        if report.when != "teardown":
            self.done += 1              # the test's call, or a setup's error or skip
        width = self.reporter._tw.width_of_current_line
        now = self.clock()
        if width < self.width:          # pytest ended the line (its [ n%] at the edge)
            self.line_start = now
        self.width = width
        if width and now - self.line_start >= self.every:
            elapsed = int(now - self.start)
            of = f" of {self.total}" if self.total else ""
            self.reporter.write(f"  {self.done}{of} tests done, "
                                f"{elapsed // 60}m{elapsed % 60:02d}s\n", flush=True)
            self.line_start, self.width = now, 0

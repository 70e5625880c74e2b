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

# modules that read the same session-scoped fixture (tests/conftest.py) run on one worker
SHARED_FIXTURE_UNITS = {
    "test_budget.py": "digits_runs",
    "test_distill_job.py": "digits_runs",
    "test_report_runs.py": "digits_runs",
    "test_protocol.py": "clean_shuffle_round",
    "test_lost_parties.py": "clean_shuffle_round",
    "test_shuffle_distributed.py": "clean_shuffle_round",
}

# the longest units, longest first: summed test times (``--durations``) on this 2-core machine
# (two workers), less the cuts made since; every other module follows in collection order.
# A stale order costs time, never correctness.
LONGEST_FIRST = [
    "test_edge_probes.py",
    "test_edge_probes_release.py",
    "test_cluster_submit.py",
    "test_console_tmux.py",
    "test_examples.py",                 # five notebooks, a kernel each
    "test_progress_demo_console.py",
    "test_table_jobs.py",
    "test_table_holders.py",
    "test_table_sites.py",              # three nodes under strace, neighbours, refusals
    "test_accounting_tight.py",
    "clean_shuffle_round",
    "digits_runs",
    "test_amplification_job.py",
    "test_table_data.py",
    "test_student_ray.py",
    "test_holder.py",                   # holder processes against a shuffler service
    "test_connection_jobs.py",
    "test_baselines_methods.py",
    "test_multinode.py",
    "test_one_ledger.py",
    "test_encapsulation.py",
    "test_warm_round.py",
    "test_shuffle_pld.py",
    "test_secret_memory.py",
    "test_cover.py",
    "test_grid.py",
    "test_public_choices.py",
    "test_accumulator.py",
    "test_baselines_compare.py",
    "test_experiments.py",              # Tune trials: a distill cell, four cells at once
    "test_report_pages.py",
    "test_shard_secrets.py",
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

"""The suite's split over xdist workers (tests/parallel.py): shared session fixtures stay on
one worker, the order is longest first and otherwise as collected."""
import glob
import os
import re
from types import SimpleNamespace

from tests.parallel import LONGEST_FIRST, SHARED_FIXTURE_UNITS, longest_first, unit_of

TESTS = os.path.dirname(__file__)


def test_every_module_reading_a_shared_session_fixture_is_in_that_fixtures_unit():
    """A module that reads digits_runs or clean_shuffle_round on a worker of its own would run
    that fixture (a whole job, a whole protocol round) a second time."""
    for fixture in ("digits_runs", "clean_shuffle_round"):
        readers = {os.path.basename(p) for p in glob.glob(os.path.join(TESTS, "test_*.py"))
                   if re.search(rf"def test_\w+\([^)]*\b{fixture}\b", open(p).read())}
        assert readers, fixture
        assert {m: unit_of(f"tests/{m}::t") for m in readers} == {m: fixture for m in readers}


def test_units_are_modules_or_groups_and_the_order_is_longest_first_then_as_collected():
    assert unit_of("tests/test_config.py::test_x[a::b]") == "test_config.py"
    assert unit_of("tests/test_budget.py::test_y") == "digits_runs"
    assert all(os.path.exists(os.path.join(TESTS, m)) for m in SHARED_FIXTURE_UNITS)
    assert all(u in SHARED_FIXTURE_UNITS.values() or os.path.exists(os.path.join(TESTS, u))
               for u in LONGEST_FIRST)
    ids = ["tests/test_config.py::a", "tests/test_edge_probes.py::b", "tests/test_noise.py::c",
           "tests/test_protocol.py::d", "tests/test_config.py::e", "tests/test_budget.py::f",
           "tests/test_shuffle_distributed.py::g"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    longest_first(items)
    listed = {"test_edge_probes.py": ["test_edge_probes.py::b"],
              "clean_shuffle_round": ["test_protocol.py::d", "test_shuffle_distributed.py::g"],
              "digits_runs": ["test_budget.py::f"]}
    assert [i.nodeid[6:] for i in items] == [
        *(nodeid for unit in sorted(listed, key=LONGEST_FIRST.index) for nodeid in listed[unit]),
        "test_config.py::a", "test_noise.py::c", "test_config.py::e"]  # the rest as collected


def test_a_line_of_dots_ends_with_the_progress_every_interval():
    """Under -n N -q a CI log read line by line showed "bringing up nodes..." for minutes: a
    dot line that runs past the interval ends with the tests done and the time; a line that
    pytest ends itself (its [ n%] at the edge) starts the interval again."""
    from tests.parallel import ProgressLines

    class Writer:
        width_of_current_line = 0

    class Reporter:
        _tw, text = Writer(), []

        def write(self, text, flush=False):
            self.text.append(text)
            self._tw.width_of_current_line = 0 if text.endswith("\n") else \
                self._tw.width_of_current_line + len(text)

    now = [0.0]
    reporter = Reporter()
    lines = ProgressLines(reporter, every=30)
    lines.clock = lambda: now[0]
    lines.start = lines.line_start = 0.0
    lines.pytest_xdist_node_collection_finished(None, ["a"] * 40)

    def test_done(at, width):
        now[0] = at
        for when in ("setup", "call", "teardown"):
            if when == "call":                  # the reporter wrote the test's letter
                reporter._tw.width_of_current_line = width
            lines.pytest_runtest_logreport(SimpleNamespace(when=when, passed=True))

    test_done(10, 1)
    test_done(29, 2)
    assert reporter.text == []
    test_done(95, 3)
    assert reporter.text == ["  3 of 40 tests done, 1m35s\n"]
    test_done(100, 1)               # a new line of dots
    test_done(120, 0)               # pytest ended it itself
    test_done(140, 1)
    assert len(reporter.text) == 1
    test_done(151, 2)               # 31 s after the line pytest ended
    assert reporter.text[-1] == "  7 of 40 tests done, 2m31s\n"

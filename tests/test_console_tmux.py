"""The job's console on a real 80-column terminal (tmux): every line on the screen is whole.

A bar that closed kept the tail of a longer line drawn there before (``...28.48
clients/s]``, ``reports/s]gs/s]``), the student bar shrank to one cell, long lines wrapped
into a wall, and Ray started for 10-30 s without a line. The screen is read back from
tmux's own history (``capture-pane -J``: a line the terminal wrapped comes back joined).
"""
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

COLUMNS = 80
STAMP = re.compile(r"^\[ *\d+\.\ds\] +\S")             # a progress or info line
CONTINUATION = re.compile(r"^ {11}\S")                # a long one, wrapped under its text
# a finished bar: its label, then the count and exactly one [time...] group, at the end of
# the line (a leftover tail of a longer line adds a second group or text after it)
BAR_LABELS = ("clients sealed", "messages into the shuffler", "reports opened",
              "student epochs")
BAR = re.compile(r"^  (%s): (\s*\d+%%\|[^\[\]]*\| \d+/\d+|\d+ \w+) \[[^\[\]]*\]$"
                 % "|".join(map(re.escape, BAR_LABELS)))
# Ray's own whole lines (a worker's forwarded line, a log record of Ray in the driver): not
# ours to wrap, but each starts a line of its own
FOREIGN = re.compile(r"^(\((raylet|\w+ pid=\d+)(, ip=[\d.]+)?\) |"
                     r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\s+[A-Z]+ )")
DONE = "JOB-EXIT="


def _tmux(socket, *args, **kwargs):
    return subprocess.run(["tmux", "-L", socket, *args], capture_output=True, text=True,
                          check=True, **kwargs)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (apt-get install tmux)")
def test_the_shuffle_jobs_console_at_80_columns_has_no_fragment_lines(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "TMUX", "COLUMNS", "LINES")}
    env.update(PYTHONPATH=os.getcwd(), RKNN_RAY_LEDGER=str(tmp_path / "ledger.sqlite"))
    out = tmp_path / "run"
    job = [sys.executable, "-m", "jobs.distill", "--config", "jobs/configs/digits_shuffle.yaml",
           "--out", str(out), "--set", "student.epochs=3", "--set", "student.trainer=local",
           "--set", "queries.restarts=1"]
    socket = f"rknn-console-{os.getpid()}"
    command = " ".join(map(_quote, job)) + f"; echo {DONE}$?; sleep 600"
    _tmux(socket, "-f", "/dev/null", "new-session", "-d", "-x", str(COLUMNS), "-y", "50",
          command, env=env, cwd=os.getcwd())
    try:
        deadline, screen = time.monotonic() + 600, ""
        while time.monotonic() < deadline:
            screen = _tmux(socket, "capture-pane", "-p", "-J", "-S", "-", "-t", "0").stdout
            if DONE in screen:
                break
            time.sleep(2)
        width = int(_tmux(socket, "display-message", "-p", "#{pane_width}").stdout)
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)
    lines = [line.rstrip() for line in screen.splitlines() if line.strip()]
    assert width == COLUMNS and f"{DONE}0" in lines, screen
    assert lines.index(f"{DONE}0") == len(lines) - 1
    # the job's lines on stdout (not progress, may be long): the run folder, the result and,
    # in the shuffle model, the local eps0 the clients ran at
    stdout = lines[-4:-1]
    assert stdout[0] == f"run folder: {out}" and stdout[1].startswith("shuffle/"), screen
    assert stdout[2].startswith("each client randomized its report at local eps0"), screen
    previous = None
    for line in lines[:-4]:
        if FOREIGN.match(line):
            previous = "foreign"
            continue
        if STAMP.match(line):
            kind = "line"
        elif CONTINUATION.match(line) and previous in ("line", "continuation"):
            kind = "continuation"
        elif BAR.match(line):
            kind = "bar"
        else:
            pytest.fail(f"a fragment line {line!r} on the screen:\n{screen}")
        # a line the terminal had to wrap comes back joined, longer than the screen
        assert len(line) <= COLUMNS, f"{line!r} wrapped on the terminal:\n{screen}"
        previous = kind
    starting = [i for i, text in enumerate(lines) if text.endswith("] starting Ray ...")]
    done = [i for i, text in enumerate(lines) if "] starting Ray done in " in text]
    assert starting and done and starting[0] < done[0], screen
    # the student's bar keeps a bar at 80 columns (it had one cell beside its metrics)
    assert any(re.match(r"  student epochs: 100%\|█{10,}\| 3/3 \[.*loss", line)
               for line in lines), screen
    bars = {m.group(1) for m in map(BAR.match, lines) if m}
    assert {"clients sealed", "reports opened", "student epochs"} <= bars, screen
    assert any(re.match(r"\[ *\d+\.\ds\] auto: s = ", line) for line in lines), screen
    assert (out / "report.json").exists()


def _quote(arg: str) -> str:
    import shlex
    return shlex.quote(str(arg))

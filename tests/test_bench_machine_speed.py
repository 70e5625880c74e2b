"""benchmarks.machine_speed: the table .ci/run prints first, its JSON, and its measure of how
much other load disturbed it."""
import json
import subprocess
import sys

import pytest

from benchmarks import machine_speed


def test_prints_the_table_and_writes_every_measure(tmp_path, capsys):
    out = tmp_path / "speed.json"
    assert machine_speed.main(["--repeats", "1", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("machine speed (") and "X25519" in printed and "syscall" in printed \
        and "+ ray" in printed
    row = json.loads(out.read_text())["rows"][0]
    for name in ("python_loop_ms", "sha256_mb_s", "x25519_us", "syscall_ns", "process_numpy_cpu_s",
                 "process_ray_cpu_s"):
        assert row[name] > 0, name
    # importing ray costs a new process more than importing numpy alone
    assert row["process_ray_cpu_s"] > row["process_numpy_cpu_s"]
    assert row["machine"].startswith(f"{__import__('os').cpu_count()} cores")


def test_a_busy_core_beside_it_shows_as_other_load():
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        row = machine_speed.measure(1)
    finally:
        spinner.kill()
        spinner.wait()
    assert row["busy_cores"] is not None and row["busy_cores"] > 0.3


def test_zero_repeats_is_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        machine_speed.main(["--repeats", "0"])
    assert err.value.code == 2
    assert "--repeats must be at least 1, got 0" in capsys.readouterr().err

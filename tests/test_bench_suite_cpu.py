"""benchmarks.suite_cpu: the kernel's accounting records read back, processes named by kind,
and a real accounted run that finds a child's CPU under its own kind."""
import json
import struct
import sys

import pytest

from benchmarks import suite_cpu


def _record(pid, ppid, start, utime, stime, comm, version=3):
    return struct.pack("<BBHIIIIIIf8H16s", 0, version, 0, 0, 0, 0, pid, ppid, start, 0.0,
                       utime, stime, 0, 0, 0, 0, 0, 0, comm.encode())


def test_comp_t_is_a_mantissa_times_a_power_of_eight():
    assert suite_cpu.comp_t(0) == 0
    assert suite_cpu.comp_t(0x1FFF) == 8191                   # exponent 0: the mantissa
    assert suite_cpu.comp_t((1 << 13) | 5) == 40               # 5 * 8
    assert suite_cpu.comp_t((3 << 13) | 100) == 100 * 8 ** 3


def test_records_give_pid_start_cpu_and_name(tmp_path):
    path = tmp_path / "acct"
    path.write_bytes(_record(41, 1, 1_700_000_000, 250, (1 << 13) | 10, "raylet")
                     + _record(42, 41, 1_700_000_003, 0, 0, "a-name-of-16-chr"))
    first, second = suite_cpu.read_records(str(path))
    assert first == {"pid": 41, "ppid": 1, "start": 1_700_000_000, "cpu": (250 + 80) / 100,
                     "comm": "raylet"}
    assert second["comm"] == "a-name-of-16-chr" and second["cpu"] == 0.0


def test_a_file_of_another_format_is_refused_by_name(tmp_path):
    path = tmp_path / "acct"
    path.write_bytes(_record(41, 1, 0, 0, 0, "x", version=2))
    with pytest.raises(ValueError, match=r"acct: record 0 is not a v3 accounting record"):
        suite_cpu.read_records(str(path))


@pytest.mark.parametrize("cmdline, comm, expected", [
    ("ray::ClientShardImpl.prepare", "python", "ray actor: ClientShardImpl"),
    ("ray::ServerImpl", "python", "ray actor: ServerImpl"),
    ("ray::IDLE", "python", "ray worker, idle"),
    ("ray::DashboardAgent", "python", "ray daemon: dashboard agent"),
    ("/x/ray/core/src/ray/gcs/gcs_server --log_dir=/tmp", "gcs_server", "ray daemon: GCS"),
    ("/x/ray/core/src/ray/raylet/raylet --node_id=1", "raylet", "ray daemon: raylet"),
    ("/usr/bin/python3.11 -u /x/ray/_private/log_monitor.py --session-dir=/s", "python",
     "ray daemon: log monitor"),
    ("/usr/bin/python /w/actors/worker_zygote.py /tmp/f", "python",
     "ray worker parent (actors/worker_zygote.py)"),
    ("/usr/bin/python -u -c import sys;exec(eval(sys.stdin.readline()))", "python",
     "pytest-xdist worker (the tests' own code)"),
    ("/usr/bin/python3.11 -m jobs.distill --config x.yaml", "python", "python -m jobs.distill"),
    ("/usr/bin/python -c print(1)", "python", "python -c (a party or a probe)"),
    ("/usr/bin/python -B -c from x import y", "python", "python -c (a party or a probe)"),
    ("/usr/bin/python /tmp/tool.py --flag", "python", "python tool.py"),
    ("/usr/lib/chromium/chromium --type=renderer", "chromium", "chromium"),
    (None, "sh", "(unseen) sh"),
])
def test_kinds(cmdline, comm, expected):
    assert suite_cpu.kind(cmdline, comm) == expected


def test_nothing_after_the_separator_is_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        suite_cpu.main(["--"])
    assert err.value.code == 2
    assert "nothing after --" in capsys.readouterr().err


def test_a_run_inside_another_is_refused(monkeypatch, capsys):
    monkeypatch.setenv(suite_cpu.NESTED_ENV, "/tmp/elsewhere")
    assert suite_cpu.main(["--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: a run of benchmarks.suite_cpu is already accounting") \
        and "Fix:" in err


@pytest.mark.skipif(suite_cpu.check_can_account() is not None,
                    reason=f"no process accounting here: {suite_cpu.check_can_account()}")
def test_a_childs_cpu_is_found_under_its_own_kind(tmp_path, capsys):
    """A command whose child (a script of its own name) spins ~0.5 CPU s and lives past a
    look at /proc: that CPU is in the child's row. (Accounting is machine-wide: the other
    xdist worker's processes may share the other rows.)"""
    burner = tmp_path / "burner.py"
    burner.write_text("import time\nend = time.process_time() + 0.5\n"
                      "while time.process_time() < end:\n    pass\ntime.sleep(0.6)\n")
    out = tmp_path / "cpu.json"
    code = f"import subprocess, sys; subprocess.run([sys.executable, {str(burner)!r}])"
    assert suite_cpu.main(["--json", str(out), "--", sys.executable, "-c", code]) == 0
    result = json.loads(out.read_text())
    rows = {r["kind"]: r for r in result["rows"]}
    assert rows["python burner.py"]["processes"] == 1
    assert 0.45 <= rows["python burner.py"]["cpu_s"] <= 1.5, rows
    assert result["exit_code"] == 0 and result["wall_s"] >= 1.0
    assert abs(sum(r["share"] for r in result["rows"]) - 1.0) < 0.01
    assert "python burner.py" in capsys.readouterr().out


@pytest.mark.skipif(suite_cpu.check_can_account() is not None,
                    reason=f"no process accounting here: {suite_cpu.check_can_account()}")
@pytest.mark.parametrize("ignores_sigterm", [False, True])
def test_a_sigterm_stops_the_command_and_leaves_no_file(tmp_path, ignores_sigterm):
    """SIGTERM to the tool, or to its whole process group (a CI runner's stop): the command
    it runs is stopped (killed after --stop-wait if it ignores SIGTERM), its accounting file
    goes, and it exits as interrupted, not with a value."""
    import os
    import signal
    import subprocess
    import time
    marker = tmp_path / "pid"
    code = ("import os, signal, time; "
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if ignores_sigterm else "")
            + f"open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(120)")
    tool = subprocess.Popen([sys.executable, "-m", "benchmarks.suite_cpu", "--stop-wait", "2",
                             "--", sys.executable, "-c", code],
                            env={**os.environ, "TMPDIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    while not (marker.exists() and marker.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    sleeper = int(marker.read_text())
    if ignores_sigterm:     # the whole group, as a CI runner stops a job: the child shrugs it off
        os.killpg(tool.pid, signal.SIGTERM)
    else:
        tool.send_signal(signal.SIGTERM)
    out = tool.communicate(timeout=60)[0]
    assert tool.returncode == 130 and "CPU by kind" not in out and "Traceback" not in out, out
    assert out.strip().endswith("accounting is off, nothing was written"), out
    time.sleep(0.5)
    assert not os.path.exists(f"/proc/{sleeper}") or \
        open(f"/proc/{sleeper}/stat").read().split()[2] == "Z"
    assert not [p for p in os.listdir(tmp_path) if p.startswith("rknn-ray-suite-cpu-")]

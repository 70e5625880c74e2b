"""Where a command's CPU goes, by kind of process: the test suite's, by default.

    sudo python -m benchmarks.suite_cpu [--json OUT] [--top 40] [-- COMMAND ...]

Why: the suite's wall time is its CPU divided by the cores (it keeps both busy), so cutting
it means knowing which processes spend that CPU. A per-test clock sees only the test's own
process and the children it waits for; Ray's daemons, actors and forked workers are reaped
by others. The kernel's process accounting (``accton``, package ``acct``) writes one record
for every process that ends, whoever reaps it; this joins those records with the command
lines seen under /proc while the command ran, and sums CPU by kind (a Ray daemon, an actor
class, a ``python -m`` module, a pytest-xdist worker, ...).

Counted: every process that started during the run and ended before its last second, on a
machine doing nothing else the command's own. A process too short-lived to be seen under
/proc is named by its kernel command name (``(unseen) comm``). Needs root (accounting is
machine-wide) and ``accton``; the default command is the README's test command. It turns
accounting off when done: a machine that was accounting on its own (acct's service) needs
``accton on`` again.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time

README_TESTS = [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "tests"]
#: set for the command run: a test of this tool inside it must not move the accounting file
NESTED_ENV = "RKNN_RAY_SUITE_CPU"

# struct acct_v3 (linux/acct.h): flag, version, tty, exitcode, uid, gid, pid, ppid, btime,
# etime (float), utime, stime, mem, io, rw, minflt, majflt, swaps (comp_t), comm[16]
_V3 = struct.Struct("<BBHIIIIIIf8H16s")
AHZ = 100                      # accounting ticks per second (comp_t times)
START_SLACK_S = 5              # /proc's start and the accounting record's may differ this much
STOP_WAIT_S = 30.0             # an interrupted command's time to end after SIGTERM, then SIGKILL


def comp_t(value: int) -> int:
    """A comp_t's value: a 13-bit mantissa times 8 to the power of a 3-bit exponent."""
    return (value & 0x1FFF) << (3 * ((value >> 13) & 0x7))


def read_records(path: str) -> list[dict]:
    """The v3 records of an accounting file: pid, ppid, start (epoch s), cpu (s), comm."""
    with open(path, "rb") as fh:
        data = fh.read()
    out = []
    for off in range(0, len(data) - _V3.size + 1, _V3.size):
        f = _V3.unpack_from(data, off)
        if f[1] & 0x0F != 3:
            raise ValueError(f"{path}: record {off // _V3.size} is not a v3 accounting record")
        out.append({"pid": f[6], "ppid": f[7], "start": f[8],
                    "cpu": (comp_t(f[10]) + comp_t(f[11])) / AHZ,
                    "comm": f[18].split(b"\0", 1)[0].decode(errors="replace")})
    return out


#: Ray's own processes that are not actors, by their title (ray::NAME) or script
_DAEMONS = (("gcs_server", "ray daemon: GCS"), ("/raylet", "ray daemon: raylet"),
            ("ray::DashboardAgent", "ray daemon: dashboard agent"),
            ("dashboard/agent.py", "ray daemon: dashboard agent"),
            ("ray::RuntimeEnvAgent", "ray daemon: runtime env agent"),
            ("runtime_env/agent", "ray daemon: runtime env agent"),
            ("log_monitor.py", "ray daemon: log monitor"),
            ("dashboard/dashboard.py", "ray daemon: dashboard (API server)"),
            ("autoscaler/_private/monitor.py", "ray daemon: autoscaler monitor"),
            ("worker_zygote", "ray worker parent (actors/worker_zygote.py)"),
            ("worker_fork", "ray worker launcher (actors/worker_fork.py)"))


def kind(cmdline: str | None, comm: str) -> str:
    """A process's kind from its last command line seen (Ray retitles its workers)."""
    if not cmdline:
        return f"(unseen) {comm}"
    for needle, name in _DAEMONS:
        if needle in cmdline:
            return name
    if cmdline.startswith("ray::"):
        name = re.split(r"[.\s]", cmdline[5:], 1)[0]
        return "ray worker, idle" if name == "IDLE" else f"ray actor: {name}"
    if "exec(eval(sys.stdin" in cmdline:
        return "pytest-xdist worker (the tests' own code)"
    words = cmdline.split()
    exe = os.path.basename(words[0]) if words else comm
    if m := re.search(r"(?:^|\s)-m\s+(\S+)", cmdline):
        return f"{exe.rstrip('0123456789.')} -m {m.group(1)}"
    if re.match(r"python[0-9.]*$", exe) and len(words) > 1:
        if words[1] == "-c" or (words[1].startswith("-") and "-c" in words[1:3]):
            return "python -c (a party or a probe)"
        script = next((w for w in words[1:] if not w.startswith("-")), "")
        return f"python {os.path.basename(script)}"
    return exe


class Sampler(threading.Thread):
    """Command lines under /proc every ``every`` s: pid -> {start second: last one seen}.

    The start is kept to tell a reused pid apart; /proc's boot time and the accounting
    clock may disagree by a few seconds (a VM's), so a record takes the nearest start of
    its pid within :data:`START_SLACK_S`."""

    def __init__(self, every: float = 0.2):
        super().__init__(daemon=True, name="proc-sampler")
        self.every, self.seen, self.stopping = every, {}, threading.Event()
        self.boot = _boot_time()
        self.tick = os.sysconf("SC_CLK_TCK")

    def run(self):
        while not self.stopping.wait(self.every):
            self.sample()

    def sample(self):
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    stat = fh.read()
                with open(f"/proc/{name}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue                      # ended between the listing and the read
            started = self.boot + int(stat.rsplit(b")", 1)[1].split()[19]) // self.tick
            if cmd:
                self.seen.setdefault(int(name), {})[started] = cmd[:300]

    def cmdline(self, pid: int, start: int) -> str | None:
        starts = self.seen.get(pid, {})
        near = min(starts, key=lambda s: abs(s - start), default=None)
        return starts[near] if near is not None and abs(near - start) <= START_SLACK_S else None


def _boot_time() -> int:
    with open("/proc/stat") as fh:
        for line in fh:
            if line.startswith("btime"):
                return int(line.split()[1])
    raise OSError("/proc/stat has no btime")


def summarize(records: list[dict], sampler: Sampler, since: float) -> list[dict]:
    """Rows by kind, most CPU first, for the processes that started at or after ``since``."""
    by = collections.defaultdict(lambda: [0.0, 0])
    for r in records:
        if r["start"] < int(since) - START_SLACK_S:
            continue
        b = by[kind(sampler.cmdline(r["pid"], r["start"]), r["comm"])]
        b[0] += r["cpu"]
        b[1] += 1
    total = sum(cpu for cpu, _ in by.values()) or 1.0
    return [{"kind": k, "processes": n, "cpu_s": round(cpu, 2), "cpu_s_each": round(cpu / n, 3),
             "share": round(cpu / total, 4)}
            for k, (cpu, n) in sorted(by.items(), key=lambda kv: -kv[1][0])]


def table(result: dict, top: int) -> str:
    rows = result["rows"]
    busy = result["cpu_s"] / max(result["wall_s"], 1e-9)
    lines = [f"CPU by kind of process: {' '.join(result['command'])}",
             f"  {result['wall_s']:.0f} s wall, {result['cpu_s']:.0f} CPU s in "
             f"{result['processes']} processes ({busy:.2f} cores busy on average), "
             f"exit {result['exit_code']}",
             f"  {'kind':58s} {'procs':>6s} {'CPU s':>8s} {'each':>7s} {'share':>6s}"]
    for r in rows[:top]:
        lines.append(f"  {r['kind'][:58]:58s} {r['processes']:6d} {r['cpu_s']:8.1f} "
                     f"{r['cpu_s_each']:7.2f} {100 * r['share']:5.1f}%")
    rest = rows[top:]
    if rest:
        cpu = sum(r["cpu_s"] for r in rest)
        lines.append(f"  {'(' + str(len(rest)) + ' more kinds)':58s} "
                     f"{sum(r['processes'] for r in rest):6d} {cpu:8.1f} {'':7s} "
                     f"{100 * sum(r['share'] for r in rest):5.1f}%")
    return "\n".join(lines)


def check_can_account() -> str | None:
    """None, or why this machine cannot account processes here (one line with its fix)."""
    if os.environ.get(NESTED_ENV):
        return ("a run of benchmarks.suite_cpu is already accounting this machine. Fix: run it "
                "once at a time")
    if not sys.platform.startswith("linux"):
        return "process accounting is Linux's. Fix: run it on Linux"
    if shutil.which("accton") is None:
        return "accton is not installed. Fix: apt-get install -y acct"
    if os.geteuid() != 0:
        return "process accounting needs root (it is machine-wide). Fix: run it as root"
    return None


def _interrupted(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def account(command: list[str], every: float = 0.2, stop_wait: float = STOP_WAIT_S) -> dict:
    """Run ``command`` with process accounting on; its CPU by kind of process."""
    folder = tempfile.mkdtemp(prefix="rknn-ray-suite-cpu-")
    try:
        path = os.path.join(folder, "acct")
        open(path, "wb").close()
        sampler = Sampler(every)
        since, started = time.time(), time.perf_counter()
        code, ended = _run_accounted(command, path, sampler, stop_wait)
        records = read_records(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows = summarize(records, sampler, since)
    return {"benchmark": "suite_cpu", "command": command, "exit_code": code,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "wall_s": round(ended - started, 1), "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
            "processes": sum(r["processes"] for r in rows), "rows": rows}


def _run_accounted(command: list[str], path: str, sampler: Sampler,
                   stop_wait: float) -> tuple[int, float]:
    """(exit code, perf_counter at its end) of ``command`` run with accounting into ``path``.
    A SIGTERM ends it as Ctrl-C does: the command is sent SIGTERM (killed if it is still
    there ``stop_wait`` s later) and accounting turned off."""
    subprocess.run(["accton", path], check=True, stdout=subprocess.DEVNULL)
    before = signal.signal(signal.SIGTERM, _interrupted)
    try:
        sampler.start()
        child = subprocess.Popen(command, env={**os.environ, NESTED_ENV: path})
        try:
            code = child.wait()
        except BaseException:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=stop_wait)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            raise
        ended = time.perf_counter()
        time.sleep(1.0)                       # the last exits reach the file
        sampler.sample()
        return code, ended
    finally:
        subprocess.run(["accton", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sampler.stopping.set()
        signal.signal(signal.SIGTERM, before)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[argv.index("--") + 1:] if "--" in argv else None
    ap = argparse.ArgumentParser(prog="python -m benchmarks.suite_cpu",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="also write the rows to this JSON file")
    ap.add_argument("--top", type=int, default=40, help="kinds shown (the rest in one line)")
    ap.add_argument("--every", type=float, default=0.2, help="seconds between looks at /proc")
    ap.add_argument("--stop-wait", type=float, default=STOP_WAIT_S,
                    help="seconds an interrupted command gets after SIGTERM before SIGKILL")
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if command == []:
        ap.error("nothing after --: name the command to account (default: the README's tests)")
    why = check_can_account()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 2
    try:
        result = account(command or README_TESTS, args.every, args.stop_wait)
    except KeyboardInterrupt:
        print("interrupted: the command was stopped, accounting is off, nothing was written",
              file=sys.stderr)
        return 130
    print(table(result, args.top), flush=True)
    if args.json:
        from rknn_ray.runio import write_json  # defers the project's I/O helpers to --json
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

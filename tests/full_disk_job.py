"""A job whose run folder is on a real, small file system that is full when the student is
saved (tests/test_edge_probes_release.py runs it under ``unshare``).

    python tests/full_disk_job.py MOUNT RESULT.json

Mounts a 4 MiB tmpfs on MOUNT (in this process's own mount namespace: nothing outside sees
it) and runs ``jobs.distill`` with ``--out MOUNT/run`` three times, filling the file system
to its last 16 KiB as the student starts (the release, config.yaml and the ledger are on
disk by then; the ledger lives outside MOUNT):

* ``ray``: the job, its student on Ray Train (a Train checkpoint cannot be written);
* ``local``: ``--resume`` with the student trained in the driver (student.pt cannot be
  written);
* then the space is freed and the run resumed once more.

After each of the first two it lists what the run folder holds. One process and one Ray
(started here, joined by the three) for both trainers: a process and a Ray start per
trainer proved nothing more. What happened goes to RESULT.json.
"""
import json
import os
import subprocess
import sys

LEAVE = 16 * 1024


def main() -> int:
    mount, result_path = sys.argv[1:3]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], check=True)
    import ray

    import rknn_ray.job.finish as finish
    from jobs.distill import main as distill
    from rknn_ray.job.ray_env import ensure_ray

    real_fit = finish.fit_student
    filler = os.path.join(mount, "filler")
    armed = []                   # one fill per armed attempt

    def fill_then_fit(*args, **kwargs):
        if armed:
            armed.pop()
            st = os.statvfs(mount)
            with open(filler, "ab") as fh:
                fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - LEAVE))
        return real_fit(*args, **kwargs)
    finish.fit_student = fill_then_fit      # the name the job layer calls
    run = os.path.join(mount, "run")
    ensure_ray(num_cpus=2, log_to_driver=False)
    attempts = {
        "ray": ["--config", "jobs/configs/digits_central.yaml", "--out", run, "--quiet",
                "--set", "student.epochs=1", "--set", "queries.restarts=1",
                "--set", "student.trainer=ray"],
        "local": ["--resume", run, "--quiet", "--set", "student.trainer=local"]}
    out = {}
    for trainer, argv in attempts.items():
        armed.append(True)
        print(f"ATTEMPT {trainer}", flush=True)
        got = {"code": distill(argv)}
        got["files"] = sorted(os.path.relpath(os.path.join(r, f), run)
                              for r, _, files in os.walk(run) for f in files)
        with open(os.path.join(run, "incomplete.json")) as fh:
            got["incomplete"] = json.load(fh)
        out[trainer] = got
    os.unlink(filler)
    print("RESUMING", flush=True)
    out["resume_code"] = distill(["--resume", run, "--quiet", "--set", "student.trainer=local"])
    out["resumed"] = sorted(os.listdir(run))
    ray.shutdown()
    with open(result_path, "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

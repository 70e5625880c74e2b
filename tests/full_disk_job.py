"""A job whose run folder is on a real, small file system that is full when the student is
saved (tests/test_edge_probes_release.py runs it under ``unshare``).

    python tests/full_disk_job.py MOUNT RESULT.json TRAINER

Mounts a 4 MiB tmpfs on MOUNT (in this process's own mount namespace: nothing outside sees
it), runs ``jobs.distill`` with ``--out MOUNT/run`` and ``student.trainer=TRAINER``, and
fills the file system to its last 16 KiB as the student starts (the release, config.yaml
and the ledger are on disk by then; the ledger lives outside MOUNT). Then it lists what the
run folder holds, frees the space and resumes the run. What happened goes to RESULT.json.
"""
import json
import os
import subprocess
import sys

LEAVE = 16 * 1024


def main() -> int:
    mount, result_path, trainer = sys.argv[1:4]
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mount], check=True)
    import rknn_ray.job.finish as finish
    from jobs.distill import main as distill

    real_fit = finish.fit_student
    filler = os.path.join(mount, "filler")
    armed = [True]               # the first job only

    def fill_then_fit(*args, **kwargs):
        if armed:
            armed.clear()
            st = os.statvfs(mount)
            with open(filler, "wb") as fh:
                fh.write(b"\0" * max(0, st.f_bavail * st.f_frsize - LEAVE))
        return real_fit(*args, **kwargs)
    finish.fit_student = fill_then_fit      # the name the job layer calls
    run = os.path.join(mount, "run")
    out = {"code": distill(["--config", "jobs/configs/digits_central.yaml", "--out", run,
                            "--quiet", "--set", "student.epochs=1", "--set", "queries.restarts=1",
                            "--set", f"student.trainer={trainer}"])}
    out["files"] = sorted(os.path.relpath(os.path.join(r, f), run)
                          for r, _, files in os.walk(run) for f in files)
    with open(os.path.join(run, "incomplete.json")) as fh:
        out["incomplete"] = json.load(fh)
    os.unlink(filler)
    print("RESUMING", flush=True)
    out["resume_code"] = distill(["--resume", run, "--quiet", "--set", "student.trainer=local"])
    out["resumed"] = sorted(os.listdir(run))
    with open(result_path, "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    sys.exit(main())

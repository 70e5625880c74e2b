"""Command lines of a small real ``jobs.distill`` run, shared by the edge-probe modules."""
import os

#: a real job, cut to what a probe needs (one epoch, one k-means restart)
FAST = ["student.epochs=1", "queries.restarts=1"]


def distill_args(config: str, out, *overrides, extra=()) -> list[str]:
    """``--config jobs/configs/CONFIG --out OUT --quiet`` with FAST and ``overrides`` set (an
    absolute CONFIG: that file)."""
    path = str(config) if os.path.isabs(str(config)) else f"jobs/configs/{config}"
    args = ["--config", path, "--out", str(out), "--quiet", *extra]
    for o in [*FAST, *overrides]:
        args += ["--set", o]
    return args

"""Command lines of a small real ``jobs.distill`` run, shared by the edge-probe modules."""

#: a real job, cut to what a probe needs (one epoch, one k-means restart)
FAST = ["student.epochs=1", "queries.restarts=1"]


def distill_args(config: str, out, *overrides, extra=()) -> list[str]:
    """``--config jobs/configs/CONFIG --out OUT --quiet`` with FAST and ``overrides`` set."""
    args = ["--config", f"jobs/configs/{config}", "--out", str(out), "--quiet", *extra]
    for o in [*FAST, *overrides]:
        args += ["--set", o]
    return args

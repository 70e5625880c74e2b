"""Record-level private knowledge distillation, end to end on Ray.

    python -m jobs.distill --config jobs/configs/digits_central.yaml \
        [--set privacy.eps=0.5 ...] [--out runs/my-run] [--overwrite]

Works locally (starts a loopback Ray instance) and under ``ray job submit`` (joins
the cluster through RAY_ADDRESS). Writes a run folder: config.yaml, report.json,
ledger.json, labels.parquet, student.pt and summary.png. The job itself is
:func:`rknn_ray.job.run` (the orchestration layer); this module is the command line: its
arguments, the console, the exit codes and incomplete.json after a failure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from rknn_ray.config import load_config, validate_resources
from rknn_ray.errors import ConfigError, RknnError, first_line
from rknn_ray.job.rounds import ReleaseNotSaved
from rknn_ray.job.session import CoverShortfall
from rknn_ray.runio import mark_incomplete, prepare_run_dir

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "digits_central.yaml")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="YAML config (jobs/configs/*.yaml)")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config value, e.g. --set privacy.eps=0.5 (repeatable)")
    ap.add_argument("--out", default=None, help="run folder (default runs/<name>-<time>)")
    ap.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    ap.add_argument("--discard-release", action="store_true",
                    help="with --overwrite: also delete an unfinished run's saved release.npz "
                         "(its budget stays spent; --resume RUN would have finished it)")
    ap.add_argument("--resume", metavar="RUN", default=None,
                    help="finish a run folder whose release.npz exists (labels, student, report) "
                         "with its own config.yaml: no new private round, no budget spent; "
                         "--set may change student.*, labels.*, cluster.*, run.progress only")
    ap.add_argument("--key-file", default=None,
                    help="server X25519 key file (default: a fresh key pair per job)")
    ap.add_argument("--quiet", action="store_true",
                    help="no progress bars: plain stage lines, at most one progress line per 5 s "
                         "(without a terminal this is the default; run.progress=false: silent)")
    ap.add_argument("--insecure-seeded", action="store_true",
                    help="allow run.rng=seeded: a reproducible simulation that is NOT private "
                         "(every secret and the noise follow from run.seed)")
    ap.add_argument("--ledger", default=None,
                    help="privacy ledger (SQLite) that keeps each dataset's budget across jobs "
                         "(default: $RKNN_RAY_LEDGER or ~/.local/share/rknn-ray/ledger.sqlite)")
    return ap.parse_args(argv)


def run(cfg, out_dir: str, key_file: str | None = None, progress=None,
        ledger_path: str | None = None, resume: bool = False, parties=None) -> dict:
    """The job (:func:`rknn_ray.job.run`) for a validated ``cfg`` into the prepared
    ``out_dir``, with this process's signal handling; returns the report."""
    from rknn_ray.job import run as run_job
    return run_job(cfg, out_dir, key_file=key_file, progress=progress, ledger_path=ledger_path,
                   resume=resume, parties=parties, start_ray=_start_ray).report


def _start_ray() -> bool:
    """ensure_ray, then the job's own SIGINT/SIGTERM handlers again (ray.init installs its own)."""
    from jobs import signals
    from rknn_ray.job.ray_env import ensure_ray
    try:
        started = ensure_ray()             # one Ray for the whole job, after the budget check
    except SystemExit as exc:              # Ray's own SIGTERM handler, while ray.init runs
        if exc.code == signals.signal.SIGTERM:
            raise signals.JobInterrupted(signals.signal.SIGTERM) from None
        raise
    signals.install()
    return started


def check_rng_consent(cfg, insecure_seeded: bool) -> None:
    """A seeded run is predictable: it runs only when the command line says so, and says so."""
    from rknn_ray.rng import NOT_PRIVATE
    if cfg.run.rng != "seeded":
        return
    if not insecure_seeded:
        raise ConfigError("run.rng", "'seeded' makes every client secret and the server's noise "
                          "predictable from run.seed: the release would not be private",
                          "use run.rng=secure (the default), or add --insecure-seeded to run a "
                          "reproducible simulation that is marked NOT PRIVATE everywhere")
    print(f"WARNING: {NOT_PRIVATE}", file=sys.stderr)


#: what ``--resume RUN --set key=value`` may change: work after the release only (the
#: labels are post-processing of the released counts, the student is trained on them).
#: Everything else decides what was released, and report.json must agree with release.npz.
RESUME_MAY_CHANGE = ("student.", "labels.", "cluster.", "run.progress")


def check_resume_overrides(saved, cfg) -> None:
    """Refuse ``--set`` keys that would change the meaning of a finished release."""
    before, after = _leaves(saved.to_dict()), _leaves(cfg.to_dict())
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    refused = [k for k in changed if not k.startswith(RESUME_MAY_CHANGE)]
    if refused:
        raise ConfigError("--resume", f"--set {', '.join(refused)} would change what the saved "
                          "release means (it was released with the run folder's config.yaml)",
                          "resume changes only student.*, labels.*, cluster.* and run.progress; "
                          "start a new run (a new release, new budget) for anything else")


def _leaves(d: dict, prefix: str = "") -> dict:
    """{"a.b": value} for every leaf of a nested config dict."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _one_line(exc: BaseException) -> str:
    """A failure as one line: an error raised in a Ray actor as itself, not Ray's wrapping."""
    cause = getattr(exc, "cause", None)
    if cause is not None and type(exc).__module__.startswith("ray"):
        exc = cause
    if isinstance(exc, RknnError):
        text = str(exc).strip()
        return text.splitlines()[0] if text else type(exc).__name__
    from rknn_ray.errors import NO_SPACE
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"out of disk space{where} ({exc.strerror}). Fix: free space and re-run"
    if "database or disk is full" in str(exc):
        return f"out of disk space ({exc}). Fix: free space on the ledger's file system"
    return f"the job failed: {type(exc).__name__}: {first_line(exc)}"


def main(argv=None) -> int:
    from jobs import signals
    with signals.handled():
        return _main(parse_args(argv))


def _main(args) -> int:
    from jobs import signals
    out, owned = None, False            # owned: this invocation may write into ``out``
    created = False
    try:
        if args.resume:
            out = os.path.abspath(args.resume)
            if not os.path.isfile(os.path.join(out, "release.npz")):
                raise ConfigError("--resume", f"{out} has no release.npz",
                                  "resume a run folder whose private round finished")
            if os.path.exists(os.path.join(out, "report.json")):
                raise ConfigError("--resume", f"{out} is already complete (report.json)",
                                  "nothing to resume; start a new run instead")
            saved = load_config(os.path.join(out, "config.yaml"))
            cfg = load_config(os.path.join(out, "config.yaml"), args.overrides)
            check_resume_overrides(saved, cfg)
        else:
            cfg = load_config(args.config, args.overrides)
        check_rng_consent(cfg, args.insecure_seeded)
        if not os.environ.get("RAY_ADDRESS"):       # a local instance: its CPUs are ours to count
            validate_resources(cfg, float(os.cpu_count() or 1))
        if args.key_file:
            from server.keys import check_key_file
            check_key_file(args.key_file, load=True)
        if not args.resume:
            out = args.out or os.path.join("runs", f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            created = not os.path.exists(out)
            out = prepare_run_dir(out, overwrite=args.overwrite,
                                  discard_release=args.discard_release)
        owned = True
        from rknn_ray.job.progress import Progress
        progress = Progress.for_console(cfg.run.progress, quiet=args.quiet)
        report = run(cfg, out, key_file=args.key_file, ledger_path=args.ledger,
                     resume=bool(args.resume), progress=progress)
    except (KeyboardInterrupt, Exception) as exc:
        interrupt = signals.as_interrupt(exc)
        if interrupt is not None:
            stage = _stage_words(locals().get("progress"))
            message = f"interrupted by {interrupt.name}" + (f" during {stage}" if stage else "")
        else:
            message = _one_line(exc)
        line = f"error: {message}"
        if owned and out and os.path.isdir(out):
            if created and not os.listdir(out):
                os.rmdir(out)                 # leave no empty run folder behind
            elif not os.path.exists(os.path.join(out, "report.json")):
                line += "; " + _record_incomplete(out, message, exc)
        print(line, file=sys.stderr)
        if interrupt is not None:
            return interrupt.exit_code
        if not isinstance(exc, RknnError) and _one_line(exc).startswith("the job failed"):
            raise
        return 2
    acc, p = report["accuracy"], report["privacy"]
    print(f"run folder: {out}")
    if not p.get("private", True):
        print(f"NOT PRIVATE: {p['warning']}")
    print(f"{p['model']}/{p['mechanism']} eps={p['eps']:.4g} delta={p['delta']:.3g} "
          f"({p['unit']}-level, {p['neighbour']}): label accuracy {acc['labels']:.4f}, "
          f"student accuracy {acc['student']:.4f}")
    if "diagnostics" in report:
        print(f"[diagnostics, NOT private: {out}/diagnostics] non-private label accuracy "
              f"{report['diagnostics']['nonprivate_labels']:.4f}")
    return 0


def _stage_words(progress) -> str | None:
    """The stage a failure left, in words ("round_0" is the first private round)."""
    stage = progress and (progress.failed_in or progress.current)
    if stage and stage.startswith("round_"):
        return f"private round {int(stage.split('_')[1]) + 1}"
    return stage or None


def _record_incomplete(out: str, message: str, exc: BaseException) -> str:
    """Write incomplete.json (what happened, whether a release is saved, the next step);
    returns the rest of the console line. A full disk here costs one clause, not a traceback."""
    released = os.path.exists(os.path.join(out, "release.npz"))
    lost = isinstance(exc, ReleaseNotSaved)
    if released and not lost:
        next_step, said = (f"python -m jobs.distill --resume {out}",
                           f"run folder {out} is marked incomplete; its release is saved: finish "
                           f"it with --resume {out}")
    elif lost:
        next_step, said = ("free disk space; the lost release stays counted in the ledger",
                           f"run folder {out} is marked incomplete; the release was NOT saved "
                           "(its eps is counted in the ledger)")
    elif isinstance(exc, CoverShortfall):      # the server saw the reports: spent, but no counts out
        next_step, said = ("no counts were released and the round's eps stays counted in the "
                           "ledger; re-run as the reason says",
                           f"run folder {out} is marked incomplete; no counts were released (the "
                           "round was refused for labelling; its eps is counted in the ledger)")
    else:
        next_step, said = ("nothing was released; fix the cause and re-run",
                           f"run folder {out} is marked incomplete; nothing was released")
    earlier = {}
    try:                        # a failed --resume keeps the first failure's reason beside its own
        with open(os.path.join(out, "incomplete.json")) as fh:
            old = json.load(fh)
        if isinstance(old, dict) and old.get("reason"):
            earlier = {"earlier_reasons": [*old.get("earlier_reasons", []), old["reason"]][-5:]}
    except (OSError, ValueError):
        pass
    try:
        mark_incomplete(out, message, release_saved=released and not lost,
                        released_and_lost=lost, next_step=next_step, **earlier)
    except OSError as werr:
        return said.replace(" is marked incomplete", "") + \
            f" (incomplete.json could not be written: {werr.strerror or werr})"
    return said + " (incomplete.json)"


if __name__ == "__main__":
    sys.exit(main())

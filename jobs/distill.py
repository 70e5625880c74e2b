"""Record-level private knowledge distillation, end to end on Ray.

    rknn-ray run --config digits_central [--set privacy.eps=0.5 ...] [--out runs/my-run]
    python -m jobs.distill --config jobs/configs/digits_central.yaml ...   (the same)

Works locally (starts a loopback Ray instance) and under ``ray job submit`` (joins
the cluster through RAY_ADDRESS). Writes a run folder: config.yaml, report.json,
ledger.json, labels.parquet, student.pt and summary.png. The job itself is
:func:`rknn_ray.job.run` (the orchestration layer); this module is the command line: its
arguments, the console, the exit codes and incomplete.json after a failure.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from jobs import signals
from jobs.config_files import list_configs

# the job layer (Ray, torch, the accountants: ~2-5 s) is imported where it is used, after the
# arguments are parsed: --help and --list-configs answer in well under a second

DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), "configs", "digits_central.yaml")

EXAMPLES = """\
examples:
  rknn-ray run --config digits_central --set privacy.eps=0.5 --out runs/eps05
  rknn-ray run --config my.yaml --set student.epochs=5 --quiet
  rknn-ray run --resume runs/eps05          # finish a run whose release.npz is saved
  rknn-ray run --list-configs
  python -m jobs.distill --config digits_central   # the same job (ray job submit runs this)"""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="rknn-ray run", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=DEFAULT_CONFIG,
                    help="a YAML file, or a packaged config by name (digits_central; "
                         "--list-configs lists them)")
    ap.add_argument("--list-configs", action="store_true",
                    help="list the packaged configs with a line on each, and exit")
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
        ledger_path: str | None = None, resume: bool = False, parties=None,
        replace_old_run: bool = False) -> dict:
    """The job (:func:`rknn_ray.job.run`) for a validated ``cfg`` into the prepared
    ``out_dir``, with this process's signal handling; returns the report."""
    from rknn_ray.job import run as run_job         # deferred: Ray, torch (module comment)
    return run_job(cfg, out_dir, key_file=key_file, progress=progress, ledger_path=ledger_path,
                   resume=resume, parties=parties, start_ray=_start_ray,
                   replace_old_run=replace_old_run).report


def _start_ray() -> bool:
    """ensure_ray, then the job's own SIGINT/SIGTERM handlers again (ray.init installs its own)."""
    from rknn_ray.job.ray_env import ensure_ray     # deferred: Ray
    try:
        started = ensure_ray()             # one Ray for the whole job, after the budget check
    except SystemExit as exc:              # Ray's own SIGTERM handler, while ray.init runs
        if exc.code == signals.signal.SIGTERM:
            raise signals.JobInterrupted(signals.signal.SIGTERM) from None
        raise
    signals.install()
    return started


def main(argv=None) -> int:
    with signals.handled():
        return _main(parse_args(argv))


def _main(args) -> int:
    if args.list_configs:
        print(list_configs())
        return 0
    # deferred (module comment): the library's checks load once the arguments are good; the
    # job layer (rknn_ray.job: Ray, torch, the accountants, ~3 CPU s) only once the config
    # is, so a mistyped key is answered in under a second
    from jobs.config_files import resolve_config
    from rknn_ray.config import load_config
    from rknn_ray.errors import RknnError, refusal_line
    from rknn_ray.rng import check_consent
    from rknn_ray.runio import prepare_run_dir, unfinished_release
    from rknn_ray.shard_secrets import check_key_store
    from server.keys import check_key_file
    out, owned = None, False            # owned: this invocation may write into ``out``
    created = False
    try:
        if args.resume:
            from rknn_ray.job.resume import resume_config  # defers the job layer (above)
            out = os.path.abspath(args.resume)
            cfg = resume_config(out, args.overrides)
        else:
            cfg = load_config(resolve_config(args.config), args.overrides)
        check_consent(cfg, args.insecure_seeded)
        if not os.environ.get("RAY_ADDRESS"):       # a local instance: its CPUs are ours to count
            from rknn_ray.job.resources import validate_resources  # defers the job layer
            validate_resources(cfg, float(os.cpu_count() or 1))
            if not args.resume and cfg.run.rng != "seeded":   # the shards' node is this one
                check_key_store(cfg.cluster.key_store)
        else:                                       # a cluster to join: there, before any budget
            from rknn_ray.job.ray_env import check_ray_address  # defers the job layer and Ray
            check_ray_address(os.environ["RAY_ADDRESS"])
        if args.key_file:
            check_key_file(args.key_file, load=True)
        if not args.resume:
            out = args.out or os.path.join("runs", f"{cfg.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
            created = not os.path.exists(out)
            # --overwrite: the old run stays until the new job has its budget reserved
            out = prepare_run_dir(out, overwrite=args.overwrite,
                                  discard_release=args.discard_release, replace_at_start=True)
        owned = True
        from rknn_ray.job.progress import Progress  # defers the job layer (above)
        progress = Progress.for_console(cfg.run.progress, quiet=args.quiet)
        report = run(cfg, out, key_file=args.key_file, ledger_path=args.ledger,
                     resume=bool(args.resume), progress=progress,
                     replace_old_run=bool(args.overwrite and not args.resume))
    except (KeyboardInterrupt, Exception) as exc:
        interrupt = signals.as_interrupt(exc)
        if interrupt is None and not owned and isinstance(exc, RknnError):
            # refused before this invocation had a run folder: one line, nothing to record,
            # and no job layer to load to say it
            print(f"error: {refusal_line(exc)}", file=sys.stderr)
            return 2
        # defers the job layer to a failure that needs it (above)
        from rknn_ray.job.failure import UNEXPECTED, failure_line, record_incomplete, stage_words
        if interrupt is not None:
            stage = stage_words(locals().get("progress"))
            message = f"interrupted by {interrupt.name}" + (f" during {stage}" if stage else "")
        else:
            message = failure_line(exc)
        line = f"error: {message}"
        if owned and out and os.path.isdir(out):
            if created and not os.listdir(out):
                os.rmdir(out)                 # leave no empty run folder behind
            elif unfinished_release(out) or not os.path.exists(os.path.join(out, "report.json")):
                line += "; " + record_incomplete(out, message, exc)
        print(line, file=sys.stderr)
        if interrupt is not None:
            return interrupt.exit_code
        if not isinstance(exc, RknnError) and message.startswith(UNEXPECTED):
            raise
        return 2
    from rknn_ray.job.labels_file import accuracy_words  # defers the job layer (above)
    acc, p = report["accuracy"], report["privacy"]
    print(f"run folder: {out}")
    if not p.get("private", True):
        print(f"NOT PRIVATE: {p['warning']}")
    print(f"{p['model']}/{p['mechanism']} eps={p['eps']:.4g} delta={p['delta']:.3g} "
          f"({p['unit']}-level, {p['neighbour']}): label accuracy "
          f"{accuracy_words(acc, 'labels')}, student accuracy {accuracy_words(acc, 'student')}")
    from jobs.report import eps0_words      # the summary's words (a light module)
    for t, part in enumerate(p.get("partial_release") or []):
        if part:
            print(f"PARTIAL RELEASE: round {t + 1} was released without client shard(s) "
                  f"{', '.join(map(str, part['lost_shards']))}: up to {part['clients_lost']} of "
                  f"{part['clients']} clients did not report (privacy.allow_partial_release)")
    eps0 = eps0_words(p)
    if eps0 is not None:
        print(f"each client randomized its report at local eps0 = {eps0} (the amplification "
              "bound's grant for the central target)")
    if "diagnostics" in report:
        print(f"[diagnostics, NOT private: {out}/diagnostics] non-private label accuracy "
              f"{accuracy_words(report['diagnostics'], 'nonprivate_labels')}")
    for line in site_lines(report):
        print(line)
    return 0


def site_lines(report: dict) -> list[str]:
    """data.private.sites: each site's public counts and the node its scan and clients ran on
    (report.json's counts.holders.sites and placement), in the summary as in the report."""
    sites = ((report.get("counts") or {}).get("holders") or {}).get("sites") or {}
    placement = report.get("placement") or {}
    lines = []
    for name, site in sorted(sites.items()):
        nodes = sorted({n[:12] for p in ("scan", "client") for n in placement.get(f"{p}@{name}", [])})
        lines.append(f"site {name}: {site.get('records')} records of {site.get('holders')} "
                     f"holders, read on node {', '.join(nodes) or 'unknown'}")
    return lines


if __name__ == "__main__":
    sys.exit(main())

"""The ``rknn-ray`` console script: one front door to every command.

``rknn-ray COMMAND [args]`` hands ``args`` to that command's own parser (each has ``--help``
with an example); ``rknn-ray --config FILE ...`` without a command is ``run``. Each command
is also ``python -m <its module>`` (what ``ray job submit`` runs).
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import sys

from jobs.signals import reader_gone
from rknn_ray import __version__

__all__ = ["COMMANDS", "main", "parser"]

#: command -> (module whose ``main(argv)`` it runs, one line of what it does)
COMMANDS = {
    "run": ("jobs.distill", "the private job: labels, a student and a run folder"),
    "report": ("jobs.report", "summary and report.html of a run, or one table of a folder of runs"),
    "predict": ("jobs.predict", "a run's student on new rows: class and probability per row"),
    "budget": ("jobs.budget", "the privacy budgets that last across jobs: list, set, settle"),
    "compare": ("jobs.compare", "reverse k-NN against the baselines at the same eps"),
    "grid": ("jobs.grid", "a sweep of real jobs over eps, s, k, model, encoder, seed"),
    "amplification": ("benchmarks.amplification", "shuffle-model amplification bounds"),
    "cluster": ("jobs.local_cluster", "a Ray cluster of several nodes on this machine"),
    "shuffler": ("jobs.shuffler_service", "the HTTPS shuffler service for holders off the cluster"),
    "holder": ("jobs.holder", "a data holder off the cluster: its key, and its answer to a round"),
    "operator": ("jobs.operator", "the operator's signing key for rounds with holders off the cluster"),
    "trial": ("jobs.trial", "a one-machine trial: holders, shuffler service and the job as separate processes"),
}

EXAMPLES = """\
examples:
  rknn-ray run --config digits_central --set privacy.eps=0.5 --out runs/eps05
  rknn-ray run --list-configs
  rknn-ray report runs/eps05
  rknn-ray predict runs/eps05 --input new_rows.csv --out predictions.csv
  rknn-ray budget list
  rknn-ray COMMAND --help

Without a command, the arguments are run's: rknn-ray --config digits_central.
Each command is also python -m MODULE (what ray job submit runs):
  """ + ", ".join(f"{name} = {module}" for name, (module, _) in COMMANDS.items()
                  if name in ("run", "report", "budget", "compare")) + ",\n  " + ", ".join(
    f"{name} = {module}" for name, (module, _) in COMMANDS.items()
    if name not in ("run", "report", "budget", "compare"))


def parser() -> argparse.ArgumentParser:
    """The top-level parser: its help lists the commands (each parses its own arguments)."""
    ap = argparse.ArgumentParser(
        prog="rknn-ray", epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Record-level private knowledge distillation by reverse k-NN labeling on\n"
                    "Ray, with central, local and shuffle differential privacy.")
    ap.add_argument("--version", action="version", version=f"rknn-ray {__version__}")
    sub = ap.add_subparsers(title="commands", metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    return ap


def main(argv=None) -> int:
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()          # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:         # `rknn-ray report DIR | head`: the reader had enough
        return reader_gone()


def _dispatch(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help", "--version"):
        ap = parser()
        if not argv:
            ap.print_help()
            return 0
        ap.parse_args(argv[:1])         # prints the help or the version and exits 0
    first = argv[0]
    if first in COMMANDS:
        module, rest = COMMANDS[first][0], argv[1:]
    elif first.startswith("-"):
        module, rest = COMMANDS["run"][0], argv   # rknn-ray --config FILE: the job, as before
    else:
        near = difflib.get_close_matches(first, list(COMMANDS), n=1)
        fix = f"did you mean '{near[0]}'?" if near else f"use one of {', '.join(COMMANDS)}"
        print(f"rknn-ray: unknown command {first!r}. Fix: {fix} (rknn-ray --help lists them)",
              file=sys.stderr)
        return 2
    return importlib.import_module(module).main(rest)


if __name__ == "__main__":
    sys.exit(main())

"""The ``rknn-ray`` console script: run the job, or manage the privacy budgets.

    rknn-ray --config FILE [--set k=v ...]      # = python -m jobs.distill
    rknn-ray budget [list | set DATASET --eps X]  # = python -m jobs.budget
    rknn-ray report RUN_DIR [--out FILE]          # = python -m jobs.report
    rknn-ray compare --dataset digits --eps 0.1 1 4 --out DIR  # = python -m jobs.compare
    rknn-ray grid --config FILE --eps 0.1 1 --s 30 60 --out DIR  # = python -m jobs.grid
"""
from __future__ import annotations

import sys


def main(argv=None) -> int:
    try:
        code = _dispatch(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()          # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:         # `rknn-ray report DIR | head`: the reader had enough
        from jobs.signals import reader_gone
        return reader_gone()


def _dispatch(argv: list) -> int:
    if argv and argv[0] == "budget":
        from jobs.budget import main as budget_main
        return budget_main(argv[1:])
    if argv and argv[0] == "report":
        from jobs.report import main as report_main
        return report_main(argv[1:])
    if argv and argv[0] == "compare":
        from jobs.compare import main as compare_main
        return compare_main(argv[1:])
    if argv and argv[0] == "grid":
        from jobs.grid import main as grid_main
        return grid_main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    from jobs.distill import main as distill_main
    return distill_main(argv)


if __name__ == "__main__":
    sys.exit(main())

"""One jobs.distill run as a cell of a bigger experiment (jobs.experiments.Runner).

An experiment runs many private jobs on one dataset. Each is a real run (real
mechanism, a release recorded as an event), but in an isolated ledger inside the
experiment's folder, so the user's dataset budgets are neither spent nor in the way;
the isolated ledger gets budgets large enough for the whole grid of eps values.
"""
from __future__ import annotations

import contextlib
import os
import time

from rknn_ray.errors import first_line
from rknn_ray.accounting.budget_store import BudgetStore
from rknn_ray.runio import prepare_run_dir

#: Budgets of the isolated ledger. The ledger is an experiment ledger (BudgetStore purpose
#: "experiment"): every cell is an independent hypothetical release, so neither the eps nor
#: the delta budget nor the 1/n delta cap applies across cells (an eps grid is never refused
#: there); a cell's budget is the largest a config may state.
ISOLATED_BUDGET = ("privacy.budget_eps=100",)


@contextlib.contextmanager
def isolated_ledger(out: str):
    """``out``/ledger.sqlite as the process's ledger ($RKNN_RAY_LEDGER) for the block; the
    caller's setting is restored afterwards. Yields the ledger's path."""
    path = os.path.join(os.path.abspath(out), "ledger.sqlite")
    BudgetStore(path, purpose="experiment")
    saved = os.environ.get("RKNN_RAY_LEDGER")
    os.environ["RKNN_RAY_LEDGER"] = path
    try:
        yield path
    finally:
        if saved is None:
            os.environ.pop("RKNN_RAY_LEDGER", None)
        else:
            os.environ["RKNN_RAY_LEDGER"] = saved


def run_distill(cfg, out_dir: str, ledger_path: str) -> tuple[dict, float]:
    """One job (:func:`rknn_ray.job.run`, what ``python -m jobs.distill`` runs) of the
    validated ``cfg`` into ``out_dir`` (replacing a run there); returns (report, wall seconds)."""
    from rknn_ray.job import run  # defers cryptography, dp_accounting, faiss, ray, tqdm
    # a sweep re-runs its cell: an earlier attempt's unfinished release is replaced, as before
    out = prepare_run_dir(out_dir, overwrite=True, discard_release=True)
    t0 = time.perf_counter()
    report = run(cfg, out, ledger_path=ledger_path).report
    return report, time.perf_counter() - t0


def error_text(exc: BaseException) -> str:
    """``Type: first line`` of an exception, for a failed cell's row."""
    text = first_line(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

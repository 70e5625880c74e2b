"""Every baseline by name, each run the same way: ``run(setup, eps, delta, ledger) -> row``.

``setup`` is the prepared data (rknn_ray.job.baselines.prepare_baseline), ``eps`` the target,
``delta`` the delta a method states its guarantee at where it has a choice, ``ledger`` the
PrivacyLedger its release is recorded in (None: one of its own, in memory). The row is a
:class:`~rknn_ray.baselines.common.BaselineRow`: the report-row schema of every other
experiment row. An adapter fixes what makes the method the one its name says (the PATE
aggregator, NFDP's subsample with or without replacement) and leaves every other knob at
the module's default.
"""
from __future__ import annotations

from typing import Callable

from rknn_ray.baselines import dpdfd, dpsgd, nfdp, pate, private_knn
from rknn_ray.baselines import BASELINE_NAMES
from rknn_ray.baselines.common import BaselineRow, BaselineSetup

Run = Callable[[BaselineSetup, float, float, object], BaselineRow]


def _nfdp(replacement: bool) -> Run:
    def run(setup, eps, delta, ledger=None):
        """FedMD-NFDP: its delta is what the subsample gives (~k/n), not ``delta``."""
        return nfdp.run_nfdp(setup, eps, replacement=replacement,
                             hosts=setup.party_hosts or nfdp.InProcessParties,
                             shards=setup.party_shards, ledger=ledger)
    return run


def _dpdfd(setup, eps, delta, ledger=None):
    """DP-DFD: pure eps-label-DP, so ``delta`` does not apply."""
    return dpdfd.run_dpdfd(setup, eps, ledger=ledger)


def _pate(aggregator: str, data_dependent: bool = False) -> Run:
    def run(setup, eps, delta, ledger=None):
        return pate.run_pate(setup, eps, delta, aggregator=aggregator,
                             data_dependent=data_dependent, ledger=ledger)
    return run


def _private_knn(setup, eps, delta, ledger=None):
    return private_knn.run_private_knn(setup, eps, delta, ledger=ledger)


def _dpsgd(setup, eps, delta, ledger=None):
    return dpsgd.run_dpsgd(setup, eps, delta, ledger=ledger)


#: name -> run, in the order a comparison lists them (GNMax also keeps its data-dependent
#: eps, reference only, in the row's details)
BASELINES: dict[str, Run] = {
    "fedmd_nfdp": _nfdp(replacement=True),
    "fedmd_nfdp_wor": _nfdp(replacement=False),
    "dpdfd_selective_rr": _dpdfd,
    "pate_lnmax": _pate("lnmax"),
    "pate_gnmax": _pate("gnmax", data_dependent=True),
    "private_knn": _private_knn,
    "dpsgd_head": _dpsgd,
}


def run_baseline(name: str, setup: BaselineSetup, eps: float, delta: float,
                 ledger=None) -> BaselineRow:
    """The baseline ``name`` at target ``eps`` (a ValueError names the known ones)."""
    if name not in BASELINES:
        raise ValueError(f"unknown baseline {name!r}: choose one of {', '.join(BASELINES)}")
    return BASELINES[name](setup, eps, delta, ledger)


assert tuple(BASELINES) == BASELINE_NAMES, "rknn_ray.baselines.BASELINE_NAMES lists BASELINES"

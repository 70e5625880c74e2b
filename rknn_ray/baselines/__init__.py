"""Baselines run on the project's data, queries, students and ledger.

One module per system; each states its guarantee, unit and neighbour relation:

* :mod:`~rknn_ray.baselines.nfdp`: FedMD-NFDP (paper 003), record-level (eps, delta), add/remove
* :mod:`~rknn_ray.baselines.dpdfd`: DP-DFD selective randomized response (paper 004), label DP
* :mod:`~rknn_ray.baselines.pate`: PATE LNMax / GNMax, record-level, RDP
* :mod:`~rknn_ray.baselines.private_knn`: Private-kNN, record-level, RDP
* :mod:`~rknn_ray.baselines.dpsgd`: DP-SGD head on the public representation, record-level

:mod:`~rknn_ray.baselines.registry` runs each by name as ``run(setup, eps, delta, ledger)``,
returning a row of the report-row schema (:class:`~rknn_ray.baselines.common.BaselineRow`).
"""

#: the baselines by name, in the order a comparison lists them (registry.BASELINES runs each;
#: here without importing them: ``rknn-ray compare --help`` lists the choices)
BASELINE_NAMES = ("fedmd_nfdp", "fedmd_nfdp_wor", "dpdfd_selective_rr", "pate_lnmax",
                  "pate_gnmax", "private_knn", "dpsgd_head")

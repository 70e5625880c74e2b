"""The private part's scan, run where the client shards run, before the job reserves budget.

A user's table (rknn_ray/data/kinds/table.py) comes out of ``prepare_data`` as a
:class:`~rknn_ray.data.prepared.PendingScan`: the public side is ready, the private rows
unread. :func:`complete_scan` runs the scan (rknn_ray.data.table_scan) as one Ray task
placed as the client shards are (``cluster.placement.client``), so the driver's process never
opens a private path; rows given in memory are already in the driver and are scanned there.
What comes back is counts, fingerprints keyed under the ledger's key and each shard's keyed
digest: the job reserves its budget for exactly those rows, and each shard checks it reads
the same rows before any client randomizes. Ray therefore starts before the reservation for
a table job (docs/running.md).
"""
from __future__ import annotations

import ray

from rknn_ray.data.prepared import PendingScan
from rknn_ray.data.table_scan import scan_answer_or_error
from rknn_ray.errors import DataError
from rknn_ray.job.placement import check_placement_feasible, party_options


def _scan_task(spec, key: bytes) -> dict:
    return scan_answer_or_error(spec, key)


def complete_scan(cfg, data, store, start_ray, progress):
    """``data`` with its private part scanned (unchanged when it is not a PendingScan)."""
    if not isinstance(data, PendingScan):
        return data
    key = store.fingerprint_key()
    if data.memory is not None:             # given in memory: in the driver already
        with progress.stage("scan", "checking the private rows given in memory"):
            return data.scan_here(key)
    start_ray()
    check_placement_feasible(cfg, ["client"])
    with progress.stage("scan", "checking the private rows where the client shards run"):
        # max_calls=1: the worker exits after the scan, its memory (O(records) words) freed
        task = ray.remote(max_calls=1)(_scan_task).options(
            num_cpus=min(1.0, float(cfg.cluster.shard_cpus)), max_retries=0,
            **party_options(cfg, "client"))
        answer = ray.get(task.remote(data.spec, key))
    if "error" in answer:
        raise DataError(answer["error"])
    return data.complete({**answer, "key": key})

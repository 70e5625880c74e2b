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

With ``data.private.sites`` (private data on its holders' own nodes) there is one scan per
site, each placed on the site's nodes (rknn_ray.job.placement.site_options) and run side by
side; each first checks the site's path exists on its node; their answers are joined
(rknn_ray.data.sites: a holder on two sites is refused). Every refusal comes before the
reservation, as one line naming the site.
"""
from __future__ import annotations

import dataclasses
import os

import ray

from rknn_ray.data.prepared import PendingScan
from rknn_ray.data.table_scan import scan_answer_or_error
from rknn_ray.errors import DataError
from rknn_ray.job.placement import (check_placement_feasible, check_sites_feasible,
                                    party_options, site_options)


class _Scanner:
    """The scan's process: an actor the job ends itself once it answered (ray.kill), so no
    reused worker keeps pyarrow's threads and none dies noisily when Ray reaps it."""

    def scan(self, spec, key: bytes) -> dict:
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
    if data.sites:
        return _scan_sites(cfg, data, key, progress)
    with progress.stage("scan", "checking the private rows where the client shards run"):
        scanner = ray.remote(_Scanner).options(
            num_cpus=min(1.0, float(cfg.cluster.shard_cpus)), max_restarts=0,
            **party_options(cfg, "client")).remote()
        try:
            answer = ray.get(scanner.scan.remote(data.spec, key))
        finally:
            ray.kill(scanner)
    if "error" in answer:
        raise DataError(answer["error"])
    return data.complete({**answer, "key": key})


def _site_here(_actor, path: str) -> tuple[str, bool]:
    """(the node this runs on, whether ``path`` exists there): run inside a site's scan actor
    (``__ray_call__``) before its scan, so a missing folder is named as such. A URI is looked
    up by the scan itself (rknn_ray.data.remote.check_remote)."""
    exists = "://" in path or any(c in path for c in "*?[") or os.path.exists(path)
    return ray.get_runtime_context().get_node_id(), exists


def _scan_sites(cfg, data: PendingScan, key: bytes, progress):
    """One scan per site on the site's nodes, side by side; the answers joined."""
    from rknn_ray.data.sites import join_site_answers   # numpy, hashing: only with sites
    sites = data.sites
    check_sites_feasible(cfg, sites)
    with progress.stage("scan", f"checking the private rows on {len(sites)} sites' own nodes"):
        scanners = [ray.remote(_Scanner).options(
            num_cpus=min(1.0, float(cfg.cluster.shard_cpus)), max_restarts=0,
            **site_options(cfg, site)).remote() for site in sites]
        try:
            where = ray.get([s.__ray_call__.remote(_site_here, site.path)
                             for s, site in zip(scanners, sites)])
            for site, (node, exists) in zip(sites, where):
                if not exists:
                    raise DataError(f"{site.key}.path: {site.path!r} does not exist on the "
                                    f"site's node ({node[:8]}). Fix: put site {site.name}'s "
                                    f"files there on that node, or correct {site.key}.path")
            answers = ray.get([s.scan.remote(dataclasses.replace(
                data.spec, part=data.spec.part.at_site(site), shards=site.shards), key)
                for s, site in zip(scanners, sites)])
        finally:
            for s in scanners:
                ray.kill(s)
    for site, answer in zip(sites, answers):
        if "error" in answer:
            error = answer["error"]
            raise DataError(error if site.key in error else f"{site.key}: {error}")
    joined = join_site_answers(sites, answers, key)
    joined["scan_nodes"] = {site.name: node for site, (node, _) in zip(sites, where)}
    return data.complete({**joined, "key": key})

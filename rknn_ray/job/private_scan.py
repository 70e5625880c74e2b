"""The private part's scan, run where the client shards run, before the job reserves budget.

A user's table (rknn_ray/data/kinds/table.py) comes out of ``prepare_data`` as a
:class:`~rknn_ray.data.prepared.PendingScan`: the public side is ready, the private rows
unread. :func:`complete_scan` runs the scan (rknn_ray.data.table_scan) in one Ray actor
placed as the client shards are (``cluster.placement.client``), so the driver's process never
opens a private path; rows given in memory are already in the driver and are scanned there.
What comes back is counts, fingerprints keyed under the ledger's key and each shard's keyed
digest: the job reserves its budget for exactly those rows. The same pass splits the rows
into each shard's parts, written to files on the scan's node that have no name by then, kept
open by a small holder (actors/parts_holder.py); the driver never reads one. Each shard
takes its own once and checks their digest before any client randomizes
(scan_where_shards_run). Ray therefore starts before the reservation for a table job
(docs/running.md).

With ``data.private.sites`` (private data on its holders' own nodes) there is one scan per
site, each placed on the site's nodes (rknn_ray.job.placement.site_options), one after
another (each site's parts stay on its node); each first checks the site's path exists on
its node; their answers are joined (rknn_ray.data.sites: a holder on two sites is refused).
Every refusal comes before the reservation, as one line naming the site.
"""
from __future__ import annotations

import dataclasses

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rknn_ray.data.prepared import PendingScan
from rknn_ray.errors import DataError
from actors.parts_holder import PartsHolder, ScannedParts
from actors.private_scanner import PrivateScanner
from rknn_ray.job.placement import (check_placement_feasible, check_sites_feasible,
                                    party_options, site_options)


def scan_where_shards_run(cfg, spec, key: bytes, options: dict, before=None) -> dict:
    """The scan's answer from a :class:`~actors.private_scanner.PrivateScanner` placed by
    ``options``; with it ``parts``: a :class:`~actors.parts_holder.ScannedParts` whose
    holder, on the scan's node, keeps each shard's parts (in files) until the shard reads
    them (the driver never holds one). ``before(scanner)`` (data.private.sites): a check run
    in the scanner before its scan; a message it returns is the answer's error (nothing
    scanned)."""
    def holder_on(node: str):
        return ray.remote(PartsHolder).options(
            num_cpus=0, max_restarts=0, max_concurrency=int(spec.shards) + 2,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    scanner = ray.remote(PrivateScanner).options(
        num_cpus=min(1.0, float(cfg.cluster.shard_cpus)), max_restarts=0, **options).remote()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    # one node: the scanner's is known, so both processes start at once
    holder = holder_on(nodes[0]) if len(nodes) == 1 else None
    waiting_on = "the scan's actor"
    try:
        problem = before(scanner) if before is not None else None
        if problem:
            if holder is not None:
                _end(holder)
            return {"error": problem}
        if holder is None:
            holder = holder_on(ray.get(scanner.node.remote()))
        waiting_on = "the parts' holder"        # it answers once the scan has answered
        (ref,) = ray.get(holder.collect.remote(scanner, [ray.put(spec)], key, int(spec.shards)))
        waiting_on = "the scan's actor"
        answer = ray.get(ref)
    except ray.exceptions.RayActorError as exc:     # killed, or its node lost: before any budget
        if holder is not None:
            _end(holder)
        raise ScanLost(waiting_on, exc) from None
    except BaseException:
        if holder is not None:
            _end(holder)
        raise
    finally:
        ray.kill(scanner)
    if "error" in answer:
        _end(holder)                          # the parts go with it
        return answer
    return {**answer, "parts": ScannedParts(holder)}


class ScanLost(DataError):
    """The scan's actor or the parts' holder died during the scan: the job stops before its
    reservation, so nothing was reserved or released (one line, exit 2)."""

    def __init__(self, who: str, exc: BaseException):
        # Ray's first line says how the actor died, never a record
        first = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
        super().__init__(f"{who} died during the private scan ({type(exc).__name__}"
                         f"{': ' + first[:160] if first else ''}); no budget was reserved and "
                         "nothing was released. Fix: run the job again (if it recurs, look at "
                         "the scan node's memory and Ray's logs)")


def _end(holder) -> None:
    """End the holder once its calls are done (a graceful exit: ray.kill of it right after it
    answered once aborted its process under load, printing a native stack on the console)."""
    holder.__ray_terminate__.remote()


def complete_scan(cfg, data, store, start_ray, progress):
    """``data`` with its private part scanned (unchanged when it is not a PendingScan)."""
    if not isinstance(data, PendingScan):
        return data
    if cfg.cluster.holders == "remote":     # no scan: each holder reads its own rows, off the cluster
        from rknn_ray.remote.registry import registry_data   # only with cluster.holders: remote
        return registry_data(cfg, data)
    key = store.fingerprint_key()
    if data.memory is not None:             # given in memory: in the driver already
        with progress.stage("scan", "checking the private rows given in memory"):
            return data.scan_here(key)
    start_ray()
    check_placement_feasible(cfg, ["client"])
    if data.sites:
        return _scan_sites(cfg, data, key, progress)
    with progress.stage("scan", "checking the private rows where the client shards run"):
        answer = scan_where_shards_run(cfg, data.spec, key, party_options(cfg, "client"))
    if "error" in answer:
        raise DataError(answer["error"])
    return data.complete({**answer, "key": key})


def _scan_sites(cfg, data: PendingScan, key: bytes, progress):
    """One scan per site on the site's nodes, one after another (each site's parts stay on
    its node with their holder); the answers joined."""
    from rknn_ray.data.sites import join_site_answers   # numpy, hashing: only with sites
    sites = data.sites
    check_sites_feasible(cfg, sites)
    answers, where = [], []
    with progress.stage("scan", f"checking the private rows on {len(sites)} sites' own nodes"):
        for site in sites:
            def before(scanner, site=site):
                node, exists = ray.get(scanner.site_here.remote(site.path))
                where.append((node, exists))
                if not exists:
                    return (f"{site.key}.path: {site.path!r} does not exist on the site's node "
                            f"({node[:8]}). Fix: put site {site.name}'s files there on that "
                            f"node, or correct {site.key}.path")
                return None
            answer = scan_where_shards_run(cfg, dataclasses.replace(
                data.spec, part=data.spec.part.at_site(site), shards=site.shards), key,
                site_options(cfg, site), before)
            if "error" in answer:
                for earlier in answers:      # the sites scanned before: their parts go
                    if earlier.get("parts") is not None:
                        _end(earlier["parts"].holder)
                error = answer["error"]
                raise DataError(error if site.key in error else f"{site.key}: {error}")
            answers.append(answer)
    joined = join_site_answers(sites, answers, key)
    joined["scan_nodes"] = {site.name: node for site, (node, _) in zip(sites, where)}
    return data.complete({**joined, "key": key})

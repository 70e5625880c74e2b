"""The private part's scan, run where the client shards run, before the job reserves budget.

A user's table (rknn_ray/data/kinds/table.py) comes out of ``prepare_data`` as a
:class:`~rknn_ray.data.prepared.PendingScan`: the public side is ready, the private rows
unread. :func:`complete_scan` runs the scan (rknn_ray.data.table_scan) in one Ray actor
placed as the client shards are (``cluster.placement.client``), so the driver's process never
opens a private path; rows given in memory are already in the driver and are scanned there.
What comes back is counts, fingerprints keyed under the ledger's key and each shard's keyed
digest: the job reserves its budget for exactly those rows. The same pass splits the rows
into each shard's parts, Ray objects owned by a small holder on the scan's node
(actors/parts_holder.py) that the driver never fetches; each shard takes its own once and
checks their digest before any client randomizes (scan_where_shards_run). Ray therefore starts before the reservation for
a table job (docs/running.md).
"""
from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rknn_ray.data.prepared import PendingScan
from rknn_ray.data.table_scan import scan_parts_or_error
from rknn_ray.errors import DataError
from actors.parts_holder import PartsHolder, ScannedParts
from rknn_ray.job.placement import check_placement_feasible, party_options


class _Scanner:
    """The scan's process: an actor the job ends itself once it answered (ray.kill), so no
    reused worker keeps pyarrow's threads and none dies noisily when Ray reaps it. Its
    :meth:`scan` is a streaming generator: per group of rows, one part per shard (in shard
    order: the count depends on the public row count only), then the answer; the parts are
    Ray objects owned by the caller (actors/parts_holder.py), so they outlive this actor."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def scan(self, spec, key: bytes):
        for item in scan_parts_or_error(spec, key):
            if isinstance(item, dict):
                yield item
            else:
                for part in item:       # a plain loop: Ray drives generators with send()
                    yield part


def scan_where_shards_run(cfg, spec, key: bytes, options: dict) -> dict:
    """The scan's answer from a :class:`_Scanner` placed by ``options``; with it ``parts``:
    a :class:`~actors.parts_holder.ScannedParts` whose holder, on the scan's node, owns each
    shard's parts until the shard reads them (the driver never holds one)."""
    def holder_on(node: str):
        return ray.remote(PartsHolder).options(
            num_cpus=0, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
    scanner = ray.remote(_Scanner).options(
        num_cpus=min(1.0, float(cfg.cluster.shard_cpus)), max_restarts=0, **options).remote()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    # one node: the scanner's is known, so both processes start at once
    holder = holder_on(nodes[0]) if len(nodes) == 1 else None
    try:
        if holder is None:
            holder = holder_on(ray.get(scanner.node.remote()))
        (ref,) = ray.get(holder.collect.remote(scanner, [ray.put(spec)], key, int(spec.shards)))
        answer = ray.get(ref)
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


def _end(holder) -> None:
    """End the holder once its calls are done (a graceful exit: ray.kill of it right after it
    answered once aborted its process under load, printing a native stack on the console)."""
    holder.__ray_terminate__.remote()


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
        answer = scan_where_shards_run(cfg, data.spec, key, party_options(cfg, "client"))
    if "error" in answer:
        raise DataError(answer["error"])
    return data.complete({**answer, "key": key})

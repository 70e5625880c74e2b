"""The owner of the shards' parts between the private scan and the shards' first read.

:class:`PartsHolder` is a tiny actor (no CPU; nothing but Ray imported) placed on the scan's
node (rknn_ray/job/private_scan.py). It drives the scan's streaming generator itself, so it
owns the parts: a small part (Ray keeps objects under 100 KB in its owner's memory, not in
the object store) stays in this process on the scan's node, never in the driver, which gets
only a reference to the scan's answer. It never deserializes a part. Each shard takes its
own list of references once; a part is freed once its shard has read it.
"""
from __future__ import annotations

import ray


class PartsHolder:
    def __init__(self):
        self.parts: dict = {}

    def collect(self, scanner, spec: list, key: bytes, shards: int) -> list:
        """Run ``scanner.scan`` (``spec``: ``[ObjectRef]`` of the scan's spec, resolved in the
        scanner only); keep each shard's parts; ``[a reference to the answer]``."""
        refs = list(scanner.scan.options(num_returns="streaming").remote(spec[0], key))
        answer = refs.pop()
        self.parts = {s: refs[s::shards] for s in range(shards)}
        return [answer]

    def take(self, shard: int):
        return self.parts.pop(shard, None)


class ScannedParts:
    """What a :class:`~rknn_ray.data.table_source.TableShardSource` takes its rows from:
    ``take(shard)`` fetches the shard's parts one at a time (each dropped once yielded)."""

    def __init__(self, holder):
        self.holder = holder

    def take(self, shard: int):
        refs = ray.get(self.holder.take.remote(int(shard)))
        return None if refs is None else _one_by_one(refs)


def _one_by_one(refs: list):
    refs.reverse()
    while refs:
        part = ray.get(refs.pop())
        if part is not None:
            yield part
        del part

"""The holder of the shards' parts between the private scan and the shards' first read.

A tiny actor (no CPU, nothing but Ray imported) that keeps the ObjectRefs of each shard's
parts (rknn_ray/job/private_scan.py) and never resolves one, so no private row enters it;
each shard takes its own list once, and a part is freed from the object store once its shard
has read it.
"""
from __future__ import annotations

import ray


class PartsHolder:
    def __init__(self):
        self.parts: dict = {}

    def keep(self, parts: list) -> int:
        self.parts = dict(enumerate(parts))
        return len(parts)

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

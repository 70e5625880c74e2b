"""Each shard's parts of the private scan kept in a file on the scan's node, not in memory.

The scan (rknn_ray/data/table_scan.py ``scan_parts``) cuts every group of rows into one part
per shard. Held as Ray objects, all of a job's parts sat in the object store (shared memory)
from the end of the scan until the shards read them: the whole table in RAM once more (1.4 GB
at 1e7 records), beside the shards' featurized copies. Written here instead, one Arrow IPC
stream per shard in an owner-only folder on the scan's node (the node that holds the private
files already), they cost page cache the kernel may evict, and each shard reads its own back
one part at a time (actors/parts_holder.py streams them with a small window).

A part's rows keep their columns; the client ranks and keyed holder hashes ride as two extra
columns (``RANK``, ``HOLDER``) and are split off again when read.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

RANK, HOLDER = "__rknn_rank", "__rknn_holder"


def part_path(folder: str, shard: int) -> str:
    return os.path.join(folder, f"shard-{int(shard)}.arrow")


class PartWriter:
    """Appends each group's parts to its shard's file (opened on its first part)."""

    def __init__(self, folder: str):
        self.folder = folder
        self.sinks: dict = {}

    def add(self, parts: list) -> None:
        """One group's parts in shard order, each ``(rows, ranks or None, hashes or None)`` or
        None (no row of that shard in the group)."""
        for shard, piece in enumerate(parts):
            if piece is None:
                continue
            rows, rank, holder = piece
            if rank is not None:
                rows = rows.append_column(RANK, pa.array(np.asarray(rank, np.int64)))
                rows = rows.append_column(HOLDER, pa.array(np.asarray(holder, np.uint64)))
            if shard not in self.sinks:
                sink = pa.OSFile(part_path(self.folder, shard), "wb")
                self.sinks[shard] = (sink, pa.ipc.new_stream(sink, rows.schema))
            self.sinks[shard][1].write_table(rows)

    def close(self) -> list:
        """Close every file; the shards that got a file."""
        for sink, writer in self.sinks.values():
            writer.close()
            sink.close()
        return sorted(self.sinks)


def read_parts(source):
    """The parts of one shard's file (an open pyarrow file), one record batch at a time, each
    ``(rows, ranks or None, hashes or None)``."""
    reader = pa.ipc.open_stream(source)
    for batch in reader:
        rows = pa.Table.from_batches([batch])
        del batch
        if RANK in rows.column_names:
            rank = rows.column(RANK).to_numpy()
            holder = rows.column(HOLDER).to_numpy()
            rows = rows.drop_columns([RANK, HOLDER])
            yield rows, rank, holder
        else:
            yield rows, None, None

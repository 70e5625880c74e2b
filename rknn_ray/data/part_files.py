"""Each shard's parts of the private scan kept in a file on the scan's node, not in memory.

The scan (rknn_ray/data/table_scan.py ``scan_parts``) cuts every group of rows into one part
per shard. Held as Ray objects, all of a job's parts sat in the object store (shared memory)
from the end of the scan until the shards read them: the whole table in RAM once more (1.4 GB
at 1e7 records), beside the shards' featurized copies. Written here instead, one Arrow IPC
stream per shard on the scan's node (the node that holds the private files already), they
cost page cache the kernel may evict, and each shard reads its own back one part at a time
(actors/parts_holder.py streams them with a small window). The files have no name by the time
a row is written (:class:`PartWriter`): only the processes holding them open can read them.

A part's rows keep their columns; the client ranks and keyed holder hashes ride as two extra
columns (``RANK``, ``HOLDER``) and are split off again when read.
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

RANK, HOLDER = "__rknn_rank", "__rknn_holder"

#: rows per record batch in a shard's file, so per object a shard reads (about 4.5 MB at 32
#: float32 features): small objects keep the object store's pages the stream touches few
PART_ROWS = 1 << 15


def part_path(folder: str, shard: int) -> str:
    return os.path.join(folder, f"shard-{int(shard)}.arrow")


def make_part_files(folder: str, shards: int) -> list:
    """Create each shard's (empty) file in ``folder`` and open it for reading: the reader's
    side, opened before any row is written (the writer unlinks the names at once)."""
    out = []
    for s in range(int(shards)):
        path = part_path(folder, s)
        with open(path, "xb"):
            pass
        out.append(open(path, "rb"))          # noqa: SIM115 - held open by the holder
    return out


class PartWriter:
    """Appends each group's parts to its shard's file. Opens every shard's file (made by
    :func:`make_part_files`) and unlinks it, and the folder, before the first row is written:
    no private row is ever in a file with a name, so nothing is left behind on disk however
    the job ends (the holder's open files are the only way to the rows)."""

    def __init__(self, folder: str, shards: int):
        self.folder = folder
        self.files = {s: pa.OSFile(part_path(folder, s), "wb") for s in range(int(shards))}
        for s in self.files:
            os.unlink(part_path(folder, s))
        os.rmdir(folder)
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
                self.sinks[shard] = pa.ipc.new_stream(self.files[shard], rows.schema)
            self.sinks[shard].write_table(rows, max_chunksize=PART_ROWS)

    def close(self) -> None:
        for writer in self.sinks.values():
            writer.close()
        for sink in self.files.values():
            sink.close()


def read_parts(source):
    """The parts of one shard's file (a binary file object), one record batch at a time, each
    ``(rows, ranks or None, hashes or None)``; nothing from an empty file (no row there)."""
    if os.fstat(source.fileno()).st_size == 0:
        return
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

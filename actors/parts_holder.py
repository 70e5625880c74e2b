"""The keeper of the shards' parts between the private scan and the shards' first read.

:class:`PartsHolder` is a tiny actor (no CPU; Ray and pyarrow imported) placed on the scan's
node (rknn_ray/job/private_scan.py). It makes one empty file per shard in an owner-only
folder there and opens each; the scan opens them too, unlinks them and the folder, and only
then writes each shard's parts into its file (rknn_ray/data/part_files.py). So the parts wait
on disk, not in the object store, and no private row is ever in a file with a name: the rows
exist only as the two processes' open files, gone when they end, however they end. Each shard
takes its own file once: on this node it opens the holder's descriptor itself; elsewhere it
reads it back through a streaming call with a window of two parts (the object store holds a
few parts at a time, never the table). The driver only ever gets a reference to the scan's
answer.
"""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import ray

#: parts in flight per shard while it reads (the holder reads ahead of the shard by this much)
WINDOW = 2


def _private_folder() -> str:
    """An owner-only folder in Ray's session folder on this node (else the system's temp)."""
    try:
        base = ray._private.worker._global_node.get_session_dir_path()  # noqa: SLF001
    except Exception:  # noqa: BLE001 - outside a Ray worker: the system's temp folder
        base = None
    if not base or not os.path.isdir(base):
        base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix="rknn-scan-parts-", dir=base)    # mode 0700


class PartsHolder:
    def __init__(self):
        self.folder = _private_folder()
        self.files: dict = {}
        self.reading: dict = {}
        atexit.register(shutil.rmtree, self.folder, True)

    def collect(self, scanner, spec: list, key: bytes, shards: int) -> list:
        """Make and open each shard's file, then run ``scanner.scan`` (``spec``: ``[ObjectRef]``
        of the scan's spec, resolved in the scanner only), which unlinks them before writing;
        ``[a reference to the answer]`` (never fetched here)."""
        from rknn_ray.data.part_files import make_part_files  # defers pyarrow
        self.files = dict(enumerate(make_part_files(self.folder, shards)))
        ref = scanner.scan.remote(spec[0], key, self.folder, int(shards))
        ray.wait([ref], fetch_local=False)
        shutil.rmtree(self.folder, ignore_errors=True)     # the scan removed it (or failed)
        return [ref]

    def take(self, shard: int) -> dict | None:
        """Where ``shard``'s file is open (this node, process and descriptor), once: None after
        it took it. The shard opens its own copy of the descriptor where it runs on this
        node (:class:`ScannedParts`), else it streams the file through :meth:`read`."""
        got = self.files.pop(int(shard), None)
        if got is None:
            return None
        self.reading[int(shard)] = got
        return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
                "fd": got.fileno()}

    def close(self, shard: int) -> None:
        """Drop this holder's handle of ``shard``'s file (the shard holds its own)."""
        got = self.reading.pop(int(shard), None)
        if got is not None:
            got.close()

    def read(self, shard: int):
        """The shard's parts, one at a time (a streaming call; see :class:`ScannedParts`)."""
        from rknn_ray.data.part_files import read_parts  # defers pyarrow
        source = self.reading.pop(int(shard))
        try:
            for part in read_parts(source):
                yield part
                del part
        finally:
            source.close()


class ScannedParts:
    """What a :class:`~rknn_ray.data.table_source.TableShardSource` takes its rows from:
    ``take(shard)`` yields the shard's parts one at a time (each dropped once yielded). On the
    holder's node the shard reads the file itself, through the holder's descriptor
    (``/proc/<pid>/fd/<n>``: a process of the same user on the same node): the rows never
    enter the object store. Elsewhere the holder streams them to it through Ray, WINDOW parts
    at a time."""

    def __init__(self, holder):
        self.holder = holder

    def take(self, shard: int):
        try:
            where = ray.get(self.holder.take.remote(int(shard)))
        except ray.exceptions.RayActorError:     # ended once every shard read its parts
            return None
        if not where:
            return None
        own = _open_here(where)
        if own is not None:
            ray.get(self.holder.close.remote(int(shard)))
            return _from_file(own)
        refs = self.holder.read.options(
            num_returns="streaming", _generator_backpressure_num_objects=WINDOW
        ).remote(int(shard))
        return _one_by_one(refs)

    def end(self) -> None:
        """End the holder (every shard has read its parts: the job calls this once all shards
        opened their records); a shard restarted later is told to run the job again."""
        self.holder.__ray_terminate__.remote()


def _open_here(where: dict):
    """The holder's open file, opened anew in this process, where this is its node (None:
    another node, or the system refused: then the parts come through Ray)."""
    if ray.get_runtime_context().get_node_id() != where["node"]:
        return None
    try:
        return open(f"/proc/{int(where['pid'])}/fd/{int(where['fd'])}", "rb")  # noqa: SIM115
    except OSError:
        return None


def _from_file(source):
    from rknn_ray.data.part_files import read_parts  # defers pyarrow
    try:
        yield from read_parts(source)
    finally:
        source.close()


def _one_by_one(refs):
    for ref in refs:
        part = ray.get(ref)
        del ref
        yield part
        del part

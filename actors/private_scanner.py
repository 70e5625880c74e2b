"""The private scan's process (rknn_ray/job/private_scan.py places and ends it).

Its own module, outside the job layer, because a Ray worker imports the module that defines
its actor: defined in ``rknn_ray.job`` the scan's process imported the whole job (the
accountants, scipy: 2.3 CPU s here, per scan and per site) to run a table scan.
"""
from __future__ import annotations

import os

import ray

from rknn_ray.data.table_scan import scan_parts_or_error


class PrivateScanner:
    """The scan's process: an actor the job ends itself once it answered (ray.kill), so no
    reused worker keeps pyarrow's threads and none dies noisily when Ray reaps it. Its
    :meth:`scan` writes each shard's parts into the holder's folder on this node
    (rknn_ray/data/part_files.py; actors/parts_holder.py keeps them), then answers."""

    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def site_here(self, path: str) -> tuple[str, bool]:
        """(the node this runs on, whether ``path`` exists there): asked of a site's scan
        actor before its scan, so a missing folder is named as such. A URI is looked up by
        the scan itself (rknn_ray.data.remote.check_remote)."""
        exists = "://" in path or any(c in path for c in "*?[") or os.path.exists(path)
        return ray.get_runtime_context().get_node_id(), exists

    def scan(self, spec, key: bytes, folder: str, shards: int) -> dict:
        from rknn_ray.data.part_files import PartWriter   # defers pyarrow: the scan's actor
        answer = None
        try:
            writer = PartWriter(folder, shards)
            for item in scan_parts_or_error(spec, key):
                if isinstance(item, dict):
                    answer = item
                else:
                    writer.add(item)
            writer.close()
        except OSError as exc:        # the parts' folder: no private value in the message
            return {"error": f"{spec.part.key}: writing the scan's parts to {folder} on the "
                             f"scan's node failed ({exc.strerror or type(exc).__name__}). Fix: "
                             "free disk space in Ray's session folder on that node (the "
                             "parts take about the private files' size uncompressed)"}
        return answer

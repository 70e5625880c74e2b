"""A job driver for tests/test_secret_memory.py: one private round, then it waits to be scanned.

``python -m tests.secret_scan_driver KEY_STORE`` starts its own Ray (small object store, so
the scan can read all of it), runs one secure local-model round of the digits job on two
client shards whose key store is KEY_STORE, prints one JSON line and waits for a line on
stdin before it closes the session (which deletes the shards' secrets). The JSON carries a
*canary*: 32 random bytes this driver passed as an actor argument, the way shard secrets
used to travel, so the test can show its scan finds what crosses Ray's control plane, and
*stored* bytes it put in the object store, to show the scan reads the object store too.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def main(key_store: str) -> None:
    import ray

    from rknn_ray.job.progress import Progress
    from rknn_ray.job.session import ProtocolSession
    from rknn_ray.accounting import PrivacyLedger
    from rknn_ray.config import load_config
    from rknn_ray.job.stages import fit_queries
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.data.sources import dataset_sources
    from rknn_ray.mechanisms.stage import mechanism_for

    # address="local": always a new instance of our own, never a cluster that `ray start`
    # left on this machine (whose processes this test neither owns nor should scan)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 2**20)

    @ray.remote(num_cpus=0)
    class Holder:
        def __init__(self, blob: bytes):
            self.blob = blob

        def ready(self) -> bool:
            return True

    canary = os.urandom(32)
    holder = Holder.remote(canary)
    ray.get(holder.ready.remote())
    stored = os.urandom(32)                     # 128 KiB: too big to inline, so it is in plasma
    kept = [holder, ray.put(stored * 4096)]     # alive (and in the store) while scanned
    cfg = load_config("jobs/configs/digits_local.yaml",
                      ["run.rng=secure", "queries.s=10", "cluster.shards=2",
                       "cluster.batch_clients=200", "cluster.openers=1",
                       f"cluster.key_store={key_store}"])
    data = prepare_data(cfg)
    encoder, _, qs = fit_queries(cfg, data)
    mech = mechanism_for(cfg, data)
    with ProtocolSession(cfg, dataset_sources(cfg, data), "job-scan",
                         progress=Progress(False)) as session:
        res = session.run_round(0, mech, encoder, qs.features, PrivacyLedger())
        print(json.dumps({"job_id": "job-scan", "messages": res.messages,
                          "clients": res.clients, "canary": canary.hex(),
                          "stored": stored.hex()}), flush=True)
        sys.stdin.readline()                    # the test scans this process tree now
    del kept
    print(json.dumps({"closed": True}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])

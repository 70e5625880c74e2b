"""A job driver for tests/test_table_jobs.py's canary test: one table job, then it waits.

``python -m tests.table_canary_driver FOLDER`` runs ``rknn_ray.run`` on the tables in FOLDER
(written by the test: one private record carries the canary features and holder id, one
public row the public canary), in the central model on its own Ray, prints one JSON line
once the job (round, labels, student) is done and Ray is shut down, and waits for a line on
stdin, so the test can scan this process's memory for the canaries.
"""
from __future__ import annotations

import gc
import json
import os
import sys

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def main(folder: str) -> None:
    import rknn_ray
    cfg = {"data": {"dataset": "table", "classes": [0, 1, 2], "max_records_per_client": 4,
                    "private": {"path": f"{folder}/private.parquet", "label": "label",
                                "client": "holder"},
                    "public": {"path": f"{folder}/public.parquet", "id": "row_id"}},
           "privacy": {"model": "central", "mechanism": "laplace", "eps": 2.0},
           "queries": {"s": 20}, "represent": {"dim": 4},
           "student": {"trainer": "local", "epochs": 1}, "cluster": {"shards": 2},
           "run": {"progress": False}}
    result = rknn_ray.run(cfg, out_dir=f"{folder}/run")
    counts, result_labels = result.report["counts"], result.labels
    del result
    gc.collect()
    print(json.dumps({"records": counts["records"], "clients": counts["clients"],
                      "labelled": len(result_labels)}), flush=True)
    sys.stdin.readline()


if __name__ == "__main__":
    main(sys.argv[1])

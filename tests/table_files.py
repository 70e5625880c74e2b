"""Writers of small user tables for the table tests: scikit-learn's digits as a private part
with a holder column, an unlabelled public part with string row ids and a labelled evaluation
part, as parquet or CSV (written here with pyarrow's writers, independent of the readers)."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from rknn_ray.data import load_dataset


def digits_parts(seed: int = 0, holders: int = 300, n_private: int = 1100, n_public: int = 400):
    """(private, public, evaluation) Arrow tables: 64 pixel columns p0..p63 (floats), the
    private part with ``label`` and ``holder`` (strings h0..), public with ``row_id``."""
    d = load_dataset("digits")
    x, y = d.train_x.reshape(len(d.train_x), -1).astype(np.float64), d.train_y
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    priv, pub, ev = perm[:n_private], perm[n_private:n_private + n_public], perm[n_private + n_public:]

    def part(idx, **extra):
        return pa.table({**{f"p{i}": x[idx, i] for i in range(64)}, **extra})
    holder = np.array([f"h{int(i)}" for i in rng.integers(0, holders, len(priv))])
    return (part(priv, label=y[priv], holder=holder),
            part(pub, row_id=np.array([f"r{int(i)}" for i in pub])),
            part(ev, label=y[ev]))


def write(table: pa.Table, path: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if path.endswith(".csv"):
        pcsv.write_csv(table, path)
    else:
        pq.write_table(table, path)
    return path


def table_config(folder: str, ext: str = "parquet", **data) -> dict:
    """A config dict for the parts written by :func:`write_parts` (small, quick, central);
    ``data``: keys of the data section to change."""
    base = {"dataset": "table", "classes": list(range(10)), "max_records_per_client": 10,
            "private": {"path": f"{folder}/private.{ext}", "label": "label", "client": "holder"},
            "public": {"path": f"{folder}/public.{ext}", "id": "row_id"},
            "evaluation": {"path": f"{folder}/evaluation.{ext}", "label": "label"}}
    for k, v in data.items():        # a part's keys change that part's keys only
        base[k] = {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return {"data": base,
            "privacy": {"model": "central", "mechanism": "laplace", "eps": 2.0},
            "queries": {"s": 60}, "represent": {"dim": 16},
            "student": {"trainer": "local", "epochs": 3}, "cluster": {"shards": 2},
            "run": {"progress": False}}


def write_parts(folder: str, ext: str = "parquet", parts=None) -> tuple:
    parts = parts or digits_parts()
    for name, table in zip(("private", "public", "evaluation"), parts):
        write(table, f"{folder}/{name}.{ext}")
    return parts


#: a fingerprint key for scans run in the test process (a job takes its ledger's)
TEST_KEY = bytes(range(32))


def prepared_table(cfg, inputs=None, key: bytes = TEST_KEY):
    """prepare_data for a table config, its private scan run here (a job runs it where the
    shards run: rknn_ray/job/private_scan.py)."""
    from rknn_ray.data.prepared import PendingScan, prepare_data
    data = prepare_data(cfg, inputs) if inputs else prepare_data(cfg)
    return data.scan_here(key) if isinstance(data, PendingScan) else data

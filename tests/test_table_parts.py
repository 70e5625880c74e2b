"""The scan's one-pass split (rknn_ray/data/table_scan.py ``scan_parts``): each shard gets the
rows of its own holders (or its range of rows) from the scan, in groups, and what it builds
from them equals what it builds from the same rows dealt in memory (the driver-side split,
where each shard ranks its own holders' ids itself): the same records, labels, client ids and
digests, with groups smaller than a shard's rows, several files and no client column."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rknn_ray.config import Config
from rknn_ray.data import table_scan
from rknn_ray.data.sources import dataset_sources
from tests.table_files import digits_parts, prepared_table, table_config, write


def _records(cfg, inputs=None):
    data = prepared_table(cfg, inputs)
    out = []
    for src in dataset_sources(cfg, data):
        r = src.open(order_key=bytes(32))     # one secret for both: the same kept records
        out.append((src.shard, src.client_lo, src.client_hi, src.expect, r.features, r.labels,
                    r.client_ids))
    return data, out


@pytest.mark.parametrize("client", ["holder", None])
def test_parts_from_the_scan_equal_the_rows_dealt_in_memory(tmp_path, monkeypatch, client):
    monkeypatch.setattr(table_scan, "GROUP_ROWS", 97)      # many groups, parts of a few rows
    rng = np.random.default_rng(3)
    for trial in range(3):
        priv, pub, _ = digits_parts(seed=trial, holders=int(rng.integers(5, 60)), n_private=700)
        folder = tmp_path / f"t{trial}"
        os.makedirs(folder / "private")
        cuts = [0, 150, 151, 420, 700]                    # several files, one of one row
        for i, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            pq.write_table(priv.slice(a, b - a), str(folder / "private" / f"p{i}.parquet"))
        write(pub, str(folder / "public.parquet"))
        shards = int(rng.integers(2, 5))
        base = table_config(str(folder), private={"path": str(folder / "private"),
                                                  "client": client})
        cfg = Config.from_dict({**base, "cluster": {"shards": shards}}).with_overrides(
            ["data.evaluation=null", "data.max_records_per_client=3"])
        from_scan, got = _records(cfg)
        in_memory, want = _records(cfg, {"private": priv.to_pandas(), "public": pub.to_pandas()})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g[:4] == w[:4]                  # shard, client range, the scan's digest
            for a, b in zip(g[4:], w[4:]):
                np.testing.assert_array_equal(a, b)
        assert np.array_equal(from_scan.pool_keyed, in_memory.pool_keyed)
        assert from_scan.private_digest == in_memory.private_digest


def test_a_part_that_differs_from_the_scan_is_refused_before_any_client(tmp_path):
    """A part altered between the scan and the shard (one feature value): the shard's digest
    differs from the scan's and it refuses, naming no value."""
    from rknn_ray.data.table_scan import HeldParts
    from rknn_ray.errors import DataError
    priv, pub, _ = digits_parts(holders=20, n_private=300)
    write(priv, str(tmp_path / "private.parquet"))
    write(pub, str(tmp_path / "public.parquet"))
    cfg = Config.from_dict(table_config(str(tmp_path))).with_overrides(["data.evaluation=null"])
    data = prepared_table(cfg)
    sources = dataset_sources(cfg, data)
    parts: HeldParts = sources[0].parts
    rows, rank, holder = parts.parts[sources[0].shard][0]
    x = rows.column("p20").to_numpy().copy()
    x[0] += 1.0
    parts.parts[sources[0].shard][0] = (rows.set_column(rows.column_names.index("p20"), "p20",
                                                        pa.array(x)), rank, holder)
    with pytest.raises(DataError, match="read other rows than the job's scan") as err:
        sources[0].open()
    assert str(x[0]) not in str(err.value)
    assert sources[1].open().labels.size            # the other shard reads its own

"""The scan's parts wait in files on the scan's node (rknn_ray/data/part_files.py,
actors/parts_holder.py), not in the object store: the files lose their names before any row
is written (nothing private is ever left on disk under a name, however a job ends), each shard
reads back exactly the parts the scan cut for it, once, and a folder the scan cannot write is
one line naming the fix."""
import glob
import os

import numpy as np
import pyarrow as pa
import pytest

from rknn_ray.config import Config
from rknn_ray.data import part_files
from rknn_ray.data.part_files import PartWriter, make_part_files, read_parts
from rknn_ray.data.prepared import prepare_data
from tests.table_files import TEST_KEY, digits_parts, table_config, write


def _part(n: int, seed: int):
    rng = np.random.default_rng(seed)
    rows = pa.table({"f0": rng.normal(size=n).astype(np.float32), "label": pa.array(
        rng.integers(0, 3, n).astype(str))})
    return rows, rng.integers(0, 50, n), rng.integers(0, 2 ** 63, n).astype(np.uint64)


def test_files_lose_their_names_before_a_row_and_read_back_what_was_written(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(part_files, "PART_ROWS", 7)        # a group's part in several batches
    folder = tmp_path / "parts"
    folder.mkdir(mode=0o700)
    readers = make_part_files(str(folder), 3)
    writer = PartWriter(str(folder), 3)
    assert not folder.exists()                             # unlinked before the first row
    groups = [[_part(20, 1), None, _part(5, 2)], [_part(9, 3), None, None]]
    for g in groups:
        writer.add(g)
    writer.close()
    for shard in range(3):
        got = list(read_parts(readers[shard]))
        want = [g[shard] for g in groups if g[shard] is not None]
        if not want:
            assert got == []                               # a shard with no row reads nothing
            continue
        assert all(rows.num_rows <= 7 for rows, _, _ in got)
        rows = pa.concat_tables([r for r, _, _ in got])
        assert rows.equals(pa.concat_tables([r for r, _, _ in want]))
        assert rows.column_names == ["f0", "label"]        # ranks and hashes split off again
        np.testing.assert_array_equal(np.concatenate([r for _, r, _ in got]),
                                      np.concatenate([r for _, r, _ in want]))
        np.testing.assert_array_equal(np.concatenate([h for _, _, h in got]),
                                      np.concatenate([h for _, _, h in want]))


def _pending(tmp_path, shards: int = 3):
    priv, pub, _ = digits_parts(holders=30, n_private=400)
    write(priv, str(tmp_path / "private.parquet"))
    write(pub, str(tmp_path / "public.parquet"))
    cfg = Config.from_dict({**table_config(str(tmp_path)), "cluster": {"shards": shards}}
                           ).with_overrides(["data.evaluation=null"])
    return cfg, prepare_data(cfg)


def _session_dir(ray) -> str:
    return ray._private.worker._global_node.get_session_dir_path()   # noqa: SLF001


@pytest.mark.parametrize("path", ["own descriptor", "through Ray"])
def test_each_shard_reads_the_scans_parts_once_and_no_file_keeps_a_name(tmp_path, ray_session,
                                                                        monkeypatch, path):
    """On the holder's node a shard opens the holder's descriptor; elsewhere (forced here) the
    holder streams the parts: the same parts either way, once."""
    import actors.parts_holder as holder_module
    from rknn_ray.data.table_scan import scan
    opened = []
    real = holder_module._open_here

    def open_here(where):
        got = None if path == "through Ray" else real(where)
        opened.append(got is not None)
        return got
    monkeypatch.setattr(holder_module, "_open_here", open_here)
    from rknn_ray.job.placement import party_options
    from rknn_ray.job.private_scan import _end, scan_where_shards_run
    cfg, pending = _pending(tmp_path)
    here: list = []
    scan(pending.spec, TEST_KEY, None, here)               # the same scan in this process
    # the folders of this scan only: a parts holder that another test killed with kill -9 in
    # the session's Ray leaves its (empty) folder behind (atexit does not run)
    before = set(glob.glob(os.path.join(_session_dir(ray_session), "rknn-scan-parts-*")))
    answer = scan_where_shards_run(cfg, pending.spec, TEST_KEY, party_options(cfg, "client"))
    try:
        assert "error" not in answer
        assert set(glob.glob(os.path.join(_session_dir(ray_session), "rknn-scan-parts-*"))) \
            - before == set()
        for shard in range(3):
            got = list(answer["parts"].take(shard))
            want = here[shard]
            assert pa.concat_tables([r for r, _, _ in got]).equals(
                pa.concat_tables([r for r, _, _ in want]))
            np.testing.assert_array_equal(np.concatenate([r for _, r, _ in got]),
                                          np.concatenate([r for _, r, _ in want]))
            np.testing.assert_array_equal(np.concatenate([h for _, _, h in got]),
                                          np.concatenate([h for _, _, h in want]))
            assert answer["parts"].take(shard) is None     # once: a restarted shard gets none
        assert opened == [path == "own descriptor"] * 3
        answer["parts"].end()                          # the job ends it once shards opened
        for _ in range(100):                           # a shard restarted later: told "none"
            got = answer["parts"].take(0)
            assert got is None
            try:
                ray_session.get(answer["parts"].holder.take.remote(0), timeout=1)
            except ray_session.exceptions.RayActorError:
                break
        else:
            pytest.fail("the holder did not end")
    finally:
        _end(answer["parts"].holder)


def test_a_folder_the_scan_cannot_write_is_one_line_with_the_fix(tmp_path):
    from actors.private_scanner import PrivateScanner
    cfg, pending = _pending(tmp_path)
    answer = PrivateScanner().scan(pending.spec, TEST_KEY, str(tmp_path / "no-such-folder"), 3)
    assert list(answer) == ["error"]
    assert "writing the scan's parts" in answer["error"] and "Fix:" in answer["error"]
    assert "\n" not in answer["error"]

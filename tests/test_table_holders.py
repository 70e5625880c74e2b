"""Holders as parties (issue 45): the neighbour relation the protocol honours, checked as an
auditor would, on neighbouring data sets and every view.

The relation (README, "trust models"; report.json privacy.relation): one record's value
(features and label) is replaced; which holders take part and how many records each holds
are public. Under it the number of holders, each holder's record count and so the number of
reports the server opens are public, and shown; what a holder contributes (which of its
records, how many reports) depends on that holder's records and public parameters only.
"""
import csv
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rknn_ray.config import Config
from rknn_ray.data.sources import dataset_sources
from rknn_ray.data.tables import bucket_of
from tests.table_files import prepared_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "jobs", "configs", "data", "breast_cancer")
ORDER_KEY = bytes(range(32))


# ------------------------------------------------------------- kept records, brute force
def _random_table(rng, holders: int, width: int = 3) -> pa.Table:
    """A small private table: 1-5 records per holder, rows in a random order."""
    counts = rng.integers(1, 6, holders)
    holder = np.repeat([f"h{i}" for i in range(holders)], counts)
    n = holder.size
    cols = {f"f{j}": rng.integers(0, 4, n).astype(np.float64) for j in range(width)}
    order = rng.permutation(n)
    return pa.table({**{k: v[order] for k, v in cols.items()},
                     "label": rng.integers(0, 2, n)[order], "holder": holder[order]})


def _kept_by_holder(folder, table: pa.Table, bound: int, shards: int) -> dict:
    """holder -> sorted list of the (features..., label) records it keeps, through the real
    scan and the real shard sources (each shard reads its own rows from the file)."""
    pq.write_table(table, os.path.join(folder, "private.parquet"))
    width = len([c for c in table.column_names if c.startswith("f")])
    pub = {f"f{j}": np.arange(6, dtype=np.float64) % (j + 2) for j in range(width)}
    pq.write_table(pa.table({**pub, "row_id": [f"r{i}" for i in range(6)]}),
                   os.path.join(folder, "public.parquet"))
    cfg = Config.from_dict({
        "data": {"dataset": "table", "classes": [0, 1], "max_records_per_client": bound,
                 "private": {"path": os.path.join(folder, "private.parquet"), "label": "label",
                             "client": "holder"},
                 "public": {"path": os.path.join(folder, "public.parquet"), "id": "row_id"}},
        "queries": {"s": 2}, "represent": {"encoder": "raw"}, "cluster": {"shards": shards},
        "run": {"progress": False}})
    data = prepared_table(cfg)
    kept = {}
    _, ids, id_shard = bucket_of(table.column("holder"), shards)
    for src in dataset_sources(cfg, data):
        records = src.open(order_key=ORDER_KEY)     # one shard secret, as a shard has one
        # the shard's client ids are ranks of its holders' ids (their text's sort order)
        names = sorted(i for i, s in zip(ids, id_shard) if s == src.shard)
        for cid in np.unique(records.client_ids):
            rows = records.client_ids == cid
            feats = records.features[rows]
            kept[names[int(cid) - src.client_lo]] = sorted(
                tuple(np.round(f, 5)) + (int(lab),) for f, lab in zip(feats, records.labels[rows]))
    return kept


def test_one_replacement_never_changes_another_holders_kept_records(tmp_path):
    """The record bound is local to the holder: over random tables, replacing one record's
    value changes the kept records of that holder only, by at most one record out and one in
    (an L1 change of at most 2kr in the counts, as the noise assumes), through the real scan
    and shard reads with two shards."""
    rng = np.random.default_rng(45)
    for trial in range(40):
        table = _random_table(rng, holders=int(rng.integers(3, 9)))
        row = int(rng.integers(table.num_rows))
        changed = {c: table.column(c).to_pylist() for c in table.column_names}
        for c in ("f0", "f1", "f2"):
            changed[c][row] = float(rng.integers(0, 4))
        changed["label"][row] = int(rng.integers(0, 2))
        neighbour = pa.table(changed)
        os.makedirs(tmp_path / f"a{trial}")
        os.makedirs(tmp_path / f"b{trial}")
        a = _kept_by_holder(str(tmp_path / f"a{trial}"), table, 2, 2)
        b = _kept_by_holder(str(tmp_path / f"b{trial}"), neighbour, 2, 2)
        owner = table.column("holder")[row].as_py()
        assert a.keys() == b.keys()
        for holder in a:
            if holder != owner:
                assert a[holder] == b[holder], (trial, holder)
        out = [r for r in a[owner] if r not in b[owner] or a[owner].count(r) > b[owner].count(r)]
        into = [r for r in b[owner] if r not in a[owner] or b[owner].count(r) > a[owner].count(r)]
        assert len(set(out)) <= 1 and len(set(into)) <= 1, (trial, a[owner], b[owner])
        assert len(a[owner]) == len(b[owner]) == min(2, table.column("holder").to_pylist()
                                                     .count(owner))


# ------------------------------------------------------------- neighbouring jobs, every view
def _shipped_copy(folder, change=None) -> str:
    """The shipped breast-cancer tables in ``folder``; ``change(rows)`` edits private.csv."""
    os.makedirs(folder, exist_ok=True)
    for name in ("public.csv", "evaluation.csv", "private.csv"):
        shutil.copy(os.path.join(SHIPPED, name), os.path.join(folder, name))
    if change is not None:
        path = os.path.join(folder, "private.csv")
        with open(path, newline="") as fh:
            rows = list(csv.reader(fh))
        change(rows)
        with open(path, "w", newline="") as fh:
            csv.writer(fh).writerows(rows)
    return folder


def _replace_value(rows):
    """D': one record's value replaced (its features and its label); its holder unchanged."""
    header, row = rows[0], rows[40]
    for j, name in enumerate(header):
        try:
            row[j] = str(float(row[j]) * 1.5 + 0.1)
        except ValueError:          # text columns (the holder, the label, categories) stay
            pass
    row[header.index("label")] = "benign" if row[header.index("label")] == "malignant" \
        else "malignant"


def _move_single_record_holder(rows):
    """D1: one single-record holder's record moved to another holder (not a neighbour under
    the relation: the holders taking part differ)."""
    h = rows[0].index("holder")
    counts: dict = {}
    for r in rows[1:]:
        counts[r[h]] = counts.get(r[h], 0) + 1
    single = next(r for r in rows[1:] if counts[r[h]] == 1)
    other = next(k for k, v in counts.items() if 1 < v < 8)
    single[h] = other


def _job(folder, config: str, *sets, ray=None) -> tuple:
    """(exit code, console lines, report.json or None, ledger rows) of one real CLI job. With
    ``ray`` (the session's, ``ray_session``) the job joins it as under ``ray job submit``
    instead of starting a local Ray of its own (the same parties, ~10 s less per job)."""
    ledger = os.path.join(folder, "ledger.sqlite")
    args = [sys.executable, "-m", "jobs.distill", "--config", f"jobs/configs/{config}",
            "--out", os.path.join(folder, "run"), "--ledger", ledger, "--insecure-seeded",
            "--set", f"data.private.path={folder}/private.csv",
            "--set", f"data.public.path={folder}/public.csv",
            "--set", f"data.evaluation.path={folder}/evaluation.csv",
            "--set", "run.rng=seeded", "--set", "student.trainer=local",
            "--set", "student.epochs=1", "--set", "run.progress=true"]
    for s in sets:
        args += ["--set", s]
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "PYTHONPATH": ROOT}
    env.pop("RAY_ADDRESS", None)
    if ray is not None:
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    report_path = os.path.join(folder, "run", "report.json")
    report = json.load(open(report_path)) if os.path.exists(report_path) else None
    from rknn_ray.accounting.budget_store import BudgetStore
    rows = BudgetStore(ledger).datasets() if os.path.exists(ledger) else []
    return proc.returncode, (proc.stdout + proc.stderr).splitlines(), report, rows, folder


#: console words that come from the DP release (labels, student) or from the clock
RELEASE_DERIVED = re.compile(r"accuracy|loss|\bdone in\b|^\[|epoch|State API|warning|WARNING")
RAY_LOG_TIME = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}(?=\s)")


def _views(job) -> dict:
    """Every view but the release and what is computed from it: exit code, console (timings
    and accuracies left out), report counts and guarantees, the ledger's entries."""
    rc, console, report, ledger, folder = job
    lines = [re.sub(r"\[\s*[\d.]+s\]\s*", "", line).replace(folder, "FOLDER") for line in console]
    # the clock of Ray's own log lines (joining the session's Ray: "Connected to Ray cluster.")
    lines = [RAY_LOG_TIME.sub("TIME", line) for line in lines]
    lines = [line for line in lines if not RELEASE_DERIVED.search(line)
             and not line.startswith("run folder")]
    # a progress bar's interim lines follow which shard's batch lands first (timing, not
    # data): each bar keeps its last line, where its first one stood
    bars: dict = {}
    for i, line in enumerate(lines):
        bar = re.match(r"\s*([a-z ]+): \d+", line)
        if bar:
            bars[bar.group(1)] = (bars.get(bar.group(1), (i, None))[0], line)
    firsts = {i: last for i, last in bars.values()}
    lines = [firsts.get(i, line) for i, line in enumerate(lines)
             if i in firsts or not re.match(r"\s*([a-z ]+): \d+", line)]
    view = {"rc": rc, "console": lines}
    if report is not None:
        p = report["privacy"]
        view["counts"] = report["counts"]
        view["privacy"] = {k: p[k] for k in ("model", "mechanism", "eps", "delta", "unit",
                                             "neighbour", "relation")}
        view["rounds"] = [{k: v for k, v in r.items() if k not in ("note",)}
                          for r in p["rounds"]]
    view["ledger"] = [{k: src[k] for k in ("spent", "reserved")} for src in ledger]
    view["ledger_releases"] = [[{k: rel.get(k) for k in ("eps", "delta", "status")}
                                for rel in src["releases"]] for src in ledger]
    return view


@pytest.mark.parametrize("config,sets", [
    ("table_central.yaml", ()),
    ("table_shuffle.yaml", ("privacy.model=local", "privacy.mechanism=rr", "privacy.delta=0")),
    ("table_shuffle.yaml", ("privacy.amplification_bound=tight",))],
    ids=["central", "local", "shuffle-tight"])
def test_neighbours_under_the_relation_show_every_party_the_same(config, sets, tmp_path,
                                                                 ray_session):
    """D and D' (one record's value replaced, its holder unchanged), the same seeds: the exit
    code, the console, the counts in report.json (the reports the server opened, the senders
    the shuffler admitted, the holders), the guarantees and the ledger are equal. Only the
    release and what is computed from it (labels, accuracies) may differ."""
    d = _job(_shipped_copy(str(tmp_path / "d")), config, *sets, ray=ray_session)
    d2 = _job(_shipped_copy(str(tmp_path / "d2"), _replace_value), config, *sets, ray=ray_session)
    assert d[0] == 0, "\n".join(d[1][-20:])
    a, b = _views(d), _views(d2)
    assert a == b
    counts = d[2]["counts"]
    assert counts["clients"] == counts["holders"]["holders"] == 74      # public, and shown
    if "central" not in config:      # one report per holder: the count of reports is public
        assert counts["messages"] == 74
    assert "records of 74 holders" in "\n".join(d[1])
    if "amplification_bound=tight" in sets:
        # the check as a user meets it: D1 (one single-record holder's record moved
        # to another holder) is not a neighbour of D under the relation (its holders differ),
        # so its own count is public: it runs too, calibrated for the 73 holders it has,
        # nothing refused after the round began
        d1 = _job(_shipped_copy(str(tmp_path / "d1"), _move_single_record_holder), config, *sets,
                  ray=ray_session)
        assert d1[0] == 0, "\n".join(d1[1][-20:])
        assert d1[2]["counts"]["clients"] == 73 and d1[2]["privacy"]["eps"] <= 4.0 * (1 + 1e-9)


# ------------------------------------------------------------- private values, ledger keys
def test_a_private_cell_value_reaches_neither_console_nor_run_folder(tmp_path, ray_session):
    """SECRETVALUE123 in a numeric private column, an existing --out: one line naming the
    column's fault, exit 2, before any reservation; the value nowhere in the console or in
    any file of the run folder (incomplete.json included)."""
    def word(rows):
        rows[9][3] = "SECRETVALUE123"
    folder = _shipped_copy(str(tmp_path / "d"), word)
    os.makedirs(os.path.join(folder, "run"))
    rc, console, report, ledger, _ = _job(folder, "table_shuffle.yaml", ray=ray_session)
    text = "\n".join(console)
    assert rc == 2 and "SECRETVALUE" not in text and "value is not shown" in text, text
    for dirpath, _, names in os.walk(os.path.join(folder, "run")):
        for name in names:
            assert b"SECRETVALUE" not in open(os.path.join(dirpath, name), "rb").read(), name
    assert all(src["spent"]["eps"] == 0 and src["reserved"] == 0 for src in ledger)


def test_the_ledger_is_owner_only_and_a_reader_cannot_tag_an_edited_release(tmp_path):
    """The ledger is made 0600 (a wider one is tightened); release.npz is tagged under a key
    kept beside the ledger, not in it: a reader of the ledger file (a copy, a backup) derives
    no key that tags an edited release so that --resume accepts it."""
    from rknn_ray.accounting.budget_store import BudgetStore
    from rknn_ray.job.release_file import release_tag, release_tag_key
    path = tmp_path / "ledger.sqlite"
    store = BudgetStore(str(path))
    key = release_tag_key(store)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(str(path) + ".key").st_mode & 0o777 == 0o600
    os.chmod(path, 0o644)
    BudgetStore(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600          # tightened, with a warning
    # a reader's copy of the ledger file alone: every key it can derive differs
    copy = tmp_path / "copy" / "ledger.sqlite"
    os.makedirs(copy.parent)
    shutil.copy(path, copy)
    reader = BudgetStore(str(copy))
    edited = {"counts": np.ones(3)}
    from rknn_ray.errors import LedgerError
    with pytest.raises(LedgerError, match="release key .* is missing"):   # never a new key
        release_tag_key(reader)
    assert release_tag(reader.purpose_key("release.npz"), edited) != release_tag(key, edited)


def test_near_fingerprints_keep_table_copies_together_and_unrelated_tables_apart():
    """A table's near code is each value's own octave (its columns differ in scale): on the
    shipped table every record has its own near fingerprint (8 distinct for 342 records with
    the image code), a copy times 255/256 or one float32 ulp away still meets it, and random
    tables with the same categorical columns and the same column statistics do not."""
    import pyarrow.csv as pcsv

    from rknn_ray.accounting.source_identity import near_fingerprints
    from rknn_ray.data.tables import Columns, Part, feature_matrix, raw_numbers
    t = pcsv.read_csv(os.path.join(SHIPPED, "private.csv"))
    part = Part("private", label="label", client="holder")
    cols = Columns.resolve(part, t.schema, {"label", "holder"})
    raw = raw_numbers(feature_matrix(t, cols, part))
    near = near_fingerprints(raw, table=True)
    assert len(near) == len(raw) and len(near_fingerprints(raw)) < 20
    ulp = (raw.astype(np.float32) * np.float32(1 + 2 ** -23)).astype(np.float64)
    assert len(np.intersect1d(near, near_fingerprints(ulp, table=True))) == len(raw)
    assert len(np.intersect1d(near, near_fingerprints(raw * 255 / 256, table=True))) > 200
    rng = np.random.default_rng(0)
    num = [j for j, n in enumerate(cols.names) if n not in cols.categorical]
    for _ in range(20):
        other = raw.copy()
        other[:, num] = rng.normal(raw[:, num].mean(0), raw[:, num].std(0), other[:, num].shape)
        assert len(np.intersect1d(near, near_fingerprints(other, table=True))) == 0


@pytest.mark.parametrize("multi_record", ["sample", "each"])
def test_what_the_parties_count_is_the_same_on_neighbouring_tables(multi_record, tmp_path):
    """Brute force over random holder tables: replacing one record's value leaves every count
    a party sees unchanged: the clients (senders, reports per round), each shard's clients,
    the records kept, the holders, and every shard's rows checked by the digest (its count)."""
    rng = np.random.default_rng(47)
    for trial in range(25):
        table = _random_table(rng, holders=int(rng.integers(3, 9)))
        row = int(rng.integers(table.num_rows))
        changed = {c: table.column(c).to_pylist() for c in table.column_names}
        changed["f1"][row] = float(rng.integers(0, 4)) + 0.5
        changed["label"][row] = 1 - changed["label"][row]
        views = []
        for name, t in (("a", table), ("b", pa.table(changed))):
            folder = tmp_path / f"{name}{trial}"
            os.makedirs(folder)
            pq.write_table(t, str(folder / "private.parquet"))
            pq.write_table(pa.table({"f0": [0.0, 1, 2, 3], "f1": [1.0, 0, 3, 2], "f2": [2.0, 3, 0, 1],
                                     "row_id": ["r0", "r1", "r2", "r3"]}),
                           str(folder / "public.parquet"))
            cfg = Config.from_dict({
                "data": {"dataset": "table", "classes": [0, 1], "max_records_per_client": 2,
                         "private": {"path": str(folder / "private.parquet"), "label": "label",
                                     "client": "holder"},
                         "public": {"path": str(folder / "public.parquet"), "id": "row_id"}},
                "privacy": {"model": "local", "mechanism": "rr", "eps": 2.0,
                            "multi_record": multi_record},
                "queries": {"s": 2}, "represent": {"encoder": "raw"},
                "cluster": {"shards": 3}, "run": {"progress": False}})
            data = prepared_table(cfg)
            sources = dataset_sources(cfg, data)
            opened = [src.open() for src in sources]
            views.append({"clients": data.num_clients, "holders": data.holders,
                          "counts": data.public_counts(),
                          "shards": [(s.client_lo, s.client_hi, s.expect[0]) for s in sources],
                          "opened": [(r.num_clients, len(r.labels)) for r in opened]})
        assert views[0] == views[1], trial

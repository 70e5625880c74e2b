"""Private data on its holders' own nodes (issue 46, ``data.private.sites``): each site's part is
scanned and read only on a node with the site's labels / resources; the job's counts are the
sum over sites; a holder on two sites, a site no node can host, a site whose path is missing
on its node and an empty site are refused in one line, exit 2, before any reservation; and on
a three-node ``rknn-ray cluster`` whose private folders differ each site's scan and shards ran
on the site's own node while the driver (watched with strace) never touched a site's folder.
"""
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
import yaml

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError, DataError
from tests.table_files import digits_parts, write
from tests.test_multinode import _run_in_own_group

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SITES = ("a", "b", "c")


def _write_sites(folder: str, holders: int = 60, n_private: int = 600) -> dict:
    """Digits split by holder over three site folders (holder i on site i mod 3), the same rows
    as one file too, and the public part; returns {site: its folder}."""
    priv, pub, _ = digits_parts(holders=holders, n_private=n_private)
    write(pub, f"{folder}/public.parquet")
    write(priv, f"{folder}/private.parquet")
    h = np.array([int(s[1:]) for s in priv.column("holder").to_pylist()])
    out = {}
    for i, name in enumerate(SITES):
        out[name] = f"{folder}/site_{name}"
        write(priv.filter(pa.array(h % 3 == i)), f"{out[name]}/part.parquet")
    return out


def _config(folder: str, sites: dict, **extra) -> dict:
    cfg = {"data": {"dataset": "table", "classes": list(range(10)), "max_records_per_client": 10,
                    "private": {"label": "label", "client": "holder", "sites": sites},
                    "public": {"path": f"{folder}/public.parquet", "id": "row_id"}},
           "privacy": {"model": "central", "mechanism": "laplace", "eps": 2.0},
           "queries": {"s": 40, "restarts": 1}, "represent": {"dim": 16},
           "student": {"trainer": "local", "epochs": 1}, "run": {"progress": False}}
    for section, values in extra.items():
        cfg[section] = {**cfg.get(section, {}), **values}
    return cfg


# ------------------------------------------------------------------ the config
GOOD = {"a": {"path": "/data/a", "labels": {"site": "a"}}}


@pytest.mark.parametrize("private, key", [
    ({"sites": []}, "data.private.sites"),
    ({"sites": GOOD, "path": "/data/all"}, "data.private.path"),
    ({"sites": {"a": {"path": "data/a", "labels": {"site": "a"}}}}, "data.private.sites.a.path"),
    ({"sites": {"a": {"path": "/data/a"}}}, "data.private.sites.a"),
    ({"sites": {"a": {"path": "/data/a", "labels": {"site": "a"}, "shards": 0}}},
     "data.private.sites.a.shards"),
    ({"sites": {"a": {"path": "/data/a", "labels": {"site": "a"}, "nodes": 2}}},
     "data.private.sites.a.nodes"),
    ({"sites": {"a": {"path": "/data/a", "resources": {"CPU": 1}}}},
     "data.private.sites.a.resources.CPU"),
    ({"sites": {"a b": {"path": "/data/a", "labels": {"site": "a"}}}}, "data.private.sites.a b"),
    ({"sites": GOOD, "client": None}, "data.private.client"),
])
def test_a_bad_site_names_its_key_and_the_fix(private, key):
    base = {"label": "label", "client": "holder", **private}
    sets = ["data.dataset=table", "data.max_records_per_client=5",
            f"data.private={json.dumps(base)}", "data.public={path: /p.parquet}"]
    with pytest.raises(ConfigError) as err:
        load_config(None, sets)
    assert err.value.key == key and err.value.fix, (err.value.key, err.value.problem)


def test_sites_are_read_as_sites_and_name_themselves_in_messages():
    from rknn_ray.data.tables import Part, sites_of
    cfg = load_config(None, ["data.dataset=table", "data.max_records_per_client=5",
                             "data.public={path: /p.parquet}",
                             'data.private={label: label, client: holder, sites: {a: {path: '
                             '/d/a, labels: {site: a}}, b: {path: "s3://bucket/b/", resources: '
                             '{site_b: 1}, shards: 2}}}'])
    a, b = sites_of(cfg.data.private)
    assert (a.name, a.path, a.need, a.shards) == ("a", "/d/a", {"resources": {}, "labels":
                                                                {"site": "a"}}, 1)
    assert b.need == {"resources": {"site_b": 1.0}, "labels": {}} and b.shards == 2
    part = Part.of("private", cfg.data.private).at_site(b)
    assert part.key == "data.private.sites.b" and part.path == "s3://bucket/b/"
    assert part.is_private and not Part("public").is_private


# ------------------------------------------------------------------ joining the sites' scans
def _answer(rows, holders, keys, shards=1, digest="d"):
    return {"rows": rows, "holders": holders, "kept": rows, "largest_holder": 2,
            "clients": [holders] + [0] * (shards - 1),
            "shard_digests": [[rows, "00"]] + [[0, "0" * 16]] * (shards - 1),
            "kept_per_shard": [rows] + [0] * (shards - 1), "digest": digest,
            "fingerprints": np.array([rows], np.uint64), "near": np.array([rows], np.uint64),
            "columns": {"names": ["x"], "list_column": None, "categorical": []},
            "holder_keys": np.array(keys, np.uint64)}


def test_sites_answers_join_into_one_and_a_holder_on_two_sites_is_refused():
    from rknn_ray.data.sites import join_site_answers
    from rknn_ray.data.tables import Site
    sites = (Site("a", "/a", (("site", "a"),)), Site("b", "/b", (("site", "b"),), shards=2))
    key = bytes(32)
    joined = join_site_answers(sites, [_answer(5, 2, [1, 2]), _answer(7, 3, [3, 4, 5], 2)], key)
    assert (joined["rows"], joined["holders"], joined["kept"]) == (12, 5, 12)
    assert joined["clients"] == [2, 3, 0] and len(joined["shard_digests"]) == 3
    assert [(s.name, i, n) for s, i, n in joined["shard_sites"]] == [("a", 0, 1), ("b", 0, 2),
                                                                       ("b", 1, 2)]
    assert joined["sites"] == {"a": {"records": 5, "holders": 2, "shards": 1},
                               "b": {"records": 7, "holders": 3, "shards": 2}}
    other = join_site_answers(sites, [_answer(5, 2, [1, 2]), _answer(7, 3, [3, 4, 5], 2, "e")],
                              key)
    assert other["digest"] != joined["digest"]         # a site's rows changed: another part
    with pytest.raises(DataError) as err:               # holder 2 on both sites
        join_site_answers(sites, [_answer(5, 2, [1, 2]), _answer(7, 3, [2, 4, 5], 2)], key)
    text = str(err.value)
    assert "'a' and 'b'" in text and "1 holder(s)" in text and "Fix:" in text, text


# ------------------------------------------------------------------ jobs on one node
def _node_label(ray):
    """The one local node's own label: sites 'living' on it (the session's Ray has one node)."""
    return {"ray.io/node-id": ray.get_runtime_context().get_node_id()}


def _main(tmp_path, cfg, name, capsys, extra=()):
    from jobs.distill import main
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    ledger = tmp_path / f"{name}.sqlite"
    rc = main(["--config", str(path), "--out", str(tmp_path / name), "--ledger", str(ledger),
               "--quiet", *extra])
    return rc, capsys.readouterr().err.strip(), ledger


def test_sites_release_what_the_same_rows_in_one_file_release(ray_session, tmp_path, capsys):
    """Seeded, central: three sites on their node release exactly the counts of the same rows
    given as one path (the sum does not depend on how holders are dealt to shards); the
    counts the report shows are the sums over the sites, each site's shown too. Every record
    is kept (the bound above the largest holder): which records a holder above the bound
    keeps is drawn from its shard's secret, and the shards differ between the two layouts."""
    folder = str(tmp_path)
    where = _write_sites(folder)
    label = _node_label(ray_session)
    sites = {n: {"path": p, "labels": label} for n, p in where.items()}
    runs = {}
    for name, private in (("sites", {"sites": sites}),
                          ("one", {"sites": None, "path": f"{folder}/private.parquet"})):
        cfg = _config(folder, sites, run={"progress": False, "rng": "seeded"})
        cfg["data"]["private"] = {**cfg["data"]["private"], **private}
        cfg["data"]["max_records_per_client"] = 600
        rc, err, _ = _main(tmp_path, cfg, name, capsys, ["--insecure-seeded"])
        assert rc == 0, err
        runs[name] = (json.load(open(tmp_path / name / "report.json")),
                      np.load(tmp_path / name / "release.npz"))
    (rs, zs), (r1, z1) = runs["sites"], runs["one"]
    for k in ("holders", "records", "kept", "largest_holder"):
        assert rs["counts"]["holders"][k] == r1["counts"]["holders"][k], k
    per_site = rs["counts"]["holders"]["sites"]
    assert sum(s["holders"] for s in per_site.values()) == r1["counts"]["holders"]["holders"]
    assert sum(s["records"] for s in per_site.values()) == r1["counts"]["records"]
    assert "which site holds each holder is public" in rs["privacy"]["relation"]
    assert rs["counts"]["clients"] == r1["counts"]["clients"]
    counts = [k for k in zs.files if "count" in k]
    assert counts, zs.files
    for k in counts:
        np.testing.assert_array_equal(zs[k], z1[k])
    node = label["ray.io/node-id"]
    assert all(rs["placement"][f"{p}@{n}"] == [node] for n in SITES for p in ("scan", "client"))
    # the console's summary and the report page show each site's counts and node (issue 57)
    from jobs.distill import site_lines
    from jobs.report import main as report_main
    assert site_lines(rs) == [f"site {n}: {per_site[n]['records']} records of "
                              f"{per_site[n]['holders']} holders, read on node {node[:12]}"
                              for n in sorted(SITES)]
    capsys.readouterr()
    assert report_main([str(tmp_path / "sites")]) == 0
    page = capsys.readouterr().out
    assert all(f"  site {n}  " in page for n in SITES) and "Placement:" in page
    assert f"scan@{sorted(SITES)[0]}" in page and node[:12] in page


@pytest.mark.parametrize("case", ["no node", "missing path", "empty site", "holder on two sites",
                                  "strings at a site", "integers at a site"])
def test_a_bad_site_is_one_line_exit_2_before_any_reservation(case, ray_session, tmp_path,
                                                              capsys):
    from rknn_ray.accounting.budget_store import BudgetStore
    folder = str(tmp_path)
    where = _write_sites(folder, holders=30, n_private=200)
    label = _node_label(ray_session)
    sites = {n: {"path": p, "labels": label} for n, p in where.items()}
    if case == "no node":
        sites["b"]["labels"] = {"site": "b"}
    elif case == "missing path":
        shutil.rmtree(where["b"])
    elif case == "empty site":
        part = pq.read_table(f"{where['b']}/part.parquet")
        pq.write_table(part.slice(0, 0), f"{where['b']}/part.parquet")
    elif case in ("strings at a site", "integers at a site"):     # issue 57: they ran to the end
        part = pq.read_table(f"{where['b']}/part.parquet")
        column = part.column_names[0]
        to = pa.string() if case == "strings at a site" else pa.int64()
        part = part.set_column(0, column, part.column(0).cast(to))
        pq.write_table(part, f"{where['b']}/part.parquet")
    else:                           # site c also holds some of site a's holders
        a = pq.read_table(f"{where['a']}/part.parquet")
        pq.write_table(a.slice(0, 10), f"{where['c']}/extra.parquet")
    rc, err, ledger = _main(tmp_path, _config(folder, sites), "run", capsys)
    assert rc == 2 and err.startswith("error: ") and "\n" not in err, err
    words = {"no node": ("data.private.sites.b", "ray start --address=<head> --labels site=b"),
             "missing path": ("data.private.sites.b.path", "does not exist on the site's node"),
             "empty site": ("data.private.sites.b", "holds no rows"),
             "holder on two sites": ("sites 'a' and 'c' both hold", "Fix:"),
             "strings at a site": ("data.private.sites.b", "string (site 'a': double)",
                                   "same columns and types"),
             "integers at a site": ("data.private.sites.b", "int64 (site 'a': double)",
                                    "same columns and types")}[case]
    assert all(w in err for w in words), err
    assert not re.search(r"\brow \d", err) and not re.search(r"\bh\d+\b", err), err
    assert not ledger.exists() or BudgetStore(str(ledger)).datasets() == []
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ rknn-ray cluster's nodes
def test_a_cluster_node_takes_a_site_label_or_resource_and_bad_ones_exit_2():
    from jobs.local_cluster import parse_node
    assert parse_node("server+shuffler+client:site=a") == (("server", "shuffler", "client"),
                                                           {"site": "a"}, {})
    assert parse_node("client:@site_b=1,zone=x") == (("client",), {"zone": "x"},
                                                      {"site_b": 1.0})
    for spec, words in (("client:site", "not key=value"), ("client:@site_b=0", "positive"),
                        ("client:rknn-party=x", "set by the roles"), (":site=a", "at least one role")):
        done = subprocess.run([sys.executable, "-m", "jobs.local_cluster", "--node", spec, "--",
                               "true"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr, (spec, done.stderr[-500:])


# ------------------------------------------------------------------ three real nodes
def _ptrace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=%file", "-o", os.devnull, "true"],
                          capture_output=True, timeout=30)
    return done.returncode == 0


@pytest.mark.skipif(not _ptrace_works(), reason="needs strace and ptrace (apt-get install strace)")
def test_three_nodes_each_read_their_own_site_and_the_driver_opens_none(tmp_path):
    """``rknn-ray cluster`` with three nodes whose private folders differ (node A: server and
    site a; B: site b; C: site c). The job succeeds; each site's scan and shards report the
    node with the site's label; and the driver's process, run under ``strace -f -e
    trace=%file`` (every file-name system call of the driver and any child it starts, pyarrow's
    C++ opens included: the public file's open is seen), never names a site's folder and
    starts no raylet of its own (it joins the cluster)."""
    folder = str(tmp_path)
    where = _write_sites(folder)
    sites = {n: {"path": p, "labels": {"site": n}} for n, p in where.items()}
    cfg = _config(folder, sites, cluster={"placement": {"client": {"resources": {"client": 1}},
                                                        "server": {"resources": {"server": 1}}}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    trace, labels = tmp_path / "driver.trace", tmp_path / "labels.json"
    cmd = [sys.executable, "-m", "jobs.local_cluster", "--node", "server+shuffler+client:site=a",
           "--node", "client:site=b", "--node", "client:site=c", "--labels-json", str(labels),
           "--", "strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=%file", "-o", str(trace),
           sys.executable, "-m", "jobs.distill", "--config", str(tmp_path / "job.yaml"),
           "--out", str(tmp_path / "run"), "--quiet"]
    done = _run_in_own_group(cmd, timeout=240,
                             extra_env={"RKNN_RAY_LEDGER": str(tmp_path / "ledger.sqlite")})
    err = done.stderr
    assert done.returncode == 0, err[-4000:]
    report = json.load(open(tmp_path / "run" / "report.json"))
    site_of = {node: lab.get("site") for node, lab in json.load(open(labels)).items()}
    assert sorted(site_of.values()) == sorted(SITES)
    placement = report["placement"]
    for name in SITES:                  # as each actor itself reported its node
        for party in ("scan", "client"):
            nodes = placement[f"{party}@{name}"]
            assert nodes and all(site_of[n] == name for n in nodes), (party, name, placement)
    assert [site_of[n] for n in placement["server"]] == ["a"]
    per_site = report["counts"]["holders"]["sites"]
    assert sum(s["holders"] for s in per_site.values()) == report["counts"]["holders"]["holders"]
    text = trace.read_text()
    assert f'"{folder}/public.parquet"' in text and "openat(" in text   # the tracer saw pyarrow
    for name, path in where.items():
        assert path not in text, f"the driver touched site {name}'s folder"
    assert not re.search(r'execve\("[^"]*(raylet|gcs_server)', text), "the driver started Ray"


def test_neighbours_on_sites_show_every_party_the_same(ray_session, tmp_path, capsys):
    """D and D' (one record's value on site b replaced, its holder and site unchanged), the
    same seeds: exit code, console (the per-site counts included), report counts, guarantees
    and ledger are equal (tests/test_table_holders.py's views); only the release differs."""
    from rknn_ray.accounting.budget_store import BudgetStore
    from tests.test_table_holders import _views
    label = _node_label(ray_session)
    jobs = []
    for name in ("d", "d2"):
        folder = str(tmp_path / name)
        where = _write_sites(folder, holders=30, n_private=300)
        if name == "d2":
            part = pq.read_table(f"{where['b']}/part.parquet")
            p0 = part.column("p10").to_numpy().copy()
            p0[3] = p0[3] + 7.0                        # one record's value, nothing else
            pq.write_table(part.set_column(part.schema.get_field_index("p10"), "p10",
                                           pa.array(p0)), f"{where['b']}/part.parquet")
        sites = {n: {"path": p, "labels": label} for n, p in where.items()}
        cfg = _config(folder, sites, run={"progress": True, "seed": 3})
        path, ledger = os.path.join(folder, "job.yaml"), os.path.join(folder, "l.sqlite")
        with open(path, "w") as f:
            yaml.safe_dump(cfg, f)
        from jobs.distill import main
        rc = main(["--config", path, "--out", os.path.join(folder, "run"), "--ledger", ledger])
        out = capsys.readouterr()
        report = json.load(open(os.path.join(folder, "run", "report.json"))) if rc == 0 else None
        jobs.append((rc, (out.out + out.err).splitlines(), report,
                     BudgetStore(ledger).datasets(), folder))
    assert jobs[0][0] == 0, "\n".join(jobs[0][1][-20:])
    a, b = _views(jobs[0]), _views(jobs[1])
    assert a == b
    assert any("site b:" in line for line in a["console"]), a["console"]

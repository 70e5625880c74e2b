"""A real multi-node Ray cluster on this machine (issue 20 item 4): the server, the shuffler and
the client shards each on a node of its own (own raylet, object store and node id), placed by
cluster.placement; every actor reports the node it runs on; the seeded release equals the
same round's release on one node. Plus the placement's config, its refusal when no node can
host a party, and cluster.yaml placing the parties the same way."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
CLIENTS, BATCH = 2000, 500          # 4 sealed batches per round cross from node to node


def _run_in_own_group(cmd: list[str], timeout: float,
                      extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a process group of its own and end that whole group afterwards: the
    nodes a local cluster starts are its children there, so they go too, even on a timeout."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra_env or {})
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[1:4])} did not finish in {timeout} s: {err[-2000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)      # anything of the cluster still exiting
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_parties_run_on_their_own_nodes_and_release_what_one_node_releases(ray_session):
    done = _run_in_own_group([sys.executable, "-m", "benchmarks.scale", "--clients", str(CLIENTS),
                              "--batch", str(BATCH), "--nodes", "3", "--rng", "seeded", "--json"],
                             timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    multi = json.loads(done.stdout)
    nodes = multi["nodes"]              # node id -> roles, from the nodes the run started
    assert len(nodes) == 3 and sorted(r for roles in nodes.values() for r in roles) == \
        ["client", "server", "shuffler"]
    placement = multi["placement"]      # party -> node ids, as each actor reported it
    assert set(placement) == {"client", "shuffler", "server"}
    for party, ids in placement.items():
        assert ids and all(party in nodes[i] for i in ids), (party, ids, nodes)
    assert len({i for ids in placement.values() for i in ids}) == 3      # three nodes
    assert multi["messages"] == multi["senders"] == CLIENTS
    assert sum(multi["rejected"].values()) == 0

    from benchmarks import scale        # the same seeded round on one node: this session's Ray
    single = scale._actors_round(CLIENTS, BATCH, 2, 5_000_000, ["run.rng=seeded"])
    assert len({i for ids in single["placement"].values() for i in ids}) == 1
    np.testing.assert_array_equal(np.asarray(multi["release"]), single["counts"])
    assert single["messages"] == CLIENTS
    # the round alone is timed inside the whole run (actor start-up and shutdown outside it)
    assert 0 < single["round_wall_s"] < single["wall_s"]


def test_a_placement_no_node_can_host_is_refused_before_any_actor(ray_session):
    from rknn_ray.job.placement import check_placement_feasible, party_options
    cfg = load_config(None, ["privacy.model=shuffle", "privacy.mechanism=collision",
                             "privacy.delta=1e-6",
                             "cluster.placement.shuffler={resources: {shuffler: 1}}",
                             "cluster.placement.server={labels: {rknn-party: server}}"])
    assert party_options(cfg, "shuffler") == {"resources": {"shuffler": 1}}
    assert party_options(cfg, "server") == {"label_selector": {"rknn-party": "server"}}
    assert party_options(cfg, "client") == {}              # not placed: anywhere
    check_placement_feasible(cfg, ["client"])               # nothing asked of the client nodes
    with pytest.raises(ConfigError) as err:
        check_placement_feasible(cfg, ["client", "shuffler", "server"])
    assert err.value.key == "cluster.placement.shuffler"
    assert "no live node" in err.value.problem and "ray start" in err.value.fix
    assert "--resources '{\"shuffler\": 1}'" in err.value.fix


def test_the_default_places_nothing_so_one_machine_runs_unchanged():
    from rknn_ray.job.placement import party_options
    cfg = load_config(None, [])
    assert dict(cfg.cluster.placement) == {}
    assert all(party_options(cfg, p) == {} for p in ("client", "shuffler", "server"))


@pytest.mark.parametrize("override, key", [
    ("cluster.placement.clients={resources: {client: 1}}", "cluster.placement.clients"),
    ("cluster.placement.client={resources: {CPU: 1}}", "cluster.placement.client.resources.CPU"),
    ("cluster.placement.client={resources: {client: 0}}", "cluster.placement.client.resources.client"),
    ("cluster.placement.client={resources: [client]}", "cluster.placement.client.resources"),
    ("cluster.placement.client={nodes: 2}", "cluster.placement.client"),
    ("cluster.placement.client={labels: {rknn-party: [a]}}", "cluster.placement.client.labels.rknn-party"),
])
def test_a_bad_placement_names_its_key_and_the_fix(override, key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert err.value.key == key and err.value.fix


def test_local_cluster_cli_refuses_bad_input_with_exit_2():
    for args, words in ((["--node", "server"], "no command"),
                        (["--node", "sever", "--", "true"], "unknown role")):
        done = subprocess.run([sys.executable, "-m", "jobs.local_cluster", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and words in done.stderr


def test_roles_and_overrides_for_n_nodes():
    from jobs.local_cluster import placement_overrides, roles_for
    assert roles_for(1) == [("client", "shuffler", "server")]
    assert roles_for(4) == [("server",), ("shuffler",), ("client",), ("client",)]
    cfg = load_config(None, placement_overrides(roles_for(3)))
    assert {p: dict(v["resources"]) for p, v in cfg.cluster.placement.items()} == \
        {"client": {"client": 1}, "shuffler": {"shuffler": 1}, "server": {"server": 1}}


def test_cluster_yaml_gives_every_party_a_node_type_with_its_resource_and_label():
    config = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    types = config["available_node_types"]
    for party in ("client", "shuffler", "server"):
        hosts = [name for name, t in types.items() if party in t.get("resources", {})]
        assert len(hosts) == 1, (party, hosts)
        node = types[hosts[0]]
        assert node.get("labels", {}).get("rknn-party") == party
        assert hosts[0] == config["head_node_type"] or node["min_workers"] >= 1
    assert "cluster.placement" in (ROOT / "cluster.yaml").read_text()


def test_report_placement_is_the_union_over_rounds():
    from rknn_ray.job.placement import merge_placements
    rounds = [{"client": ["b", "a"], "server": ["s"]}, None, {"client": ["c"], "shuffler": ["h"]}]
    assert merge_placements(rounds) == {"client": ["a", "b", "c"], "server": ["s"], "shuffler": ["h"]}

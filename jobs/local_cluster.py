"""A Ray cluster of several nodes on this one machine: the parties on nodes of their own.

    python -m jobs.local_cluster --node server --node shuffler --node client \\
        [--cpus 1] [--nodes-json FILE] -- python -m jobs.distill --config ... \\
        --set 'cluster.placement={client: {resources: {client: 1}}, ...}'

A node may carry more than its roles: ``--node 'client:site=b'`` gives it the node label
``site=b`` and ``--node 'client:@site_b=1'`` the custom resource ``site_b`` (both as ``ray
start --labels`` / ``--resources`` would), so a ``data.private.sites`` entry can name it
(private data on its holders' own nodes, docs/running.md).

runs the command against a fresh cluster (``RAY_ADDRESS`` and a fresh auth token in its
environment) and takes the cluster down when the command ends, fails or is interrupted.
``--dashboard`` gives the head Ray's dashboard on 127.0.0.1 (the Jobs API ``ray job submit``
talks to), so the cluster recipe can be tried on one machine:

    python -m jobs.local_cluster --dashboard -- ray job submit --working-dir . -- \
        python -m jobs.distill --config jobs/configs/digits_central.yaml

(a command starting with ``ray job`` turns it on by itself). ``--serve`` keeps the cluster
up, prints the environment to reach it from other terminals, and stops it on Ctrl-C.
Every node is a real Ray node: its own raylet, object store and node id; objects between
actors on different nodes travel through Ray's object manager (TCP on 127.0.0.1), as they
do between machines. A node started for a role gets the custom resource ``{role: 64}``
(64 slots: several shards may share a client node) and the label ``rknn-party=role``, so
either kind of ``cluster.placement`` entry finds it.

Why not ``ray start --address`` per node: on one machine that cannot stay on loopback. Ray
2.60's CLI refuses to start a worker node with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
(what binds a local instance to 127.0.0.1), and without it rewrites 127.0.0.1 to the
machine's network address and binds every interface (checked here). ``ray.cluster_utils.Cluster``
starts the same node processes (``ray._private.node.Node``, what ``ray start`` runs) with
loopback kept; on a real cluster use ``ray start`` / ``cluster.yaml`` (docs/running.md).
"""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

from rknn_ray.runio import write_json

PARTIES = ("client", "shuffler", "server")
ROLE_SLOTS = 64          # a role's resource on its node: up to 64 actors of that party
ROLE_LABEL = "rknn-party"
START_TIMEOUT_S = 120    # nodes register slowly on a machine whose cores are busy


def roles_for(nodes: int) -> list[tuple[str, ...]]:
    """Roles per node for ``nodes`` nodes: head = server, then the shuffler, then client
    nodes (1 node: everything; 2: server and shuffler share the head)."""
    if nodes < 1:
        raise ValueError(f"a cluster needs at least 1 node, got {nodes}")
    if nodes == 1:
        return [PARTIES]
    if nodes == 2:
        return [("server", "shuffler"), ("client",)]
    return [("server",), ("shuffler",)] + [("client",)] * (nodes - 2)


def parse_node(spec: str) -> tuple[tuple[str, ...], dict, dict]:
    """``ROLES[:EXTRA,...]`` -> (roles, node labels, custom resources): ROLES joined by +;
    an EXTRA ``key=value`` is a node label, ``@name=N`` a custom resource of N. ValueError
    (the CLI's exit 2) names what is wrong."""
    head, _, tail = spec.partition(":")
    roles = tuple(r for r in head.split("+") if r)
    labels, resources = {}, {}
    for item in filter(None, (x.strip() for x in tail.split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip("@") or not value:
            raise ValueError(f"{item!r} in --node {spec!r} is not key=value (a label) or "
                             "@name=N (a resource)")
        if name.startswith("@"):
            try:
                amount = float(value)
            except ValueError:
                raise ValueError(f"resource {name[1:]!r} in --node {spec!r}: {value!r} is not a "
                                 "number") from None
            if amount <= 0 or name[1:] in PARTIES or name[1:] in ("CPU", "GPU", "memory"):
                raise ValueError(f"resource {name[1:]!r} in --node {spec!r}: give a custom "
                                 "resource (not a role or CPU/GPU/memory) a positive amount")
            resources[name[1:]] = amount
        elif name == ROLE_LABEL or name.startswith("ray.io/"):
            raise ValueError(f"label {name!r} in --node {spec!r} is set by the roles / by Ray")
        else:
            labels[name] = value
    return roles, labels, resources


def placement_overrides(roles: list[tuple[str, ...]]) -> list[str]:
    """``--set`` overrides that put each party on the nodes holding its role's resource."""
    present = {r for node in roles for r in node}
    return [f"cluster.placement.{p}={{resources: {{{p}: 1}}}}" for p in PARTIES if p in present]


class LocalCluster:
    """Nodes with the given roles on 127.0.0.1; a context manager (stops them on exit).

    ``address`` is the GCS address for ``ray.init`` / ``RAY_ADDRESS``; ``env`` what a child
    process needs to join (the address and the cluster's auth token); ``node_roles()`` maps
    each live Ray node id to the roles it was started with. The nodes' processes are this
    process's children, in its process group: ending that group ends them all.
    """

    def __init__(self, roles: list[tuple[str, ...]], cpus: float = 1.0,
                 object_store_mb: int = 150, temp_dir: str | None = None,
                 dashboard: bool = False, extras: list[tuple[dict, dict]] | None = None):
        self.roles, self.cpus, self.object_store_mb = roles, cpus, object_store_mb
        # per node: (its extra node labels, its extra custom resources), e.g. a site's
        self.extras = extras or [({}, {})] * len(roles)
        self.dashboard, self.dashboard_port = dashboard, None
        self._own_temp = temp_dir is None
        self.temp_dir = temp_dir or tempfile.mkdtemp(prefix="rkc", dir="/tmp")   # short: socket paths
        self.cluster = None
        self._saved_tmp, self._tmp_set = None, False
        self.env: dict[str, str] = {}

    def start(self) -> "LocalCluster":
        # defers cryptography, dp_accounting, faiss, ray, tqdm
        from rknn_ray.job.ray_env import local_ray_env
        local_ray_env()                         # loopback, token auth (before Ray starts nodes)
        os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
        # Ray's Cluster records its head as "the machine's current cluster" in the default temp
        # folder, where every plain ray.init() here would then join it (other users' jobs and
        # tests included): keep that record inside our own folder instead
        self._saved_tmp, self._tmp_set = os.environ.get("RAY_TMPDIR"), True
        os.environ["RAY_TMPDIR"] = self.temp_dir
        os.makedirs(os.path.join(self.temp_dir, "ray"), exist_ok=True)
        # Ray's private API: a Ray that moved it fails only this call
        from ray._common.network_utils import find_free_port
        from ray.cluster_utils import Cluster
        self.dashboard_port = find_free_port()
        self.cluster = Cluster()
        try:
            for i, roles in enumerate(self.roles):
                # the head's fixed default ports would clash with other Ray instances here
                head = {"include_dashboard": self.dashboard, "dashboard_host": "127.0.0.1",
                        "dashboard_port": self.dashboard_port,
                        "dashboard_agent_listen_port": find_free_port()} if i == 0 else {}
                self.cluster.add_node(     # the head first; the workers then start together
                    wait=i == 0, num_cpus=self.cpus,
                    object_store_memory=self.object_store_mb * 2 ** 20,
                    resources={**{r: ROLE_SLOTS for r in roles}, **self.extras[i][1]},
                    labels={**self.extras[i][0], ROLE_LABEL: "+".join(roles)},
                    temp_dir=self._node_temp_dir(i), **head)
            self.cluster.wait_for_nodes(timeout=START_TIMEOUT_S)
            # a job submitted to the head finds "its" cluster through the record in the head's
            # temp folder (Ray's job supervisor asks for address "auto" there); without it Ray
            # falls back to any GCS process on the machine: another user's instance
            from ray._private.utils import write_ray_address
            write_ray_address(self.cluster.address, self.temp_dir)
        except BaseException:
            self.stop()
            raise
        self.env = {"RAY_ADDRESS": self.address, "RAY_AUTH_TOKEN": os.environ["RAY_AUTH_TOKEN"],
                    "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
                    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        return self

    @property
    def address(self) -> str:
        return self.cluster.address

    def _node_temp_dir(self, index: int) -> str:
        """The head uses the cluster's folder, each worker node a folder of its own: nodes that
        shared one would share its runtime-env folder, and a worker node unpacking a job's
        working_dir there deletes it under the job's driver on the head (on separate
        machines, as in a real cluster, they never meet)."""
        if index == 0:
            return self.temp_dir
        path = os.path.join(self.temp_dir, f"n{index}")
        os.makedirs(path, exist_ok=True)
        return path

    @property
    def dashboard_url(self) -> str | None:
        """The head's dashboard (Jobs API) on loopback, when started with ``dashboard=True``."""
        return f"http://127.0.0.1:{self.dashboard_port}" if self.dashboard else None

    def node_roles(self) -> dict[str, list[str]]:
        """Ray node id -> the roles that node was started with (from each node's own record)."""
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        return {n.node_id: [r for r in PARTIES if r in n._ray_params.resources] for n in nodes}

    def node_labels(self) -> dict[str, dict[str, str]]:
        """Ray node id -> the labels that node was started with (its roles' and its own)."""
        nodes = [self.cluster.head_node, *self.cluster.worker_nodes]
        return {n.node_id: dict(n._ray_params.labels or {}) for n in nodes}

    def stop(self) -> None:
        """Stop every node this object started (their own processes only; never `ray stop`)."""
        try:
            if self.cluster is not None:
                import ray  # defers ray, tqdm
                cluster, self.cluster = self.cluster, None
                if ray.is_initialized() and ray.get_runtime_context().gcs_address == cluster.address:
                    ray.shutdown()              # a driver on one of our nodes must leave first
                cluster.shutdown()
        finally:
            if self._tmp_set:
                _restore("RAY_TMPDIR", self._saved_tmp)
                self._tmp_set = False
            if self._own_temp:
                shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _restore(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


EXAMPLES = """\
examples:
  rknn-ray cluster -- python -m jobs.distill --config digits_central
  rknn-ray cluster --node server --node shuffler+client -- \\
      python -m jobs.distill --config digits_shuffle
  python -m jobs.local_cluster -- ray status     # the same command
  rknn-ray cluster --node server+shuffler+client:site=a --node client:site=b \\
      --node client:site=c -- python -m jobs.distill --config my_sites.yaml"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray cluster", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--node", action="append", default=[], metavar="ROLES",
                    help="one node per flag: its roles, e.g. server or server+shuffler "
                         f"(from {list(PARTIES)}), then optionally :key=value (a node label) "
                         "or :@name=N (a custom resource), comma-separated, e.g. "
                         "client:site=b; default: server, shuffler, client")
    ap.add_argument("--cpus", type=float, default=1.0, help="Ray CPUs per node")
    ap.add_argument("--object-store-mb", type=int, default=150, help="object store per node (MB)")
    ap.add_argument("--nodes-json", default=None,
                    help="write {node id: roles} here once the cluster is up")
    ap.add_argument("--labels-json", default=None,
                    help="write {node id: {label: value}} here once the cluster is up")
    ap.add_argument("--dashboard", action="store_true",
                    help="start Ray's dashboard on 127.0.0.1 (the Jobs API: ray job submit); "
                         "on by itself for --serve and for a command starting with `ray job`")
    ap.add_argument("--serve", action="store_true",
                    help="no command: keep the cluster up until Ctrl-C and print how to reach it")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if command and args.serve:
        ap.error("--serve keeps the cluster up for other terminals: give it no command")
    if not command and not args.serve:
        ap.error("no command: write -- and the command to run on the cluster, e.g. "
                 "-- python -m jobs.distill --config jobs/configs/digits_shuffle.yaml "
                 "(or --serve to keep the cluster up)")
    dashboard = args.dashboard or args.serve or _submits_a_job(command)
    try:
        nodes = [parse_node(n) for n in args.node]
    except ValueError as exc:
        ap.error(str(exc))
    roles = [n[0] for n in nodes] or [("server",), ("shuffler",), ("client",)]
    extras = [(n[1], n[2]) for n in nodes] or None
    if any(not r for r in roles):
        ap.error("a --node needs at least one role before its labels, e.g. client:site=b")
    bad = sorted({r for node in roles for r in node} - set(PARTIES))
    if bad:
        ap.error(f"unknown role(s) {bad}: use {list(PARTIES)}, joined by + for a shared node")
    # SIGTERM (a test's timeout, `kill`) must take the nodes down too: make it an exception
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with LocalCluster(roles, args.cpus, args.object_store_mb, dashboard=dashboard,
                      extras=extras) as cluster:
        if args.nodes_json:
            write_json(args.nodes_json, cluster.node_roles())
        if args.labels_json:
            write_json(args.labels_json, cluster.node_labels())
        print(f"local cluster up: {len(roles)} nodes at {cluster.address}; placement: "
              + " ".join(f"--set '{o}'" for o in placement_overrides(roles)), file=sys.stderr)
        if cluster.dashboard_url:
            print(f"dashboard and Jobs API: {cluster.dashboard_url}", file=sys.stderr)
        if args.serve:
            return _serve(cluster)
        env = {**os.environ, **cluster.env}
        env.pop("RAY_TMPDIR", None)             # the command's own Ray files go where they would
        if cluster._saved_tmp is not None:
            env["RAY_TMPDIR"] = cluster._saved_tmp
        return subprocess.run(command, env=env).returncode


def _submits_a_job(command: list[str]) -> bool:
    """True for ``ray job ...`` (the Jobs API needs the head's dashboard)."""
    words = [os.path.basename(w) for w in command[:2]]
    return words == ["ray", "job"]


def _serve(cluster: LocalCluster) -> int:
    """Keep the cluster up until Ctrl-C / SIGTERM; say how other terminals reach it (the
    token is this cluster's own, made for it and gone with it)."""
    exports = {**cluster.env, "RAY_ADDRESS": cluster.dashboard_url}
    print("in another terminal:\n  export " + " ".join(f"{k}={v}" for k, v in exports.items())
          + "\n  ray job submit --working-dir . -- python -m jobs.distill --config "
          "jobs/configs/digits_central.yaml\nCtrl-C stops the cluster.", file=sys.stderr,
          flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

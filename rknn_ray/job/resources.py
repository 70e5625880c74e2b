"""Will the job's actors fit the cluster? Checked by the job layer before any budget is
reserved: Ray would otherwise wait forever for CPUs it does not have. Ray-free, so a CLI
checks it before starting Ray.
"""
from __future__ import annotations

import math

from rknn_ray.errors import ConfigError


def shard_count(cfg) -> int:
    """The job's client shards: ``cluster.shards``, or with ``data.private.sites`` each site's
    ``shards`` summed (docs/running.md, "Private data on its holders' nodes")."""
    private = getattr(cfg.data, "private", None) or {}
    sites = private.get("sites") if hasattr(private, "get") else None
    if sites:
        return sum(int(site.get("shards") or 1) for site in sites.values())
    return int(cfg.cluster.shards)


def protocol_cpus(cfg) -> float:
    """CPUs the protocol's actors reserve (rknn_ray/job/session.py): every ClientShard
    ``cluster.shard_cpus``, the Server ``cluster.server_cpus``, and in the shuffle model
    max(1, onion_layers) Shuffler hops ``cluster.shuffler_cpus`` each."""
    cl = cfg.cluster
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    return shard_count(cfg) * cl.shard_cpus + cl.server_cpus + hops * cl.shuffler_cpus


def validate_resources(cfg, available_cpus: float) -> None:
    """The protocol's actors and the student's workers must fit the cluster's CPUs (Ray would
    wait for them forever); checked before any budget is reserved."""
    st = cfg.student
    if st.trainer in ("ray", "auto") and st.method != "semi" and not st.use_gpu and \
            st.num_workers > available_cpus + 1e-9:
        raise ConfigError("student.num_workers", f"{st.num_workers} Ray Train workers need "
                          f"{st.num_workers} CPUs but the cluster has {available_cpus:g}",
                          f"set student.num_workers<={max(1, int(available_cpus))} (with --resume "
                          "RUN: --resume RUN --set student.num_workers=N)")
    need = protocol_cpus(cfg)
    if need <= available_cpus + 1e-9:
        return
    cl = cfg.cluster
    hops = max(1, cfg.shuffle.onion_layers) if cfg.privacy.model == "shuffle" else 0
    fixed = cl.server_cpus + hops * cl.shuffler_cpus
    fits = math.floor((available_cpus - fixed) / cl.shard_cpus + 1e-9)
    what = ("the sites' shards (data.private.sites.<site>.shards) in all"
            if (cfg.data.private or {}).get("sites") else "cluster.shards")
    fix = (f"set {what} <= {fits} (or lower cluster.shard_cpus)" if fits >= 1 else
           f"lower cluster.server_cpus / cluster.shuffler_cpus / cluster.shard_cpus, or use a "
           f"cluster with at least {need:g} CPUs")
    raise ConfigError("cluster.shards", f"the protocol reserves {shard_count(cfg)} shards x "
                      f"{cl.shard_cpus:g} CPU + server {cl.server_cpus:g} + {hops} shuffler(s) x "
                      f"{cl.shuffler_cpus:g} = {need:g} CPUs, but the cluster has {available_cpus:g}",
                      fix)

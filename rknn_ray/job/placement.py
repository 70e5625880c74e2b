"""Where the protocol's parties run: ``cluster.placement`` turned into Ray actor options.

Each party (the client shards, the shuffler chain, the server) may require a node with
given Ray custom resources (``ray start --resources``) and/or node labels (``ray start
--labels``); the reports then cross node boundaries through Ray's object store, as they
would between real parties. ``ask_node`` asks an actor which node it runs on.
"""
from __future__ import annotations

import json

import ray

from rknn_ray.errors import ConfigError


def party_options(cfg, party: str) -> dict:
    """Ray actor options that put ``party``'s actors on a node ``cluster.placement`` names
    (custom resources and/or node labels); {} lets Ray place it anywhere."""
    need = cfg.cluster.placement.get(party)
    options = {}
    if need and need["resources"]:
        options["resources"] = dict(need["resources"])
    if need and need["labels"]:
        options["label_selector"] = dict(need["labels"])
    return options


def check_placement_feasible(cfg, parties) -> None:
    """Refuse a placement no live node satisfies before any actor is made: Ray would otherwise
    wait forever for a node that never comes (ConfigError: exit 2, naming the node to start)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for party in parties:
        need = cfg.cluster.placement.get(party)
        if need:
            _refuse_unless_a_node_has(f"cluster.placement.{party}", need, nodes,
                                      f"or remove cluster.placement.{party}")


def _refuse_unless_a_node_has(key: str, need, nodes: list, other_fix: str) -> None:
    if any(_satisfies(n, need) for n in nodes):
        return
    res, labels = dict(need["resources"]), dict(need["labels"])
    flags = ([f"--resources '{json.dumps(res)}'"] if res else []) + (
        [f"--labels {','.join(f'{k}={v}' for k, v in labels.items())}"] if labels else [])
    raise ConfigError(key, f"no live node of this Ray cluster has {_wants(res, labels)} (nodes: "
                      f"{'; '.join(_describe(n) for n in nodes)})",
                      f"start one with `ray start --address=<head> {' '.join(flags)}`, "
                      f"{other_fix}")


# ---------------------------------------------------------------- data.private.sites
def site_need(cfg, site) -> dict:
    """What a node must offer to host ``site``'s scan and shards: what
    ``cluster.placement.client`` asks of every client node, and what the site asks
    (rknn_ray.data.tables.Site: its labels and resources; the site's value wins a clash)."""
    client = cfg.cluster.placement.get("client") or {"resources": {}, "labels": {}}
    own = site.need
    return {"resources": {**dict(client["resources"]), **own["resources"]},
            "labels": {**dict(client["labels"]), **own["labels"]}}


def _need_options(need: dict) -> dict:
    options = {}
    if need["resources"]:
        options["resources"] = dict(need["resources"])
    if need["labels"]:
        options["label_selector"] = dict(need["labels"])
    return options


def site_options(cfg, site) -> dict:
    """Ray actor options that put an actor on one of ``site``'s nodes (:func:`site_need`)."""
    return _need_options(site_need(cfg, site))


def shard_options(cfg, source) -> dict:
    """A client shard's placement options: its site's nodes when its source reads one site's
    part (data.private.sites), else ``cluster.placement.client``'s."""
    site = getattr(source, "site", None)
    return site_options(cfg, site) if site is not None else party_options(cfg, "client")


def check_sites_feasible(cfg, sites) -> None:
    """Refuse a site no live node can host (its labels / resources together with
    ``cluster.placement.client``'s) before any actor is made: ConfigError naming the site and
    the ``ray start`` flags of the node that is missing."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for site in sites:
        _refuse_unless_a_node_has(site.key, site_need(cfg, site), nodes,
                                  f"on the machine that holds site {site.name}'s files "
                                  f"({site.path}), or correct {site.key}")


def _satisfies(node: dict, need) -> bool:
    return (all(node["Resources"].get(k, 0) >= v for k, v in need["resources"].items())
            and all(node.get("Labels", {}).get(k) == v for k, v in need["labels"].items()))


def _wants(res: dict, labels: dict) -> str:
    return " and ".join(([f"resources {res}"] if res else []) + ([f"labels {labels}"] if labels else []))


def _describe(node: dict) -> str:
    """A node's id prefix, custom resources and labels (what a placement can ask for)."""
    own = [f"{k}={v:g}" for k, v in node["Resources"].items()
           if k not in ("CPU", "GPU", "memory", "object_store_memory") and not k.startswith("node:")]
    own += [f"label {k}={v}" for k, v in node.get("Labels", {}).items() if not k.startswith("ray.io/")]
    return f"{node['NodeID'][:8]} ({', '.join(own) or 'nothing custom'})"


def ask_node(actor):
    """The Ray node id ``actor`` runs on, as the actor itself reports it (an object ref).

    The function travels by value (a lambda), so the actor's process needs no copy of
    this module."""
    return actor.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())


def placement_of(parties: dict[str, list]) -> dict[str, list[str]]:
    """party -> sorted node ids of its actors; an actor that does not answer is left out."""
    asked = {party: [ask_node(a) for a in actors] for party, actors in parties.items()}
    out = {}
    for party, refs in asked.items():
        ids = set()
        for ref in refs:
            try:
                ids.add(ray.get(ref, timeout=60))
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                continue
        if ids:
            out[party] = sorted(ids)
    return out


def merge_placements(placements) -> dict[str, list[str]]:
    """The union over rounds (a restarted shard may come back on another node)."""
    out: dict[str, set] = {}
    for p in placements:
        for party, ids in (p or {}).items():
            out.setdefault(party, set()).update(ids)
    return {party: sorted(ids) for party, ids in out.items()}

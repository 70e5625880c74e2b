"""One round of the protocol on Ray actors: shards -> (shuffler) -> server.

The driver only wires actors together: ciphertext batches move from each
ClientShard to the Server (or the Shuffler) as Ray object references, never
through the driver's own memory. Actors are ended when the round is done so
Ray Train gets the CPUs.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

import numpy as np
import ray

from actors.client_shard import ClientShard
from actors.server import Server
from rknn_ray.errors import PrivacyBudgetError
from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import Guarantee
from rknn_ray.pipeline import PreparedData, mechanism_params
from rknn_ray.rng import derived_seed, new_client_secret
from sealing.envelope import RoundContext
from actors.shuffler import Shuffler


@dataclass
class RoundResult:
    counts: np.ndarray
    guarantee: Guarantee
    mechanism: dict
    messages: int
    received: int
    clients: int
    rejected: dict
    timings: dict = field(default_factory=dict)
    shuffler: dict | None = None


def start_shards(cfg: dict, data: PreparedData) -> list:
    """Few ClientShard actors, each hosting a contiguous range of virtual clients."""
    num_shards = min(cfg["cluster"]["shards"], data.num_clients)
    ids = data.client_ids
    bounds = np.linspace(0, ids.max() + 1, num_shards + 1).astype(np.int64)
    seeded = cfg["run"]["rng"] == "seeded"
    shards = []
    for i in range(num_shards):
        rows = np.flatnonzero((ids >= bounds[i]) & (ids < bounds[i + 1]))
        secret = (derived_seed(str(cfg["run"]["seed"]).encode(), "shard", i).to_bytes(32, "big")
                  if seeded else new_client_secret())
        shard = ClientShard.options(num_cpus=cfg["cluster"]["shard_cpus"]).remote(
            i, data.splits.private_x[rows], data.splits.private_y[rows], ids[rows], secret)
        shards.append(shard)
    return shards


def _shuffle(cfg, mechanism, refs, hops, progress) -> tuple[list, dict]:
    """Pass the shards' batches through the shuffler chain; returns (batch refs, stats)."""
    with progress.stage("shuffle", f"shuffler{'s' if len(hops) > 1 else ''}: pool, check "
                        f"senders >= {mechanism.min_senders()}, secure permutation"):
        ray.get([hops[0].submit_all.remote(ref) for ref in refs])
        stats = [ray.get(hops[0].stats.remote())]
        try:
            out = ray.get(hops[0].release_refs.remote())
            stats[0] = ray.get(hops[0].stats.remote())     # now with what was released
            for hop in hops[1:]:
                ray.get([hop.submit.remote(r) for r in out])
                out = ray.get(hop.release_refs.remote())
                stats.append(ray.get(hop.stats.remote()))
        except ray.exceptions.RayTaskError as exc:
            cause = exc.as_instanceof_cause()
            if isinstance(cause, PrivacyBudgetError) or "PrivacyBudgetError" in str(exc):
                raise PrivacyBudgetError(
                    f"round refused by the shuffler: {stats[0]['senders']} distinct senders, "
                    f"the target needs {mechanism.min_senders()}; nothing was released") from None
            raise
    return out, {"hops": stats, "senders": stats[0]["senders"],
                 "messages": stats[-1]["messages"], "bytes": stats[0]["bytes"]}


def run_round(cfg: dict, data: PreparedData, encoder, qs, round_id: int, job_id: str,
              ledger, progress, key_file: str | None = None) -> RoundResult:
    """Run one private labeling round end to end and record it in ``ledger``."""
    model = cfg["privacy"]["model"]
    ctx = RoundContext(job_id=job_id, round_id=round_id)
    params = mechanism_params(cfg, data)
    mechanism = build(model, cfg["privacy"]["mechanism"], params)
    ledger.check(mechanism.guarantee())          # refuse before any client works
    server = Server.options(num_cpus=0.25).remote(job_id, key_file)
    shards = start_shards(cfg, data)
    hops = []
    if model == "shuffle":
        layers = int(cfg["shuffle"]["onion_layers"])
        floor = mechanism.min_senders()
        if cfg["shuffle"]["min_senders"] is not None:
            floor = max(floor, int(cfg["shuffle"]["min_senders"]))
        hops = [Shuffler.options(num_cpus=0.25).remote(
            floor if i == 0 else 0, ctx=ctx, onion_layer=(i + 1) if layers else None,
            forwarded_input=i > 0) for i in range(max(1, layers))]
    try:
        public_key = ray.get(server.public_key.remote())
        hop_keys = ray.get([h.public_key.remote() for h in hops]) if model == "shuffle" \
            and cfg["shuffle"]["onion_layers"] else None
        ray.get(server.begin_round.remote(ctx, mechanism))
        k, nc = cfg["rknn"]["k"], data.num_classes
        dropout = float(cfg["shuffle"]["dropout"]) if model == "shuffle" else 0.0
        with progress.stage("clients", f"{len(shards)} client shards: embed, reverse k-NN, "
                            f"randomize, seal ({data.num_clients} virtual clients)"):
            refs = [s.make_reports.remote(encoder, qs.features, k, nc, mechanism, ctx,
                                          public_key, cfg["cluster"]["batch_clients"],
                                          None, hop_keys, dropout)
                    for s in shards]
            # wait without pulling the ciphertext into the driver (a shard's error
            # surfaces where its batches are consumed: shuffler or server)
            ray.wait(refs, num_returns=len(refs), fetch_local=False)
        shuffle_stats = None
        if model == "shuffle":
            refs, shuffle_stats = _shuffle(cfg, mechanism, refs, hops, progress)
            mechanism.senders_shuffled = int(shuffle_stats["senders"])
            ledger.check(mechanism.guarantee())   # from the n actually shuffled
            ray.get(server.set_mechanism.remote(mechanism))
            refs = [refs]
        with progress.stage("server_open", "server: open and check reports"):
            ray.get([server.receive.remote(ref) for ref in refs])
        with progress.stage("server_estimate", "server: decode, estimate, add noise"):
            seed = cfg["run"]["seed"] + 1_000_003 * (round_id + 1)
            n = shuffle_stats["senders"] if shuffle_stats else data.num_clients
            out = ray.get(server.estimate.remote(n, cfg["run"]["rng"], seed))
        shard_timings = ray.get([s.get_timings.remote() for s in shards])
    finally:
        for actor in shards + hops + [server]:
            ray.kill(actor)
    guarantee = mechanism.guarantee()
    ledger.record(guarantee, round_id=round_id, messages=out["messages"],
                  clients=data.num_clients)
    timings = {**{f"server_{k}": v for k, v in out["timings"].items()}}
    for t in shard_timings:
        for key, v in t.items():
            timings[f"shards_{key}"] = timings.get(f"shards_{key}", 0.0) + v
    return RoundResult(out["counts"], guarantee, mechanism.describe(), out["messages"],
                       out["received"], data.num_clients, out["rejected"], timings,
                       shuffle_stats)


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]

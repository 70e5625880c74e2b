"""One shuffle round at scale: single message, Collision, every report sealed.

    python -m benchmarks.scale --clients 1000000 --protocol actors|inprocess [--json]
        [--object-store-mb 512] [--shards 2] [--nodes 3] [--rng seeded] [--memory-period 5] [--floor-period 5]
        [--out bench_out/scale]
    python -m benchmarks.scale --clients 10000 --warm-rounds 5

``actors`` runs the path users run (ProtocolSession: ClientShard actors streaming
sealed batches, the Shuffler actor, the Server with its opener processes);
``inprocess`` runs the very same library steps (client_step, ShufflePool,
open_and_check, RoundAccumulator) in this one process. One synthetic Gaussian-mixture
record per client, made by each shard from (seed, client id); s = |Y| = 10, k = 1,
central target eps = 1, delta = 1e-6.

Printed (and written as JSON): wall time, time per stage, ``floor_parts`` (CPU seconds
per primitive for all messages, benchmarks/crypto_floor.py: the client's X25519 keygen +
exchange, HKDF, ChaCha20-Poly1305 seal, credential key and HMAC tag; the shuffler's
credential key and tag check; the server's exchange, HKDF and open -- measured during the
round: each part's median over samples taken every ``--floor-period`` s, since this
machine's speed drifts; ``floor_spread_s`` is the range one sample implied and
``floor_after_round_s`` one floor taken after the round, for comparison), ``crypto_floor_s`` (their sum), ``cores``, ``floor_wall_s`` = floor / cores,
``ratio_to_floor`` = wall / floor_wall (the wall includes the actors' start-up and
shutdown), ``round_wall_s`` and ``round_ratio_to_floor`` (actors: the round alone, from its
start to the release), ``round_cpu_s`` (actors: CPU of every process of
the run during the round; ``round_cpu_by_process_s`` by kind of process) and
``cpu_ratio_to_floor`` = round_cpu / floor (what a loaded machine inflates far less than
wall time; it includes the opener processes' warm-up, which overlaps the client stage,
and Ray's own threads and daemons), ``peak_rss_mb`` (peak of the summed proportional
set size of this process and all its descendants: the driver, Ray's daemons, every actor and opener process)
and ``spilled_mb`` (what Ray spilled to disk).

``--nodes N`` (N > 1) runs the actors on a Ray cluster of N nodes on this machine
(jobs/local_cluster.py): the server on the head, the shuffler on a node of its own, the
client shards on the rest, each node with its share of the cores, so every report crosses
node boundaries through Ray's object store. ``nodes`` maps each Ray node id to its roles,
``placement`` each party to the node ids its actors reported, ``release`` is the released
counts; ``--rng seeded`` makes them reproducible across runs (NOT private).

``--warm-rounds R`` measures small rounds instead (:func:`run_warm`): per model, a cold
round and R warm ones on the same actors, N one-record clients, 100 queries, a 1000-cell
vote; printed: wall, CPU of every process, the floor, and the fixed cost beyond it.
``--prepare both|on|off`` (default both): each model also with the shards' encapsulations
made between the rounds (``ProtocolSession.prepare_next_round``, outside the timed window,
its wall and CPU reported apart), against the floor left in the round.
"""
from __future__ import annotations

import argparse
import json
from abc import ABC, abstractmethod
import os
import sys
import threading
import time

import numpy as np

from benchmarks.crypto_floor import (AHEAD_PARTS as ahead_parts, KEPT_PARTS as kept_parts,
                                     floor_parts)
from rknn_ray.data.sources import SyntheticClientsSource
from rknn_ray.labeling.queries import select_queries
from rknn_ray.representation.represent import make_encoder
from rknn_ray.mechanisms import MechanismParams, build
from rknn_ray.rng import new_client_secret
from jobs.local_cluster import LocalCluster, placement_overrides, roles_for
from rknn_ray.runio import write_json

SEED = 0
NUM_CLASSES, DIM, S = 10, 32, 10


class Sampler(ABC):
    """Calls ``sample()`` every ``period`` seconds in a thread, and once more at the end;
    ``cpu_s``: the CPU its samples took (the benchmark's own cost, on the cores it measures)."""

    def __init__(self, period: float):
        self.period, self.cpu_s = period, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @abstractmethod
    def sample(self) -> None:
        """Take one measurement."""

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            t = time.thread_time()
            self.sample()
            self.cpu_s += time.thread_time() - t

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


class MemorySampler(Sampler):
    """Peak of the summed PSS of this process tree. One sample reads every process's
    smaps_rollup, a page-table walk the kernel charges to this process, so the period
    trades the peak's resolution against the sampler's own CPU (docs/results.md, "Costs
    behind design choices")."""

    def __init__(self, period: float = 2.0):
        import psutil  # defers psutil
        super().__init__(period)
        self._psutil, self.peak = psutil, 0.0

    def _total(self) -> float:
        me = self._psutil.Process()
        total = 0
        for p in [me, *me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
            except (self._psutil.Error, OSError):
                continue
        return total / 2 ** 20

    def sample(self) -> None:
        self.peak = max(self.peak, self._total())


class FloorSampler(Sampler):
    """The floor measured while the round runs: every ``period`` s, ``probe`` messages' worth
    of each primitive (benchmarks/crypto_floor.py, this thread's CPU clock). A shared
    machine's speed drifts over minutes, so one floor taken after the round makes
    ``ratio_to_floor`` swing between two runs of the same code (docs/results.md, "Costs
    behind design choices"). The floor used is each part's median per-message cost over the round."""

    def __init__(self, payload_len: int, period: float = 5.0, probe: int = 200):
        super().__init__(period)
        self.payload_len, self.probe, self.samples = payload_len, probe, []

    def sample(self) -> None:
        self.samples.append(floor_parts(self.probe, self.payload_len, sample=self.probe))

    def parts(self, num_messages: int) -> dict[str, float]:
        """Each part's median CPU seconds per message over the samples, for ``num_messages``."""
        return {part: float(np.median([s[part] for s in self.samples])) / self.probe * num_messages
                for part in self.samples[0]}

    def spread(self, num_messages: int, skip: tuple = ()) -> list[float]:
        """The lowest and highest floor (all parts but ``skip``) one sample implied, for
        ``num_messages``."""
        totals = [sum(v for k, v in s.items() if k not in skip) / self.probe * num_messages
                  for s in self.samples]
        return [min(totals), max(totals)]


def _public_setup(clients: int, s: int = S, model: str = "shuffle", name: str = "collision",
                  delta: float = 1e-6):
    """Queries and mechanism from public data only (2,000 mixture samples of another seed)."""
    public_x, _ = SyntheticClientsSource(0, 2000, NUM_CLASSES, DIM, SEED + 7).records(0, 2000)
    encoder = make_encoder("raw").fit(public_x)
    qs = select_queries(encoder.transform(public_x), s, restarts=1, seed=SEED)
    return encoder, qs, _mechanism(clients, s, model, name, delta)


def _mechanism(clients: int, s: int = S, model: str = "shuffle", name: str = "collision",
               delta: float = 1e-6):
    """The round's mechanism (public parameters only)."""
    return build(model, name, MechanismParams(s, NUM_CLASSES, 1, 1.0, delta=delta,
                                              num_clients=clients))


def _exact_counts(clients: int, qs, batch: int = 1 << 20) -> np.ndarray:
    """The true counts, for the error columns (regenerated the way the shards made them)."""
    from rknn_ray.labeling.rknn import reverse_knn  # defers faiss
    src = SyntheticClientsSource(0, clients, NUM_CLASSES, DIM, SEED)
    counts = np.zeros((S, NUM_CLASSES), np.int64)
    for lo in range(0, clients, batch):
        x, y = src.records(lo, min(clients, lo + batch))
        np.add.at(counts, (reverse_knn(x, qs.features, 1)[:, 0], y), 1)
    return counts


def run_inprocess(clients: int, batch: int) -> dict:
    from rknn_ray.client_step import RoundSpec, client_step  # defers cryptography, faiss, pyarrow
    from sealing.envelope import RoundContext, from_arrow  # defers cryptography, pyarrow
    from server.accumulator import RoundAccumulator, open_and_check
    from server.keys import ServerKeyPair  # defers cryptography
    from server.opening import ReportOpener  # defers cryptography, pyarrow
    from shuffler.pool import ShufflePool

    stages: dict[str, float] = {}
    t_all = time.perf_counter()
    encoder, qs, mech = _public_setup(clients)
    keys, ctx = ServerKeyPair.generate(), RoundContext("scale-bench", 0)
    spec = RoundSpec(ctx, mech, encoder, qs.features, 1, NUM_CLASSES, keys.public_bytes())
    secret = new_client_secret()
    pool = ShufflePool(mech.min_senders())
    src = SyntheticClientsSource(0, clients, NUM_CLASSES, DIM, SEED)
    for b, (x, y, ids) in enumerate(src.batches(batch)):
        rb = client_step(spec, secret, b, x, y, ids, stages)
        t = time.perf_counter()
        pool.add(rb)
        stages["shuffle"] = stages.get("shuffle", 0.0) + time.perf_counter() - t
    senders = pool.num_senders
    opener = ReportOpener(keys, ctx, mech.message_size)
    acc = RoundAccumulator(mech)
    t = time.perf_counter()
    released = list(pool.release())
    stages["shuffle"] += time.perf_counter() - t
    t = time.perf_counter()
    for rb in released:
        acc.accumulate(open_and_check(opener, mech, from_arrow(rb)[0]))
    stages["open_decode"] = time.perf_counter() - t
    t = time.perf_counter()
    release = acc.finalize()
    stages["finalize"] = time.perf_counter() - t
    from rknn_ray.accounting import PrivacyLedger, guarantee_of  # defers dp_accounting, scipy
    ledger = PrivacyLedger()                    # the round's cost, as a job's ledger states it
    ledger.record(guarantee_of(mech, senders), round_id=0)
    return {"wall_s": time.perf_counter() - t_all, "stages_s": stages, "senders": int(senders),
            "messages": release.accepted, "rejected": release.rejected, "counts": release.counts,
            "eps0": mech.local_eps, "eps": ledger.spent()[0], "qs": qs,
            "message_size": mech.message_size, "cores": 1, "spilled_mb": 0.0}


class StoreSampler(Sampler):
    """What Ray wrote to disk: spilled MiB (cumulative) and peak fallback-mmap MiB."""

    def __init__(self, period: float = 2.0):
        import ray  # defers ray, tqdm
        super().__init__(period)
        self.spilled, self.fallback_peak = 0.0, 0.0
        # this run's cluster by address: with none, Ray picks the newest instance on the machine
        self.address = ray.get_runtime_context().gcs_address

    def sample(self) -> None:
        try:
            # Ray's private API: a Ray that moved it fails only this call
            from ray._private.internal_api import memory_summary
            text = memory_summary(self.address, stats_only=True)
        except Exception:  # noqa: BLE001 - best effort: the cluster may be shutting down
            return
        for line in text.splitlines():
            words = line.strip().split()
            if line.strip().startswith("Spilled"):
                self.spilled = max(self.spilled, float(words[1]))
            elif line.strip().startswith("Plasma filesystem mmap usage"):
                self.fallback_peak = max(self.fallback_peak, float(words[4]))

    @property
    def on_disk_mb(self) -> float:
        return self.spilled + self.fallback_peak


def run_actors(clients: int, batch: int, shards: int, object_store_mb: int | None,
               distributed_above: int | None = 5_000_000, nodes: int = 1,
               rng: str = "secure") -> dict:
    """One round on a local Ray instance, or with ``nodes`` > 1 on a cluster of that many
    nodes on this machine (jobs/local_cluster.py: server, shuffler and client nodes, each
    party placed on its own); ``rng="seeded"`` makes the release reproducible (NOT private)."""
    import ray  # defers ray, tqdm

    from rknn_ray.job.ray_env import ensure_ray  # defers cryptography, faiss, ray, tqdm
    from rknn_ray.training.logs import quiet_train_logs  # defers torch

    quiet_train_logs()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cores = os.cpu_count() or 1
    # one opener per core, as every earlier row measured (a job's default opens a round of
    # under 20,000 messages in the Server itself: rknn_ray.job.session.OPEN_IN_SERVER_BELOW)
    cluster, overrides = None, [f"run.rng={rng}", f"cluster.openers={cores}"]
    if nodes > 1:
        roles = roles_for(nodes)
        # the cores are shared out, so the parties get what the single node gives them
        cluster = LocalCluster(roles, cpus=max(1.0, cores / nodes),
                               object_store_mb=object_store_mb or 500).start()
        overrides += placement_overrides(roles)
        ensure_ray(address=cluster.address, log_to_driver=False)
    else:
        ensure_ray(num_cpus=cores, object_store_mb=object_store_mb, log_to_driver=False)
    try:
        res = _actors_round(clients, batch, shards, distributed_above, overrides)
        res["nodes"] = (cluster.node_roles() if cluster else
                        {ray.get_runtime_context().get_node_id(): ["client", "shuffler", "server"]})
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.stop()
    res["cores"] = cores
    return res


def _actors_round(clients: int, batch: int, shards: int, distributed_above: int | None,
                  overrides: list[str]) -> dict:
    """The round itself, on the Ray this process is connected to."""
    from rknn_ray.job.progress import Progress  # defers cryptography, faiss, ray, tqdm
    from rknn_ray.job.session import ProtocolSession
    from rknn_ray.config import load_config  # defers yaml

    t_all = time.perf_counter()
    encoder, qs, mech = _public_setup(clients)
    cfg = load_config(None, ["privacy.model=shuffle", "privacy.mechanism=collision",
                             f"privacy.delta={min(1e-6, 0.1 / clients):.3g}",
                             f"cluster.shards={shards}",
                             f"cluster.batch_clients={batch}", "run.progress=false",
                             f"shuffle.distributed_above={distributed_above}", *overrides])
    cuts = np.linspace(0, clients, shards + 1).astype(np.int64)
    sources = [SyntheticClientsSource(int(a), int(b), NUM_CLASSES, DIM, SEED)
               for a, b in zip(cuts[:-1], cuts[1:])]
    t0 = time.perf_counter()
    with StoreSampler() as store:
        with ProtocolSession(cfg, sources, "scale-bench", progress=Progress(False)) as session:
            start = time.perf_counter() - t0
            cpu0 = _cpu_by_process()
            t_round = time.perf_counter()
            from rknn_ray.accounting import PrivacyLedger  # defers dp_accounting, scipy
            ledger = PrivacyLedger()
            res = session.run_round(0, mech, encoder, qs.features, ledger)
            round_wall = time.perf_counter() - t_round
            by_process = _cpu_delta(cpu0, _cpu_by_process())
            round_cpu = sum(by_process.values())
        wall = time.perf_counter() - t_all
    stages = {"setup": start, **res.timings}
    spilled = store.on_disk_mb
    return {"wall_s": wall, "stages_s": stages, "senders": res.shuffler["senders"],
            "shuffle_mode": res.shuffler["hops"][0].get("mode", "in-process"),
            "messages": res.messages, "rejected": res.rejected, "counts": res.counts,
            "eps0": mech.local_eps, "eps": ledger.spent()[0], "qs": qs,
            "message_size": mech.message_size, "spilled_mb": spilled,
            "placement": res.placement, "round_cpu_s": round_cpu, "round_wall_s": round_wall,
            "round_cpu_by_process_s": by_process}


WARM_QUERIES = 100                         # x 10 classes: a 1000-cell vote
WARM_MODELS = {"central": "laplace", "shuffle": "collision"}
WARM_FLOOR_PROBE = 1000                    # messages of every primitive after each warm round


def run_warm(clients: int, rounds: int = 5, models: tuple = tuple(WARM_MODELS),
             shards: int = 2, prepare: tuple = (False,), batch: int | None = None) -> dict:
    """Warm rounds: one session per model, a cold round 0, then ``rounds`` more on the same
    actors (N one-record clients, 100 queries, 1000-cell vote, the server sums).

    Per model: each warm round's wall time and stages, ``round_cpu_s`` (CPU of the whole
    process tree in the round), the round's floor (its primitives' CPU: each part's median
    over samples of WARM_FLOOR_PROBE messages taken after every warm round), ``fixed_s`` =
    median warm wall - floor / cores and ``fixed_cpu_s`` = median round CPU - floor: what a
    round costs beyond its messages (actor calls, calibration, hand-overs);
    ``fixed_cpu_net_s`` also takes off what the idle session burns in that time
    (``idle_cpu_per_s``, measured for 2 s after the cold round). On a loaded machine the
    CPU figures are the ones to compare.

    A warm round reuses every client's credential key from round 0 (kept per process,
    :class:`sealing.credentials.ClientKeyTable`), so its floor leaves out
    :data:`benchmarks.crypto_floor.KEPT_PARTS` (``floor_kept_cpu_s``; up to the table's
    size, 2^21 clients).

    ``prepare``: for each True, the model runs again (key ``<model>+prepared``) with the
    shards' encapsulations made before every warm round (``prepare_s`` / ``prepare_cpu_s``,
    outside the round's window); its ``floor_cpu_s`` is what is left in the round (also
    without :data:`benchmarks.crypto_floor.AHEAD_PARTS`, which ``floor_ahead_cpu_s`` holds).
    """
    import ray  # defers ray, tqdm

    from rknn_ray.training.logs import quiet_train_logs  # defers torch

    if rounds < 1:
        raise ValueError(f"--warm-rounds must be >= 1, got {rounds}")
    quiet_train_logs()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cores = os.cpu_count() or 1
    from rknn_ray.job.ray_env import ensure_ray  # defers cryptography, faiss, ray, tqdm
    started = ensure_ray(num_cpus=cores, log_to_driver=False)  # a test's Ray is used as it is
    out = {"clients": clients, "protocol": "actors-warm", "cores": cores, "rounds": rounds,
           "queries": WARM_QUERIES, "cells": WARM_QUERIES * NUM_CLASSES, "models": {}}
    try:
        for prepared in prepare:
            for model in models:
                name = f"{model}+prepared" if prepared else model
                out["models"][name] = _warm_model(clients, rounds, model, shards, prepared, cores,
                                                  batch)
    finally:
        if started:
            ray.shutdown()
    return out


def _warm_model(clients: int, rounds: int, model: str, shards: int, prepared: bool,
                cores: int, batch: int | None = None) -> dict:
    """One model's session of :func:`run_warm`."""
    from rknn_ray.config import load_config  # defers yaml
    from rknn_ray.job.progress import Progress  # defers cryptography, faiss, ray, tqdm
    from rknn_ray.job.session import ProtocolSession
    from sealing.credentials import TABLE_MAX_CLIENTS  # defers cryptography, pyarrow
    delta = 0.0 if model == "central" else 1e-6     # central Laplace is pure eps-DP
    encoder, qs, mech = _public_setup(clients, WARM_QUERIES, model, WARM_MODELS[model], delta)
    count = min(100, rounds + 1)
    # the clients are SyntheticClientsSource's: the config says so, with a pool whose public
    # part (a fifth) holds every round's new queries, as a job's config must
    pool = max(clients, 5 * WARM_QUERIES * count)
    cfg = load_config(None, [f"privacy.model={model}", f"privacy.mechanism={WARM_MODELS[model]}",
                             "data.dataset=synthetic", f"data.synthetic.num_samples={pool}",
                             f"data.synthetic.num_classes={NUM_CLASSES}",
                             f"data.synthetic.dim={DIM}", f"queries.s={WARM_QUERIES}",
                             f"privacy.delta={delta}", f"cluster.openers={cores}",
                             f"cluster.shards={shards}", "run.progress=false",
                             f"cluster.precompute_keys={bool(prepared)}",
                             f"rounds.count={count}"]
                      + ([f"cluster.batch_clients={int(batch)}"] if batch else []))
    cuts = np.linspace(0, clients, shards + 1).astype(np.int64)
    sources = [SyntheticClientsSource(int(a), int(b), NUM_CLASSES, DIM, SEED)
               for a, b in zip(cuts[:-1], cuts[1:])]
    walls, cpus, tree_cpus, stages, by_process = [], [], [], [], []
    prep_walls, prep_cpus, prep_stats = [], [], []
    from rknn_ray.accounting import PrivacyLedger  # defers dp_accounting, scipy
    ledger = PrivacyLedger()
    # the floor between the warm rounds, out of their timed windows (this machine's
    # speed drifts, so a floor taken only after the rounds would skew fixed_s)
    probe = FloorSampler(mech.message_size, period=0.0, probe=WARM_FLOOR_PROBE)
    with ProtocolSession(cfg, sources, f"warm-{model}", progress=Progress(False)) as session:
        idle_rate = None
        for r in range(rounds + 1):
            if r == 1:            # warm now: what the idle session burns per second
                c0, t0 = _tree_cpu(), time.perf_counter()
                time.sleep(2.0)
                idle_rate = (_tree_cpu() - c0) / (time.perf_counter() - t0)
            if r and prepared:    # the keys, made before the round's window opens
                c0, t0 = _tree_cpu(), time.perf_counter()
                prep_stats.append(session.prepare_next_round(wait=True))
                prep_walls.append(time.perf_counter() - t0)
                prep_cpus.append(_tree_cpu() - c0)
            tree = _cpu_by_process()       # the process walk stays out of the timed window
            t, c = time.perf_counter(), time.process_time()
            res = session.run_round(r, mech, encoder, qs.features, ledger)
            walls.append(time.perf_counter() - t)
            cpus.append(time.process_time() - c)
            by_process.append(_cpu_delta(tree, _cpu_by_process()))
            tree_cpus.append(sum(by_process[-1].values()))
            stages.append(res.timings)
            if r:
                probe.sample()
    parts = probe.parts(res.messages)
    kept = sum(v for k, v in parts.items() if clients <= TABLE_MAX_CLIENTS and k in kept_parts)
    ahead = sum(v for k, v in parts.items() if prepared and k in ahead_parts)
    skip = tuple(kept_parts if kept else ()) + tuple(ahead_parts if prepared else ())
    floor = sum(parts.values()) - ahead - kept
    warm = sorted(walls[1:])
    median = warm[len(warm) // 2]
    warm_cpu = sorted(tree_cpus[1:])[len(warm) // 2]
    row = {"cold_s": walls[0], "warm_s": walls[1:], "warm_median_s": median,
           "driver_cpu_s": cpus[1:], "round_cpu_s": tree_cpus[1:],
           "round_cpu_by_process_s": by_process[1:],
           "stages_s": stages[1:], "messages": res.messages, "floor_cpu_s": floor,
           "floor_samples": len(probe.samples),
           "floor_spread_cpu_s": probe.spread(res.messages, skip), "floor_kept_cpu_s": kept,
           "floor_wall_s": floor / cores, "fixed_s": median - floor / cores,
           "fixed_cpu_s": warm_cpu - floor, "idle_cpu_per_s": idle_rate,
           "fixed_cpu_net_s": warm_cpu - floor - idle_rate * median, "prepared": bool(prepared)}
    if prepared:
        row.update({"floor_ahead_cpu_s": ahead, "prepare_s": prep_walls,
                    "prepare_cpu_s": prep_cpus, "prepare_stats": prep_stats})
    return row


def _tree_cpu() -> float:
    """CPU seconds (user + system) of this process and every descendant (Ray's daemons, the
    actors, the opener processes): what a round costs whatever else loads the machine."""
    return sum(_cpu_by_process().values())


def _cpu_by_process() -> dict[str, float]:
    """CPU seconds so far of this process tree, by kind of process: ``driver``, each Ray
    actor or task by its process title (``ray::Server``, ...), ``opener`` (the Server's
    children), and Ray's daemons by name."""
    import psutil  # defers psutil
    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            cmd = p.cmdline()
            parent = p.parent()
            title = cmd[0] if cmd else p.name()
            if p.pid == me.pid:
                kind = "driver"
            elif parent is not None and parent.cmdline()[:1] and \
                    parent.cmdline()[0].startswith("ray::Server"):
                kind = "opener"
            elif title.startswith("ray::"):
                kind = title.split(".")[0].split(" ")[0]
            elif "raylet" in title or "gcs_server" in title:
                kind = os.path.basename(title.split(" ")[0])
            else:
                kind = "other"
            out[kind] = out.get(kind, 0.0) + t.user + t.system
        except (psutil.Error, OSError, IndexError):
            continue
    return out


def _cpu_delta(before: dict, after: dict) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(before) | set(after))}


def run(clients: int, protocol: str = "actors", batch: int = 20000, shards: int = 2,
        object_store_mb: int | None = None, distributed_above: int | None = 5_000_000,
        nodes: int = 1, rng: str = "secure", memory_period: float = 5.0,
        floor_period: float = 5.0) -> dict:
    if nodes > 1 and protocol != "actors":
        raise ValueError("--nodes needs --protocol actors (the in-process run has no nodes)")
    message_size = _mechanism(clients).message_size        # the floor samples' payload
    with MemorySampler(memory_period) as mem, FloorSampler(message_size, floor_period) as probe:
        res = (run_actors(clients, batch, shards, object_store_mb, distributed_above, nodes, rng)
               if protocol == "actors"
               else run_inprocess(clients, batch))
    parts = probe.parts(clients)
    floor = sum(parts.values())
    at_rest = sum(floor_parts(clients, res["message_size"]).values())   # the old way, for contrast
    cores = res["cores"]
    err = np.abs(res["counts"] - _exact_counts(clients, res["qs"]))
    return {"clients": clients, "protocol": protocol, "wall_s": res["wall_s"],
            "stages_s": res["stages_s"], "floor_parts": parts, "crypto_floor_s": floor,
            "floor_samples": len(probe.samples), "floor_sample_period_s": probe.period,
            "floor_spread_s": probe.spread(clients), "floor_sampler_cpu_s": probe.cpu_s,
            "floor_after_round_s": at_rest,
            "cores": cores,
            "floor_wall_s": floor / cores, "ratio_to_floor": res["wall_s"] / (floor / cores),
            # the round alone (actors: from the round's start to its release, without the
            # actors' start-up and shutdown, which a job pays once for all its rounds)
            "round_wall_s": res.get("round_wall_s"),
            "round_ratio_to_floor": (res["round_wall_s"] / (floor / cores)
                                     if res.get("round_wall_s") else None),
            "round_cpu_s": res.get("round_cpu_s"),
            "round_cpu_by_process_s": res.get("round_cpu_by_process_s"),
            "cpu_ratio_to_floor": (res["round_cpu_s"] / floor if res.get("round_cpu_s")
                                   else None),
            # the samplers' CPU is the benchmark's, charged to the driver (the smaps walks);
            # the round's own CPU leaves it out
            "benchmark_own_cpu_s": mem.cpu_s + probe.cpu_s,
            "cpu_ratio_to_floor_without_samplers": (
                (res["round_cpu_s"] - mem.cpu_s - probe.cpu_s) / floor
                if res.get("round_cpu_s") else None),
            "peak_rss_mb": mem.peak, "memory_sample_period_s": mem.period,
            "memory_sampler_cpu_s": mem.cpu_s, "spilled_mb": res["spilled_mb"],
            "senders": res["senders"], "messages": res["messages"], "rejected": res["rejected"],
            "eps0": res["eps0"], "eps": res["eps"], "object_store_mb": object_store_mb,
            "shuffle_mode": res.get("shuffle_mode", "in-process"),
            "max_abs_count_error": float(err.max()), "mean_abs_count_error": float(err.mean()),
            "nodes": res.get("nodes", {}), "placement": res.get("placement", {}),
            "rng": rng if protocol == "actors" else "secure",
            "release": np.asarray(res["counts"]).tolist()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=100000)
    ap.add_argument("--protocol", choices=("actors", "inprocess"), default="actors")
    ap.add_argument("--batch", type=int, default=None,
                    help="clients per sealed batch (default 20000, the config's default; warm "
                         "rounds: the config's cluster.batch_clients unless given)")
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--object-store-mb", type=int, default=None,
                    help="cap Ray's object store (MB) so large rounds must spill")
    ap.add_argument("--distributed-above", type=int, default=5_000_000,
                    help="messages above which the shuffle runs distributed (shuffle.distributed_above)")
    ap.add_argument("--nodes", type=int, default=1,
                    help="Ray nodes on this machine (actors only): >1 puts the server, the "
                         "shuffler and the client shards on nodes of their own")
    ap.add_argument("--rng", choices=("secure", "seeded"), default="secure",
                    help="seeded: a reproducible release (NOT private; for comparing runs)")
    ap.add_argument("--warm-rounds", type=int, default=0,
                    help="instead of one big round: this many warm rounds per model (central, "
                         "shuffle) after a cold one; 100 queries, a 1000-cell vote")
    ap.add_argument("--prepare", choices=("both", "on", "off"), default="both",
                    help="warm rounds: also (both), only (on) or never (off) with the shards' "
                         "encapsulations made between the rounds")
    ap.add_argument("--memory-period", type=float, default=5.0,
                    help="seconds between memory samples (each costs the driver CPU in a big "
                         "round: docs/results.md)")
    ap.add_argument("--floor-period", type=float, default=5.0,
                    help="seconds between floor samples taken during the round (each a few "
                         "hundred messages of every primitive)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON on stdout")
    ap.add_argument("--out", default=None, help="also write scale-<protocol>-<clients>.json here")
    args = ap.parse_args(argv)
    if args.nodes < 1 or (args.nodes > 1 and args.protocol != "actors"):
        ap.error("--nodes must be >= 1, and > 1 only with --protocol actors")
    if args.warm_rounds:
        return _main_warm(args)
    res = run(args.clients, args.protocol, args.batch or 20000, args.shards, args.object_store_mb,
              args.distributed_above, args.nodes, args.rng, args.memory_period,
              args.floor_period)
    if args.out:
        write_json(os.path.join(args.out, f"scale-{args.protocol}-{args.clients}.json"), res)
    if args.json:
        print(json.dumps(res))
    else:
        print("| stage | seconds |\n|---|---|")
        for k, v in res["stages_s"].items():
            print(f"| {k} | {v:.2f} |")
        print("\n| floor part | CPU s |\n|---|---|")
        for k, v in res["floor_parts"].items():
            print(f"| {k} | {v:.2f} |")
        print(f"| **round (wall)** | {res['wall_s']:.2f} |\n"
              f"| crypto floor (CPU s) | {res['crypto_floor_s']:.2f} |\n"
              f"| floor / {res['cores']} cores | {res['floor_wall_s']:.2f} |")
        lo, hi = res["floor_spread_s"]
        print(f"floor: median of {res['floor_samples']} samples taken during the round (one "
              f"sample's floor {lo:.1f}-{hi:.1f} CPU s); one taken after it: "
              f"{res['floor_after_round_s']:.1f} CPU s")
        if res["round_cpu_s"]:
            print(f"round CPU (every process) {res['round_cpu_s']:.2f} s = "
                  f"{res['cpu_ratio_to_floor']:.2f} x the floor's CPU "
                  f"({res['cpu_ratio_to_floor_without_samplers']:.2f} x without the "
                  f"benchmark's own samplers, {res['benchmark_own_cpu_s']:.2f} s)")
            print(", ".join(f"{k} {v:.2f}" for k, v in res["round_cpu_by_process_s"].items()))
        if res["round_wall_s"]:
            print(f"the round alone (no actor start-up or shutdown): {res['round_wall_s']:.2f} s "
                  f"= {res['round_ratio_to_floor']:.2f} x floor / cores")
        print(f"ratio to floor {res['ratio_to_floor']:.2f}; peak memory {res['peak_rss_mb']:.0f} MB; "
              f"spilled {res['spilled_mb']:.0f} MB")
        for party, ids in res["placement"].items():
            print(f"{party}: node(s) {', '.join(i[:8] for i in ids)}")
    return 0


def _main_warm(args) -> int:
    if args.protocol != "actors" or args.nodes != 1:
        raise SystemExit("--warm-rounds runs the actors on one node: drop --protocol inprocess "
                         "and --nodes")
    prepare = {"both": (False, True), "on": (True,), "off": (False,)}[args.prepare]
    res = run_warm(args.clients, args.warm_rounds, shards=args.shards, prepare=prepare,
                   batch=args.batch)
    if args.out:
        write_json(os.path.join(args.out, f"scale-warm-{args.clients}.json"), res)
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"| model | cold s | warm s (median of {args.warm_rounds}) | floor / cores | fixed s "
          "| round CPU s | floor CPU s | fixed CPU s | less idle | made ahead: s, CPU s |\n"
          "|---|---|---|---|---|---|---|---|---|---|")
    for model, r in res["models"].items():
        ahead = (f"{_median(r['prepare_s']):.3f}, {_median(r['prepare_cpu_s']):.3f}"
                 if r["prepared"] else "-")
        print(f"| {model} | {r['cold_s']:.3f} | {r['warm_median_s']:.3f} | "
              f"{r['floor_wall_s']:.3f} | {r['fixed_s']:.3f} | "
              f"{_median(r['round_cpu_s']):.3f} | "
              f"{r['floor_cpu_s']:.3f} | {r['fixed_cpu_s']:.3f} | {r['fixed_cpu_net_s']:.3f} | "
              f"{ahead} |")
    return 0


def _median(values) -> float:
    """The middle value (the upper one of an even count), as the warm rows report it."""
    return sorted(values)[len(values) // 2]


if __name__ == "__main__":
    sys.exit(main())

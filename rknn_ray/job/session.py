"""The protocol on Ray actors: shards -> (shufflers) -> server, streamed, for any number of rounds.

A :class:`ProtocolSession` owns the actors of one job and keeps them across rounds:
the client shards (each opens its own records once: only its clients', put in the object
store by the driver, which prepared them), the Server (its key pair, its
opener processes and the job-wide memory of report ids) and, in the shuffle model,
the shuffler chain. One round (:meth:`ProtocolSession.run_round`):

1. the ledger is checked *before* any client randomizes (a refused round releases nothing);
2. every shard streams sealed batches (a Ray streaming generator with backpressure); a
   driver thread per shard forwards each batch *reference* to the Shuffler (shuffle
   model) or straight to the Server, which opens at most ``window`` batches at once:
   memory is bounded by those windows, not by n, except in the shuffler, which must
   hold the round's multiset;
3. the shuffler refuses to release below its sender floor (authenticated senders, an
   upper bound on the cover), else permutes and forwards;
4. the Server opens every report and says how many it counted; the guarantee and its
   event are computed from the reports actually opened (a report it cannot open hides
   nobody). A round that misses its target there is recorded at its true cost (the
   server has seen the reports) and refused for labelling (:class:`CoverShortfall`), as is
   one whose true cost, composed with the job's earlier rounds, exceeds the ledger's budget;
   otherwise the Server releases the counts once and the ledger records them.

A shard that dies mid-round is restarted by Ray and streams the round again from its
first batch: it re-reads its secret from its node-local key store
(:mod:`rknn_ray.shard_secrets`; the driver never holds it), so the same randomness and the
same report ids go out and the server counts every report once: admission drops the re-sent
copies (``rejected.duplicate_message``: the same sender and sequence number again), and the
server's report-id check (``rejected.replayed``) catches any copy that gets past admission.
A restarted shard that cannot find its secret refuses to start. A shard whose records
cannot be opened again (a table's parts are handed over once) is not waited for: the round
ends at once (:class:`PartyFailure`), unless ``privacy.allow_partial_release`` lets it go on
from the clients the other shards hold, said in the round's result (``partial``).
Whether any report may have reached the Server is kept (:attr:`ProtocolSession.reached_server`):
a failed round with none spent nothing (rknn_ray.job.rounds settles the ledger by it).

Between rounds, :meth:`ProtocolSession.prepare_next_round` has each shard make the next
round's encapsulations ahead (``cluster.precompute_keys``; :mod:`sealing.encapsulation`):
the round then only encrypts and signs. The next round's first call on a shard waits for
its preparation (a Ray actor runs its calls in order), so what is not done by then is
done inside the round, as it would be without it.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from dataclasses import dataclass, field

import numpy as np
import ray

from actors import client_shard as shard_actors
from actors import server as server_actors
from actors import shuffler as shuffler_actors
from actors.client_shard import ClientShardImpl
from actors.server import ServerImpl
from actors.shuffler import ShufflerImpl
from rknn_ray.job.placement import (check_placement_feasible, party_options, placement_of,
                                    shard_options)
from rknn_ray.job.progress import PolledBar, bar_for
from rknn_ray.client_step import RoundSpec, piece_clients, sealed_width
from rknn_ray.errors import PrivacyBudgetError, RknnError, first_line
from rknn_ray.accounting.guarantee import Guarantee, guarantee_of
from rknn_ray.mechanisms.base import Mechanism
from rknn_ray.rng import derived_key
from rknn_ray.shard_secrets import SeededShardSecrets, ShardKeyStore
from sealing.credentials import CredentialIssuer
from sealing.envelope import RoundContext

SHARD_RETRIES = 2
HANDOVER = 2          # shuffled batches the shuffler hands the server at a time (one hop)


class PartyFailure(RknnError):
    """A protocol party (shard, shuffler, server) died and the round could not finish.

    ``released`` says whether the round's counts may have been released: only a Server
    that dies while finalizing can have drawn its noise; a shard, a shuffler, or a
    server that dies while opening leaves nothing released.
    """

    def __init__(self, message: str, party: str, released: bool = False):
        super().__init__(message)
        self.party, self.released = party, released


class ShardLost(PartyFailure):
    """A client shard died mid-round and will not send the rest of its clients' reports
    (``delivered`` of its ``clients`` reached the shuffler or server first, and count).
    Without ``privacy.allow_partial_release`` the round ends here, nothing released."""

    def __init__(self, message: str, shard: int, delivered: int, clients: int):
        super().__init__(message, f"client shard {shard}")
        self.shard, self.delivered, self.clients = shard, delivered, clients

    @classmethod
    def read_once(cls, shard: int, sent: int, delivered: int, clients: int) -> "ShardLost":
        """A table's shard: its rows were handed over once, so no restart can send them."""
        return cls(f"client shard {shard} was lost mid-round after sending {sent} of its "
                   "batches and is not coming back: a table's shard takes its rows once, so it "
                   "cannot be restarted with them; the round is ended with no counts released, "
                   "rather than released from fewer clients than the job has. Fix: re-run the "
                   "job (or set privacy.allow_partial_release: true to release from the clients "
                   "that reported)", shard, delivered, clients)


class _SinkDied(Exception):
    """A client thread's hand-over found the shuffler or server dead (not the shard)."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class CoverShortfall(PrivacyBudgetError):
    """The server opened the round's reports, but too few of them hid each other.

    The reports are seen, so the round is spent: ``guarantee`` and ``event`` are its true
    cost (already in the job's ledger); no counts were released and no labels come from it.
    """

    def __init__(self, message: str, guarantee: Guarantee, event):
        super().__init__(message)
        self.guarantee, self.event = guarantee, event


@dataclass
class RoundResult:
    counts: np.ndarray
    guarantee: Guarantee
    event: object
    mechanism: dict
    messages: int
    received: int
    clients: int
    rejected: dict
    timings: dict = field(default_factory=dict)
    shuffler: dict | None = None
    authenticated_senders: int | None = None   # senders with an admitted, authenticated message
    missing: int | None = None                 # clients whose report was not counted (1 per client)
    placement: dict | None = None              # party -> the Ray node ids its actors ran on
    keys_made_ahead: int | None = None         # messages sealed with encapsulations made ahead
    partial: dict | None = None                # privacy.allow_partial_release: who was lost


@dataclass(frozen=True)
class Parties:
    """Which code each party's Ray actor runs: the production classes by default.

    The session builds every actor from these (as Flower's generic ``ray_actor`` runs the
    logic it is given), so tests inject hostile or crashing parties as subclasses
    (tests/faulty_parties.py) and production code carries no fault parameters.
    ``shards`` overrides the shard class for given shard indices.
    """

    shard: type = ClientShardImpl
    server: type = ServerImpl
    shuffler: type = ShufflerImpl
    shards: dict = field(default_factory=dict)

    def shard_actor(self, i: int):
        return shard_actors.remote_class(self.shards.get(i, self.shard))

    def server_actor(self):
        return server_actors.remote_class(self.server)

    def shuffler_actor(self):
        return shuffler_actors.remote_class(self.shuffler)


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


#: expected messages in a round below which the Server opens them itself (``cluster.openers:
#: null``): starting and warming an opener process costs more than opening a small round's
#: reports in the Server (docs/results.md, "Costs behind design choices").
OPEN_IN_SERVER_BELOW = 20_000


def opener_processes(requested: int | None, expected_messages: float | None = None) -> int:
    """Opener processes for the Server: as asked; else none for a round expected to carry
    fewer than :data:`OPEN_IN_SERVER_BELOW` messages, and one per CPU of the cluster (at
    most 16) for a bigger one."""
    if requested is not None:
        return max(0, int(requested))
    if expected_messages is not None and expected_messages < OPEN_IN_SERVER_BELOW:
        return 0
    cpus = int(ray.cluster_resources().get("CPU", os.cpu_count() or 1))
    return max(1, min(16, cpus))


class ProtocolSession:
    """The actors of one job (see module docstring); use as a context manager."""

    def __init__(self, cfg, sources: list, job_id: str, key_file: str | None = None,
                 progress=None, parties: Parties | None = None):
        self.cfg, self.job_id, self.progress = cfg, job_id, progress
        self._closing = False       # set by close(): client threads still running then go quietly
        #: a report of the current round may have reached the Server (from its first
        #: hand-over on): a round that fails before released nothing to anyone (the shuffler
        #: cannot open a report)
        self.reached_server = False
        self.parties = parties = parties or Parties()
        cl = cfg.cluster
        seeded = cfg.run.rng == "seeded"
        check_placement_feasible(cfg, ["client", "server"] + (["shuffler"]
                                 if cfg.privacy.model == "shuffle" else []))
        self.server = parties.server_actor().options(
            num_cpus=cl.server_cpus, **party_options(cfg, "server")).remote(
            job_id, key_file, cl.openers, cl.window)     # null: the first round sets the count
        # the simulation's credential authority: one key per shard, for its clients only
        issuer = CredentialIssuer(job_id, derived_key(str(cfg.run.seed).encode(), "credentials")
                                  if seeded else None)
        ranges = [(int(src.client_lo), int(src.client_hi)) for src in sources]
        self.verifier = issuer.verifier(ranges)
        # each shard makes (or, restarted, re-reads) its own secret: only names cross Ray
        self.secrets = (SeededShardSecrets(int(cfg.run.seed)) if seeded
                        else ShardKeyStore(job_id, cl.key_store))
        self.shards = []
        # each shard's records by reference (the GCS keeps no records), held while the session
        # lives and handed with every call that needs them ([ref]: the shard fetches it), so a
        # restarted shard gets them again with its next call (ClientShardImpl._records)
        self._sources = [[ray.put(src)] for src in sources]
        # a table's shard takes its parts once: restarted, it cannot open its records again
        self._read_once = [getattr(src, "parts", None) is not None for src in sources]
        self._lost: set = set()     # shards lost for good (privacy.allow_partial_release)
        # data.private.sites: each shard's site name (None: not a site's shard), for placement
        self._sites = [getattr(getattr(src, "site", None), "name", None) for src in sources]
        for i in range(len(sources)):
            self.shards.append(parties.shard_actor(i).options(   # SPREAD: shards share out the client nodes
                num_cpus=cl.shard_cpus, scheduling_strategy="SPREAD",   # (a site's: its nodes)
                **shard_options(cfg, sources[i])).remote(
                i, None, self.secrets, issuer.shard_credential(i, *ranges[i])))
        self.hops: list = []
        self._fixed_nodes: dict | None = None   # where the Server and shufflers run (asked once)
        self._preparing: list = []              # prepare_keys calls not yet collected
        if cfg.privacy.model == "shuffle":      # starts beside the others, not in round 0
            self._shufflers(0)                  # (each round's start_round sets the floor)
        try:
            self.server_public_key = ray.get(self.server.public_key.remote())
            self.shard_clients = ray.get([s.num_clients.remote(src)
                                          for s, src in zip(self.shards, self._sources)])
        except ray.exceptions.RayActorError as exc:
            self.close()
            raise PartyFailure(_actor_death("a party failed to start; nothing was released", exc),
                               "startup") from None
        self.held_clients = int(sum(self.shard_clients))    # the shards' own count
        _end_parts_holders(sources)
        self.num_clients = self.held_clients

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        """End the job's actors; each live shard first deletes its stored secret.

        Every round of the job ran on this session (``--resume`` runs none), so no later
        step needs the secrets; a shard that is already dead leaves its file behind
        (docs/threat-model.md says where).
        """
        self._closing = True
        if getattr(self, "_opened", None) is not None:
            self._opened.close()           # a round that failed leaves its progress poller running
        forgot = [s.forget_secret.remote() for s in self.shards]
        for ref in forgot:
            try:
                ray.get(ref, timeout=10)
            except Exception:  # noqa: BLE001 - best effort: a dead shard cannot delete its file
                pass
        try:
            ray.get(self.server.shutdown.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - best effort: the actor may already be gone
            pass
        for actor in self.shards + self.hops + [self.server]:
            ray.kill(actor)
        self.shards, self.hops, self._sources = [], [], []

    def placement(self) -> dict[str, list[str]]:
        """party -> the Ray node ids its actors run on now, as each actor itself reports it
        (an actor that cannot answer is left out: this never fails a released round)."""
        parties = {"client": self.shards, "shuffler": self.hops, "server": [self.server]}
        return placement_of(parties)

    def _round_placement(self, shard_nodes: list[tuple]) -> dict[str, list[str]]:
        """:meth:`placement` with the shards' nodes as they reported them this round
        (``shard_nodes``: (site name or None, node id) per shard that answered; a site's
        shards are also listed under ``client@<site>``); the Server and the shufflers are
        never restarted (no ``max_restarts``), so where they run is asked once per job."""
        clients: dict[str, set] = {}
        for site, node in shard_nodes:
            clients.setdefault("client", set()).add(node)
            if site is not None:
                clients.setdefault(f"client@{site}", set()).add(node)
        clients = {k: sorted(v) for k, v in clients.items()}
        if self._fixed_nodes is None:
            fixed = placement_of({"shuffler": self.hops, "server": [self.server]})
            if "server" not in fixed or (self.hops and "shuffler" not in fixed):
                return {**clients, **fixed}
            self._fixed_nodes = fixed
        return {**clients, **self._fixed_nodes}

    def _shufflers(self, floor: int) -> list:
        """The shuffler chain (made once per job, reused by every round)."""
        sh = self.cfg.shuffle
        layers = int(sh.onion_layers)
        if not self.hops:
            ctx = RoundContext(self.job_id, 0)
            self.hops = [self.parties.shuffler_actor().options(
                num_cpus=self.cfg.cluster.shuffler_cpus, **party_options(self.cfg, "shuffler")).remote(
                floor if i == 0 else 0, ctx=ctx, onion_layer=(i + 1) if layers else None,
                forwarded_input=i > 0) for i in range(max(1, layers))]
            self._fixed_nodes = None
        return self.hops

    # ------------------------------------------------------------------ between rounds
    def prepare_next_round(self, messages: int | None = None, wait: bool = False) -> dict | None:
        """Have every shard make the next round's encapsulations now (each as many as it
        sealed in the last round per layer, or ``messages``), while the driver does other
        work. Nothing to do before the first round or with ``cluster.precompute_keys``
        off. ``wait=True`` returns the shards' summed counts and CPU seconds; otherwise the
        next :meth:`run_round` collects the calls (a failed one only means the round makes
        its keys itself: a dead shard is restarted by the round as always)."""
        cl = self.cfg.cluster
        if not cl.precompute_keys:
            return None
        for i, shard in enumerate(self.shards):
            if i in self._lost:           # privacy.allow_partial_release: not in later rounds
                continue
            try:
                self._preparing.append(shard.prepare_keys.remote(messages, int(cl.precompute_max)))
            except ray.exceptions.RayError:   # never fatal: that shard makes its keys in the round
                continue
        return self._collect_prepared() if wait else None

    def _collect_prepared(self) -> dict:
        total: dict = {}
        refs, self._preparing = self._preparing, []
        for ref in refs:
            try:
                got = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            for key, v in got.items():
                total[key] = total.get(key, 0) + v
        return total

    # ------------------------------------------------------------------ one round
    def run_round(self, round_id: int, mechanism: Mechanism, encoder, query_features: np.ndarray,
                  ledger, record_release: bool = True, connection=None) -> RoundResult:
        """Run one private labeling round end to end and record it in ``ledger``.

        ``connection``: the round's public connection plan
        (:class:`rknn_ray.labeling.connection.Connection`), shipped to every shard with the
        queries in every trust model; None: reverse k-NN.

        ``record_release=False``: the caller records the released round (a job does, once
        release.npz is on disk); the ledger still checks it before the release, and a
        round that misses its target is recorded here at its true cost."""
        cfg = self.cfg
        model = mechanism.model
        ctx = RoundContext(self.job_id, round_id)
        ledger.check(guarantee_of(mechanism))   # refuse before any client works
        self.reached_server = False             # this round's reports: none handed over yet
        if self._preparing:
            self._collect_prepared()
        say = self.progress.say if self.progress else (lambda _m: None)
        timings: dict[str, float] = {}
        hops, hop_keys = [], ()
        expected = self.held_clients * float(mechanism.describe().get(
            "messages_per_client_expected", 1.0))
        if model == "shuffle":
            floor = mechanism.min_senders()
            if cfg.shuffle.min_senders is not None:
                floor = max(floor, int(cfg.shuffle.min_senders))
            hops = self._shufflers(floor)
            distributed = (cfg.shuffle.distributed_above is not None and not cfg.shuffle.onion_layers
                           and expected > cfg.shuffle.distributed_above)
            if cfg.shuffle.onion_layers:
                hop_keys = tuple(ray.get([h.public_key.remote() for h in hops]))
        spec = RoundSpec(ctx, mechanism, encoder, np.ascontiguousarray(query_features),
                         int(cfg.rknn.k), int(mechanism.params.num_classes),
                         self.server_public_key, hop_keys,
                         float(cfg.shuffle.dropout) if model == "shuffle" else 0.0,
                         randomness_label=(f"seeded:{int(cfg.run.seed)}"
                                           if cfg.run.rng == "seeded" else None),
                         more_rounds=int(cfg.rounds.count) > 1, connection=connection)
        # the party that sees senders admits them (credentials, allowance, the round's one
        # report length): the first shuffler, else the server
        admission = (self.verifier, ctx, mechanism.messages_per_sender(), sealed_width(spec),
                     spec.more_rounds)
        ray.get([h.start_round.remote(round_id, floor if i == 0 else 0, distributed,
                                      admission if i == 0 else None)
                 for i, h in enumerate(hops)]
                + [self.server.begin_round.remote(ctx, mechanism, None if hops else admission,
                                                  opener_processes(cfg.cluster.openers, expected))])
        sink = hops[0] if hops else self.server
        self._opened = opened = self._opened_bar()   # closed below, or by close() after a failure
        t0 = time.perf_counter()
        partial = self._stream_clients(ray.put(spec), sink, say)
        timings["clients"] = time.perf_counter() - t0   # central/local: opening overlaps this
        # the shards are done: their stage CPU and nodes come while the server opens
        infos = [(i, s.round_info.remote()) for i, s in enumerate(self.shards)
                 if i not in self._lost]      # a lost shard's node may be gone: not asked
        shuffle_stats = None
        if hops:
            t1 = time.perf_counter()
            refs, shuffle_stats = self._shuffle(hops, mechanism)
            timings["shuffle"] = time.perf_counter() - t1      # floor check to first hand-over
            self.reached_server = True
            for ref in self._handed_over(hops, refs):   # the Server's window bounds what is in flight
                self._call(self.server.submit.remote(ref), "server", released=False)
        n = shuffle_stats["senders"] if shuffle_stats else self.num_clients
        # the true cost, from the reports the server actually opened
        tally = self._call(self.server.tally.remote(), "server", released=False)
        try:
            guarantee, event = opened_cost(round_id, mechanism, n, tally, ledger, self.num_clients)
        except CoverShortfall:
            opened.close(tally["received"])
            raise
        seed = cfg.run.seed + 1_000_003 * (round_id + 1)
        # the release is out of every reported timing (stages, console): the exact samplers'
        # run time grows with the noise they draw
        untimed = getattr(self.progress, "untimed", None)
        with untimed("release") if untimed else contextlib.nullcontext():
            out = self._call(self.server.finish.remote(cfg.run.rng, seed), "server", released=True)
        opened.close(out["received"])
        if record_release:      # checked above, released since: recorded as it happened
            ledger.record_spent(guarantee, round_id=round_id,
                                messages=out["messages"], clients=self.num_clients)
        if shuffle_stats is not None:
            honest = getattr(mechanism, "n_honest", guarantee.n)    # multi: the noise senders
            seen = f"{tally['messages']} messages opened from {n} authenticated senders; "
            say(f"  cover: {seen}eps={guarantee.eps:.4g} assuming at least {honest} senders "
                f"honest (honest fraction {getattr(mechanism, 'honest_fraction', 1.0):g})")
        # first batch in to last batch opened (overlaps "clients" when nothing is shuffled)
        timings["server_open"] = out["timings"].get("open_wall", 0.0)
        shard_nodes, ahead = [], 0
        for i, ref in infos:
            try:
                info = ray.get(ref, timeout=60)
            except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
                continue            # never fails a released round (placement leaves it out)
            shard_nodes.append((self._sites[i], info["node"]))
            ahead += int(info.get("keys_made_ahead", 0))
            for key, v in info["timings"].items():
                timings[f"shards_{key}_cpu"] = timings.get(f"shards_{key}_cpu", 0.0) + v
        rejected = dict(out["rejected"])
        if shuffle_stats is not None:            # what the first hop's admission dropped
            for kind, v in shuffle_stats["hops"][0].get("admission", {}).get("rejected", {}).items():
                rejected[kind] = rejected.get(kind, 0) + v
        authenticated = (shuffle_stats["senders"] if shuffle_stats
                         else out.get("authenticated_senders", self.num_clients))
        # one report per client (every model but multi-message): reports that never arrived
        missing = (max(0, self.num_clients - out["messages"])
                   if mechanism.messages_per_sender() == 1 else None)
        return RoundResult(out["counts"], guarantee, event, mechanism.describe(), out["messages"],
                           out["received"], self.num_clients, rejected, timings,
                           shuffle_stats, authenticated, missing,
                           self._round_placement(shard_nodes), ahead, partial)

    def _opened_bar(self):
        """The "reports opened" bar, polled from the Server while a console shows it (with
        progress off nothing polls: an actor call every 0.5 s for a bar nobody sees)."""
        if self.progress is None or not getattr(self.progress, "enabled", True):
            return _NoPoll()
        return PolledBar(bar_for(self.progress, "reports opened", None, "reports"),
                         lambda: ray.get(self.server.opened.remote(), timeout=10))

    def _call(self, ref, party: str, released: bool):
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            what = ("the counts may have been released" if released   # else: reports it
                    else "no counts were released")                       # opened stay spent
            raise PartyFailure(_actor_death(f"the {party} died; {what}", exc), party,
                               released) from None

    def _stream_clients(self, spec_ref, sink, say) -> dict | None:
        """One driver thread per shard forwards its batch refs to ``sink`` as they appear.

        Returns None when every shard sent its round, else (``privacy.allow_partial_release``
        only) what was lost: the shards and the clients they held. A lost shard without that
        option, or any other failure, is raised here as one error (never a thread's
        traceback)."""
        cl = self.cfg.cluster
        is_shuffler = sink is not self.server
        lock, errors, lost = threading.Lock(), [], {}
        sealed = bar_for(self.progress, "clients sealed", self.num_clients, "clients")
        pooled = bar_for(self.progress, "messages into the shuffler", None, "msgs") \
            if is_shuffler else None
        allow_partial = bool(getattr(self.cfg.privacy, "allow_partial_release", False))

        def pump(i: int, shard) -> None:
            try:
                failure = _pump(i, shard)
            except BaseException as exc:  # noqa: BLE001 - said once by the driver thread below
                failure = exc
            if failure is None or self._closing:
                return
            if allow_partial and isinstance(failure, ShardLost):
                lost[i] = failure
            else:
                errors.append(failure)

        def _pump(i: int, shard):
            if i in self._lost:         # allow_partial_release: gone for the job's later rounds
                return ShardLost(f"client shard {i} was lost in an earlier round", i, 0,
                                 self.shard_clients[i])
            sizes = piece_clients(self.shard_clients[i], int(cl.batch_clients))
            source = self._sources[i]           # close() empties the list under a late thread
            once = self._read_once[i]
            sent = 0
            for attempt in range(SHARD_RETRIES + 1):
                try:
                    gen = shard.stream_reports.options(
                        num_returns="streaming",
                        _generator_backpressure_num_objects=max(2, int(cl.window))
                    ).remote(spec_ref, int(cl.batch_clients), source)
                    sent = 0
                    for ref in gen:
                        if not is_shuffler:
                            self.reached_server = True
                        try:
                            rows = ray.get(sink.submit_refs.remote([ref]) if is_shuffler
                                           else sink.submit.remote(ref))
                        except ray.exceptions.RayActorError as exc:
                            if isinstance(exc, ray.exceptions.RayTaskError):
                                raise   # the sink ran and failed on the shard's batch: the shard's
                            raise _SinkDied(exc) from None      # the sink itself died
                        sent += 1
                        if attempt == 0:      # a re-sent round is not new progress
                            with lock:
                                sealed.update(sizes[sent - 1] if sent <= len(sizes) else 0)
                                if pooled is not None:
                                    pooled.update(int(rows or 0))
                    return None
                except _SinkDied as died:
                    sink_party = "shuffler" if is_shuffler else "server"
                    return PartyFailure(_actor_death(
                        f"the {sink_party} died; no counts were released", died.cause), sink_party)
                except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError,
                        ray.exceptions.NodeDiedError) as exc:
                    if self._closing:        # the job is ending (an interrupt): no retry, no line
                        return None
                    if once:
                        return ShardLost.read_once(i, sent, sum(sizes[:sent]),
                                                   self.shard_clients[i])
                    if attempt == SHARD_RETRIES:
                        return ShardLost(_actor_death(
                            f"client shard {i} died {attempt + 1} times; no counts were released",
                            exc), i, 0, self.shard_clients[i])
                    say(f"  client shard {i} died after {sent} batches; waiting for Ray to restart "
                        "it; it re-sends the round (same reports, counted once)")
                    alive, why = _wait_alive(shard, source)
                    if not alive:
                        return ShardLost(_actor_death(
                            f"client shard {i} died and did not come back; no counts were "
                            "released", why or exc), i, 0, self.shard_clients[i])
            return None

        threads = [threading.Thread(target=pump, args=(i, s), daemon=True)
                   for i, s in enumerate(self.shards)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sealed.close()
        if pooled is not None:
            pooled.close()
        if errors:
            err = errors[0]
            cause = err.as_instanceof_cause() if isinstance(err, ray.exceptions.RayTaskError) else err
            raise cause
        if not lost:
            return None
        self._lost.update(lost)
        gone = sum(f.clients - f.delivered for f in lost.values())
        partial = {"lost_shards": sorted(lost), "clients": self.num_clients,
                   "clients_lost": int(gone), "option": "privacy.allow_partial_release"}
        say(f"  PARTIAL: client shard(s) {', '.join(map(str, sorted(lost)))} lost mid-round; the "
            f"round goes on without up to {gone} of {self.num_clients} clients "
            "(privacy.allow_partial_release)")
        return partial

    def _handed_over(self, hops: list, refs: list):
        """The shuffled batches for the server: one hop hands them over ``HANDOVER`` at a time,
        each as soon as it is final, and makes the next ones while the server opens these (a
        bounded window in the object store); an onion chain's last hop released them all."""
        while refs:
            more = hops[0].more_refs.remote(HANDOVER) if len(hops) == 1 else None
            yield from refs
            refs = self._call(more, "shuffler", released=False) if more is not None else []

    def _shuffle(self, hops: list, mechanism: Mechanism) -> tuple[list, dict]:
        """Release through the shuffler chain; returns (batch refs for the server, stats)."""
        # submitted together: the actor runs them in this order, with one wait instead of three
        before = hops[0].stats.remote()
        released = hops[0].release_refs.remote(HANDOVER if len(hops) == 1 else None)
        after = hops[0].stats.remote()
        try:
            stats = [ray.get(before)]
            out = ray.get(released)
        except ray.exceptions.RayTaskError as exc:
            if isinstance(exc.as_instanceof_cause(), PrivacyBudgetError):
                raise PrivacyBudgetError(
                    f"round refused by the shuffler: {stats[0]['senders']} distinct senders, "
                    "the target needs "
                    f"{mechanism.min_senders()}; no counts were released") from None
            raise
        except ray.exceptions.RayActorError as exc:
            raise PartyFailure(_actor_death("the shuffler died; no counts were released", exc),
                               "shuffler") from None
        try:
            stats[0] = ray.get(after)
        except ray.exceptions.RayActorError as exc:
            raise PartyFailure(_actor_death("the shuffler died; no counts were released", exc),
                               "shuffler") from None
        for hop in hops[1:]:
            ray.get([hop.submit.remote(r) for r in out])
            out = ray.get(hop.release_refs.remote())
            stats.append(ray.get(hop.stats.remote()))
        return out, {"hops": stats, "senders": stats[0]["senders"],
                     "messages": stats[-1]["messages"], "bytes": stats[0]["bytes"]}


class _NoPoll:
    """The opened-reports bar when no console shows progress: nothing to poll or close."""

    def close(self, final: int | None = None) -> None:
        pass


def opened_cost(round_id: int, mechanism: Mechanism, senders: int, tally: dict, ledger,
                clients: int) -> tuple[Guarantee, object]:
    """The round's true (guarantee, event) from the ``senders`` admitted and the reports the
    server opened (``tally``), checked against the target and the rounds before it. Short of
    either, the round is recorded at its true cost (the server has seen the reports) and
    :class:`CoverShortfall` raised. Both sessions (in-cluster and remote) end a round here."""
    counted = tally["messages"]
    event = mechanism.round_event(senders, counted)
    guarantee = guarantee_of(mechanism, senders, event, opened=counted)
    shortfall = None
    if guarantee.eps > mechanism.params.eps * (1 + 1e-9):
        shortfall = _shortfall_message(round_id, mechanism, guarantee, senders, tally)
    else:
        try:        # composed with the rounds before it (pld: its true PLD, not its eps)
            ledger.check(guarantee)
        except PrivacyBudgetError as exc:
            shortfall = (f"round {round_id + 1} refused for labelling: the reports opened "
                         f"cost more than the rounds plan left ({first_line(exc)}). The "
                         "server has seen them, so the round is recorded at its true cost")
    if shortfall is not None:
        ledger.record_spent(guarantee, round_id=round_id,
                            note="refused for labelling: too few reports opened to meet "
                                 "the target; recorded at its true cost",
                            messages=counted, clients=clients,
                            refused="too few reports opened to meet the target")
        raise CoverShortfall(shortfall, guarantee, event)
    return guarantee, event


def _shortfall_message(round_id: int, mechanism: Mechanism, g: Guarantee, senders: int,
                       tally: dict) -> str:
    """What happened, what it cost, and the fix (the console and incomplete.json show it)."""
    rejected = ", ".join(f"{k} {v}" for k, v in sorted(tally["rejected"].items()) if v)
    gamma = getattr(mechanism, "honest_fraction", 1.0)
    return (f"round {round_id + 1} refused for labelling: the server opened {tally['messages']} "
            f"reports of {senders} authenticated senders (rejected: {rejected or 'none'}); "
            f"{g.n} of them count as cover (honest fraction {gamma:g}), which gives "
            f"eps={g.eps:.4g} > target {mechanism.params.eps:g}. The server has seen these "
            f"reports, so the round is recorded at its true cost (eps={g.eps:.4g}, "
            f"delta={g.delta:.3g}) and no labels come from it. Fix: set privacy.honest_fraction "
            f"to the share of senders you expect to send valid reports (e.g. 0.9): eps0 is then "
            f"calibrated for that many; or find out why reports fail to open")


def _wait_alive(actor, source, timeout: float = 120.0) -> tuple[bool, BaseException | None]:
    """Block until a restarting shard answers again (reopening its records from ``source``):
    (True, None), or (False, last error).

    A restart whose constructor raised (e.g. a shard that lost its secret) is final: no wait.
    """
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            ray.get(actor.num_clients.remote(source),
                    timeout=max(1.0, deadline - time.monotonic()))
            return True, None
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            last = exc
            if CREATION_FAILED in str(exc):
                return False, exc
            time.sleep(0.5)
        except ray.exceptions.RayTaskError as exc:   # it restarted, and cannot open its records
            return False, exc.as_instanceof_cause()
    return False, last


#: Ray's words for an actor whose constructor raised (the cause is the text's last line)
CREATION_FAILED = "error raised in its creation task"


def _actor_death(what: str, exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return f"{what} ({type(exc).__name__})"
    if CREATION_FAILED in lines[0]:      # the constructor's own error names the problem and fix
        return f"{what}: {lines[-1]}"
    return f"{what} ({lines[0][:200]})"


def _end_parts_holders(sources) -> None:
    """Every shard has opened its records: end the actors that kept the scan's parts (about
    0.27 GB each, for the rest of the job otherwise; actors/parts_holder.py)."""
    ended = set()
    for src in sources:
        parts = getattr(src, "parts", None)
        end = getattr(parts, "end", None)
        if end is not None and id(parts) not in ended:
            ended.add(id(parts))
            end()

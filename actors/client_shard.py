"""ClientShard: one Ray actor hosting many virtual clients (the simulation backend).

The shard opens its own private records from its source (:mod:`rknn_ray.data.sources`:
only its clients' records, cut from the partition the driver prepared once and handed
over by reference through the object store) and never sends them anywhere. It also
makes its own secret (:mod:`rknn_ray.shard_secrets`): Ray is handed only where to keep
it (a node-local, owner-only key store and the job id), so the secret never crosses the
driver, the GCS or the object store; Ray keeps only those public names for restarts. For
a round it streams one sealed Arrow batch per ``batch_clients`` clients, the last one in
pieces (:func:`rknn_ray.client_step.client_step`, ``client_pieces``) as a Ray streaming
generator, so the driver forwards batches while the shard is still sealing and memory is
bounded by the generator's backpressure window.

Retries never re-randomize: batch ``b`` of round ``t`` draws its randomness and its
report ids from the shard's secret and ``(job, t, b)``; a restarted shard reads the same
secret from its key store and re-sends byte-for-byte the same plaintexts and ids, which
the server counts once (a shard restarted where its secret is gone refuses to start).
Every message is signed with the shard's credential for its sender
(:mod:`sealing.credentials`), so the party that sees senders can authenticate them and
enforce the per-sender allowance.

Between rounds the session may ask a shard to :meth:`~ClientShardImpl.prepare_keys`: it
makes the next round's encapsulations (ephemeral X25519, exchange, key derivation: the
data-free bulk of sealing) ahead, so the round itself only encrypts and signs. Each is used once and
never leaves this process (:mod:`sealing.encapsulation`); a restarted shard has none and
makes them as it seals. When more rounds follow (``RoundSpec.more_rounds``), its
records' embeddings are kept across rounds too (the job's encoder does not change; only the
queries do), up to :data:`EMBED_KEEP_MB`.
"""
from __future__ import annotations

import hashlib
import pickle
import time
import warnings

import numpy as np
import ray

from rknn_ray.client_step import RoundSpec, client_pieces, client_step, tail_pieces
from rknn_ray.rng import derived_key
from sealing.encapsulation import EncapsulationPool
from sealing.envelope import SERVER_LAYER, layer_info


#: the concurrency group of the call that ends a shard's job (see forget_secret)
CLOSING = "closing"

#: a shard keeps its records' embeddings across rounds up to this size (a job's encoder is
#: fixed, and embedding a shard's records again costs CPU seconds every round)
EMBED_KEEP_MB = 256


def _restarted() -> bool:
    """Whether this actor is a restarted incarnation (False outside a Ray actor).

    Inside an actor an error of Ray's is raised, not guessed: guessing "first start"
    could let a restarted shard draw a fresh secret.
    """
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return False
    with warnings.catch_warnings():     # Ray's property reads its own deprecated actor_id
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


class ClientShardImpl:
    """The client party's logic; tests inject hostile or crashing subclasses
    (tests/faulty_parties.py) through :func:`remote_class`, never through parameters here."""

    def __init__(self, shard_id: int, source, secrets, credential=None):
        """``secrets``: a :class:`rknn_ray.shard_secrets.ShardKeyStore` (or, seeded runs,
        :class:`~rknn_ray.shard_secrets.SeededShardSecrets`), never the secret itself.
        ``source``: the shard's records source, or None when its records ride with the calls
        that need them (``[ObjectRef]``, the session's way; see :meth:`_records`)."""
        self.shard_id = shard_id
        self._secrets = secrets
        self._secret = secrets.secret(shard_id, restarted=_restarted())
        self.records = None if source is None else source.open(order_key=self._order_key())
        self._credential = credential        # sealing.credentials.ShardCredential for its clients
        self.timings: dict[str, float] = {}
        self._pool = EncapsulationPool()       # next round's encapsulations (prepare_keys)
        self._pool_at_start = self._pool.stats()
        self._recipients: list[tuple[bytes, bytes]] = []   # last round's (key, KDF info) per layer
        self._sealed = 0                       # messages the last round sealed (per layer)
        self._embed_key, self._embedded, self._embedded_bytes = None, {}, 0   # see _embedder

    def _records(self, source=None):
        """This shard's records, opened on first use from ``source`` (``[ObjectRef]``: a
        nested reference, fetched here). The session hands the reference with every call
        rather than to the constructor: a restartable actor with a constructor argument in
        the object store makes Ray log an error line at every job start (ray#53727), and a
        restarted shard gets the reference again with its next call."""
        if self.records is None:
            if source is None:
                raise ValueError(f"shard {self.shard_id} has no records yet: pass its source")
            if isinstance(source, list):
                (source,) = ray.get(source)
            self.records = source.open(order_key=self._order_key())
        return self.records

    def _order_key(self) -> bytes:
        """The key its clients' kept records and sender order are drawn from: the shard's
        secret, so no record's value and no public key moves a sender
        (:func:`rknn_ray.data.partition.sender_order`); a restarted shard draws the same."""
        return derived_key(self._secret, "sender order")

    def num_clients(self, source=None) -> int:
        return int(self._records(source).num_clients)

    def max_records_per_client(self, source=None) -> int:
        return int(self._records(source).max_records_per_client)

    def stream_reports(self, spec: RoundSpec, batch_clients: int, source=None):
        """Yield the round's sealed batches, one per ``batch_clients`` clients, in a fixed order;
        the last batch in pieces (:func:`~rknn_ray.client_step.tail_pieces`), so the server
        opens most of it while the rest is sealed."""
        records = self._records(source)
        self.timings = {}           # this round's stage CPU only (get_timings after the round)
        self._recipients = round_recipients(spec)
        self._sealed = 0
        self._pool_at_start = self._pool.stats()
        embed = self._embedder(spec.encoder, batch_clients, spec.more_rounds)
        batches = records.batches(batch_clients)
        nxt = next(batches, None)
        b = 0
        while nxt is not None:
            (x, y, ids), nxt = nxt, next(batches, None)
            emb = embed(b, x)
            if nxt is not None:
                items = [client_step(spec, self._secret, b, x, y, ids, self.timings,
                                     self._credential, self._pool, emb)]
            else:
                items = client_pieces(spec, self._secret, b, x, y, ids,
                                      tail_pieces(np.unique(ids).size), self.timings,
                                      self._credential, self._pool, emb)
            for item in items:
                self._sealed += item.num_rows
                yield item
            b += 1

    def _embedder(self, encoder, batch_clients: int, keep: bool):
        """``embed(b, features)``: batch ``b``'s embedding, kept from an earlier round of the
        same encoder and batching (the records never change; the encoder is the job's), else
        computed here and, when ``keep`` (more rounds follow), kept while the kept ones stay
        under EMBED_KEEP_MB."""
        key = (hashlib.sha256(pickle.dumps(encoder)).digest(), int(batch_clients))
        if key != self._embed_key:
            self._embed_key, self._embedded, self._embedded_bytes = key, {}, 0

        def embed(b: int, features: np.ndarray) -> np.ndarray:
            got = self._embedded.get(b)
            if got is None:
                t0 = time.thread_time()
                got = encoder.transform(features)
                self.timings["embed"] = self.timings.get("embed", 0.0) + time.thread_time() - t0
                if keep and self._embedded_bytes + got.nbytes <= EMBED_KEEP_MB << 20:
                    self._embedded[b] = got
                    self._embedded_bytes += got.nbytes
            return got
        return embed

    def prepare_keys(self, messages: int | None = None, max_ready: int = 1 << 20) -> dict:
        """Make the next round's encapsulations ahead: ``messages`` per layer (None: as many
        as the last round sealed) for the last round's recipients, at most ``max_ready`` in
        all; ones for other keys are dropped. Returns the pool's counts and this call's CPU."""
        if int(max_ready) < 0:
            raise ValueError(f"max_ready must be >= 0, got {max_ready}")
        self._pool.max_ready = int(max_ready)
        count = self._sealed if messages is None else int(messages)
        self._pool.drop(keep=self._recipients)
        cpu0, made = self._pool.fill_cpu_s, 0
        for recipient, info in self._recipients:
            made += self._pool.fill(recipient, info, count)
        return {**self._pool.stats(), "made_now": made, "cpu_s": self._pool.fill_cpu_s - cpu0}

    def get_timings(self) -> dict:
        return dict(self.timings)

    def round_info(self) -> dict:
        """This round's stage CPU, how many of its encapsulations were made ahead, and the Ray
        node this incarnation runs on, in one call (a restarted shard may run on another
        node, so the node is asked every round)."""
        ahead = self._pool.stats()["used"] - self._pool_at_start["used"]
        return {"timings": dict(self.timings), "node": ray.get_runtime_context().get_node_id(),
                "keys_made_ahead": int(ahead)}

    @ray.method(concurrency_group=CLOSING)
    def forget_secret(self) -> bool:
        """Delete this shard's stored secret (the job's rounds are over); True if one was.

        Runs in its own concurrency group: after a Server or Shuffler death the shard's
        round call may still be blocked on its stream's backpressure (nobody consumes it
        any more), and a call queued behind it would never delete the file."""
        return self._secrets.forget(self.shard_id)


def round_recipients(spec: RoundSpec) -> list[tuple[bytes, bytes]]:
    """(public key, key-derivation info) of every layer a round's reports are sealed to: the
    server's, then each shuffler hop's (onion mode)."""
    out = [(bytes(spec.server_public_key), layer_info(spec.ctx.header_prefix(SERVER_LAYER)))]
    for hop, key in enumerate(spec.hop_public_keys):
        out.append((bytes(key), layer_info(spec.ctx.header_prefix(hop + 1))))
    return out


#: a shard that dies is restarted (it re-sends the same reports); its tasks are not retried;
#: forget_secret runs beside a round call still blocked in its stream (its own thread)
SHARD_ACTOR_OPTIONS = {"max_restarts": 2, "max_task_retries": 0,
                       "concurrency_groups": {CLOSING: 1}}


def remote_class(impl: type = ClientShardImpl):
    """The Ray actor class that runs ``impl`` (ClientShardImpl or a subclass) as a shard,
    with the production restart policy."""
    return ClientShard if impl is ClientShardImpl else ray.remote(**SHARD_ACTOR_OPTIONS)(impl)


ClientShard = ray.remote(**SHARD_ACTOR_OPTIONS)(ClientShardImpl)

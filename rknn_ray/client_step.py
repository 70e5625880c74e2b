"""The client step of a round, as a library function: records in, sealed Arrow batch out.

    batch = client_step(spec, secret, batch_index, features, labels, client_ids)

For one batch of virtual clients: embed the records with the public encoder,
connect each to its k nearest queries (faiss; or the k the round's public connection plan
picks, ``RoundSpec.connection``), randomize each client's answer with
the round's mechanism (vectorized over the batch), seal every message for the server
(and wrap once per shuffler hop in onion mode) and return one Arrow batch with a
``sender`` and a ``report`` column. ClientShard actors, the in-process benchmark and
the tests all call this one function. With the shard's credential each message is also
signed for its sender (``seq`` and ``tag`` columns, :mod:`sealing.credentials`).

Retries never re-randomize: the batch's randomness and its report ids are derived
from the shard's secret and (job, round, batch index), so the same call re-creates
the same reports and ids (the server counts an id once).
"""
from __future__ import annotations

import hashlib
import hmac
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rknn_ray.mechanisms.base import Mechanism, MessageBatch
from rknn_ray.labeling.rknn import build_answers
from rknn_ray.rng import derived_generator
from sealing.credentials import with_credentials
from sealing.envelope import RoundContext, report_ids_from_key, seal_batch, to_arrow
from sealing.onion import seal_onion


@dataclass(frozen=True)
class RoundSpec:
    """Everything public a client needs for one round (sent once per round to each shard)."""
    ctx: RoundContext
    mechanism: Mechanism
    encoder: object                  # rknn_ray.representation.represent.Encoder, fitted on public data
    query_features: np.ndarray       # (s, D) the round's queries
    k: int
    num_classes: int
    server_public_key: bytes
    hop_public_keys: tuple = ()      # onion mode: one per shuffler hop, first hop first
    dropout: float = 0.0             # simulated: each client independently never sends
    pad_to: int | None = None
    # what the clients' coins are derived from beside the secret and (round, batch): None,
    # the job id (a fresh one per job); a seeded simulation names its seed instead, so the
    # same command releases the same counts (run.rng: seeded, NOT private)
    randomness_label: str | None = None
    # more rounds of this job follow: keep what they reuse (a shard its records' embeddings,
    # every party its clients' credential keys); a one-round job keeps nothing
    more_rounds: bool = False
    # which k queries a record votes for: a rknn_ray.labeling.connection.Connection planned
    # by the server from public data only (a price per query), None for reverse k-NN
    connection: object = None


def batch_key(secret: bytes, ctx: RoundContext, batch_index: int, purpose: str) -> bytes:
    """HMAC-SHA256(secret, purpose | job | round | batch): a per-batch key, stable across retries."""
    msg = f"{purpose}\x00{ctx.job_id}\x00{ctx.round_id}\x00{batch_index}".encode()
    return hmac.new(secret, msg, hashlib.sha256).digest()


def sealed_width(spec: RoundSpec) -> int:
    """The one ciphertext length of the round (what an honest client's reports measure)."""
    dummy = np.zeros((1, spec.mechanism.message_size), np.uint8)
    if spec.hop_public_keys:
        sealed = seal_onion(spec.server_public_key, list(spec.hop_public_keys), dummy, spec.ctx,
                            spec.pad_to)
    else:
        sealed = seal_batch(spec.server_public_key, dummy, spec.ctx, spec.pad_to)
    return int(sealed.shape[1])


def client_step(spec: RoundSpec, secret: bytes, batch_index: int, features: np.ndarray,
                labels: np.ndarray, client_ids: np.ndarray,
                timings: dict | None = None, credential=None, pool=None,
                embedding: np.ndarray | None = None) -> pa.RecordBatch:
    """Sealed reports of one batch of whole clients (see module docstring).

    With a ``credential`` (the shard's :class:`sealing.credentials.ShardCredential`) every
    message also carries its ``seq`` and ``tag`` columns. ``pool``: encapsulations made
    ahead (:class:`sealing.encapsulation.EncapsulationPool`), each used once.
    ``embedding``: ``spec.encoder.transform(features)`` when the caller kept it from an
    earlier round (the encoder is the job's; only the queries change between rounds).
    """
    msgs, report_ids = client_messages(spec, secret, batch_index, features, labels, client_ids,
                                       timings, embedding)
    return seal_messages(spec, msgs, report_ids, timings, credential, pool)


def client_pieces(spec: RoundSpec, secret: bytes, batch_index: int, features: np.ndarray,
                  labels: np.ndarray, client_ids: np.ndarray, pieces: int,
                  timings: dict | None = None, credential=None, pool=None,
                  embedding: np.ndarray | None = None):
    """:func:`client_step`'s reports in ``pieces`` Arrow batches, each sealed and yielded
    as soon as it is done, so the next party starts on the first while the rest is sealed.

    The batch is randomized as one (the same randomness and report ids as
    :func:`client_step`); pieces cut at client boundaries, so every sender's messages
    (and sequence numbers) stay in one piece.
    """
    msgs, report_ids = client_messages(spec, secret, batch_index, features, labels, client_ids,
                                       timings, embedding)
    for lo, hi in piece_bounds(np.unique(client_ids), pieces):
        keep = (msgs.senders >= lo) & (msgs.senders < hi)
        yield seal_messages(spec, MessageBatch(msgs.payloads[keep], msgs.senders[keep]),
                            report_ids[keep], timings, credential, pool)


def piece_bounds(ids: np.ndarray, pieces: int) -> list[tuple[int, int]]:
    """[lo, hi) client-id ranges cutting the sorted ``ids`` into ``pieces`` near-equal parts
    (the first starts at -inf and the last ends at +inf: no sender falls outside)."""
    parts = [p for p in np.array_split(ids, max(1, min(int(pieces), ids.size))) if p.size]
    if not parts:
        return [(-(1 << 62), 1 << 62)]
    cuts = [int(p[0]) for p in parts[1:]]
    return list(zip([-(1 << 62)] + cuts, cuts + [1 << 62]))


TAIL_PIECES, PIECE_CLIENTS = 8, 256     # a shard's last batch: up to 8 pieces of >= ~256 clients


def tail_pieces(clients: int) -> int:
    """Pieces a shard's last batch of ``clients`` is sealed in: what is sealed after the last
    piece goes out is what the server opens alone, so that tail is kept short."""
    return max(1, min(TAIL_PIECES, -(-int(clients) // PIECE_CLIENTS)))


def piece_clients(num_clients: int, batch_clients: int) -> list[int]:
    """Clients in each item a shard streams (``ClientShardImpl.stream_reports``): its batches
    of ``batch_clients``, the last one in :func:`tail_pieces` pieces (the driver's progress)."""
    sizes = [min(batch_clients, num_clients - lo) for lo in range(0, num_clients, batch_clients)]
    if not sizes:
        return []
    last = sizes.pop()
    return sizes + [int(p.size) for p in np.array_split(np.arange(last), tail_pieces(last))
                    if p.size]


def client_messages(spec: RoundSpec, secret: bytes, batch_index: int, features: np.ndarray,
                    labels: np.ndarray, client_ids: np.ndarray, timings: dict | None = None,
                    embedding: np.ndarray | None = None):
    """The batch's randomized messages and their report ids, not yet sealed."""
    t = time.thread_time()        # CPU of this thread: other load does not inflate it
    emb = spec.encoder.transform(features) if embedding is None else embedding
    t0 = time.thread_time()
    answers = build_answers(emb, labels, client_ids, spec.query_features, spec.k, spec.num_classes,
                            spec.connection)
    t1 = time.thread_time()
    ctx = spec.ctx
    rng = derived_generator(secret, spec.randomness_label or ctx.job_id, ctx.round_id,
                            batch_index)
    msgs = spec.mechanism.randomize(answers, rng)
    if spec.dropout > 0:
        ids = np.unique(client_ids)
        gone = ids[rng.random(ids.size) < spec.dropout]
        keep = ~np.isin(msgs.senders, gone)
        msgs = MessageBatch(msgs.payloads[keep], msgs.senders[keep])
    report_ids = report_ids_from_key(batch_key(secret, ctx, batch_index, "report-id"), len(msgs))
    if timings is not None:
        parts = [("rknn", t1 - t0), ("randomize", time.thread_time() - t1)]
        for name, took in parts + ([("embed", t0 - t)] if embedding is None else []):
            timings[name] = timings.get(name, 0.0) + took
    return msgs, report_ids


def seal_messages(spec: RoundSpec, msgs: MessageBatch, report_ids: np.ndarray,
                  timings: dict | None = None, credential=None, pool=None) -> pa.RecordBatch:
    """Seal (and sign, with a ``credential``) messages into one Arrow batch; encapsulations
    come from ``pool`` where it has them."""
    t2 = time.thread_time()
    if spec.hop_public_keys:
        sealed = seal_onion(spec.server_public_key, list(spec.hop_public_keys), msgs.payloads, spec.ctx,
                            spec.pad_to, report_ids=report_ids, pool=pool)
    else:
        sealed = seal_batch(spec.server_public_key, msgs.payloads, spec.ctx, spec.pad_to,
                            report_ids=report_ids, pool=pool)
    out = to_arrow(sealed, msgs.senders)
    if credential is not None:
        seqs, tags = credential.sign(spec.ctx, msgs.senders, sealed, keep=spec.more_rounds)
        out = with_credentials(out, seqs, tags)
    if timings is not None:
        timings["seal"] = timings.get("seal", 0.0) + time.thread_time() - t2
    return out

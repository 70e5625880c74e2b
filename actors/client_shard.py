"""ClientShard: one Ray actor hosting many virtual clients (the simulation backend).

The shard holds its clients' private records and never sends them anywhere. For
a round it embeds the records with the public encoder, connects them to their
k nearest queries, randomizes every client's answer with the round's mechanism
(vectorized over a batch of clients), seals each message for the server and
returns Arrow batches of ciphertext.

Retries never re-randomize: the randomness of batch ``b`` of round ``t`` is
derived from the shard's secret (a constructor argument, so a Ray-restarted actor
gets the same one) and ``(job, round, b)``, and finished reports are cached.
"""
from __future__ import annotations

import time

import numpy as np
import ray

from rknn_ray.answers import RecordAnswers
from rknn_ray.mechanisms.base import Mechanism, MessageBatch
from rknn_ray.rknn import build_answers
from rknn_ray.rng import derived_generator
from sealing.envelope import RoundContext, seal_batch, to_arrow
from sealing.onion import seal_onion


class ClientShardImpl:
    def __init__(self, shard_id: int, features: np.ndarray, labels: np.ndarray,
                 client_ids: np.ndarray, secret: bytes):
        order = np.argsort(client_ids, kind="stable")
        self.shard_id = shard_id
        self.features = features[order]
        self.labels = labels[order]
        self.client_ids = client_ids[order].astype(np.int64)
        self._secret = secret
        self._cache: dict[tuple, list] = {}
        self.timings: dict[str, float] = {}

    def num_clients(self) -> int:
        return int(np.unique(self.client_ids).size)

    def max_records_per_client(self) -> int:
        return int(np.bincount(np.unique(self.client_ids, return_inverse=True)[1]).max(initial=0))

    def answers(self, encoder, query_features: np.ndarray, k: int,
                num_classes: int) -> RecordAnswers:
        """Reverse k-NN answers of every record held here (private; stays in the shard)."""
        t0 = time.perf_counter()
        emb = encoder.transform(self.features)
        t1 = time.perf_counter()
        ans = build_answers(emb, self.labels, self.client_ids, query_features, k, num_classes)
        self.timings["embed"] = self.timings.get("embed", 0) + t1 - t0
        self.timings["rknn"] = self.timings.get("rknn", 0) + time.perf_counter() - t1
        return ans

    def make_reports(self, encoder, query_features: np.ndarray, k: int, num_classes: int,
                     mechanism: Mechanism, ctx: RoundContext, server_public_key: bytes,
                     batch_clients: int = 20000, pad_to: int | None = None,
                     hop_public_keys: list[bytes] | None = None, dropout: float = 0.0) -> list:
        """Sealed reports of all hosted clients: a list of Arrow record batches.

        ``hop_public_keys`` (onion mode) wraps each report once per shuffler hop.
        ``dropout`` simulates clients that never send (each independently, with
        that probability, drawn from the same derived randomness, so a retry drops
        the same clients).
        """
        key = (ctx.job_id, ctx.round_id)
        if key in self._cache:          # a retried call re-sends the same reports
            return self._cache[key]
        ans = self.answers(encoder, query_features, k, num_classes)
        ids, start, count = ans.clients()
        out = []
        for b, lo in enumerate(range(0, ids.size, batch_clients)):
            hi = min(lo + batch_clients, ids.size)
            rows = np.arange(start[lo], start[hi - 1] + count[hi - 1])
            rng = derived_generator(self._secret, ctx.job_id, ctx.round_id, b)
            t0 = time.perf_counter()
            msgs = mechanism.randomize(ans.select(rows), rng)
            if dropout > 0:
                gone = ids[lo:hi][rng.random(hi - lo) < dropout]
                keep = ~np.isin(msgs.senders, gone)
                msgs = MessageBatch(msgs.payloads[keep], msgs.senders[keep])
            t1 = time.perf_counter()
            if hop_public_keys:
                sealed = seal_onion(server_public_key, hop_public_keys, msgs.payloads, ctx, pad_to)
            else:
                sealed = seal_batch(server_public_key, msgs.payloads, ctx, pad_to=pad_to)
            t2 = time.perf_counter()
            out.append(to_arrow(sealed, msgs.senders))
            self.timings["randomize"] = self.timings.get("randomize", 0) + t1 - t0
            self.timings["seal"] = self.timings.get("seal", 0) + t2 - t1
        self._cache[key] = out
        return out

    def get_timings(self) -> dict:
        return dict(self.timings)


ClientShard = ray.remote(max_restarts=1, max_task_retries=1)(ClientShardImpl)

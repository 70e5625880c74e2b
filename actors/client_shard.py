"""ClientShard: one Ray actor hosting many virtual clients (the simulation backend).

The shard loads its own private records from a small source spec
(:mod:`rknn_ray.data.sources`) and never sends them anywhere. It also makes its own
secret (:mod:`rknn_ray.shard_secrets`): Ray is handed only where to keep it (a node-local,
owner-only key store and the job id), so the secret never crosses the driver, the GCS or
the object store; Ray keeps only those public names for restarts. For a round it streams
one sealed Arrow batch per ``batch_clients`` clients
(:func:`rknn_ray.client_step.client_step`) as a Ray streaming generator, so the driver
forwards batches while the shard is still sealing and memory is bounded by the
generator's backpressure window.

Retries never re-randomize: batch ``b`` of round ``t`` draws its randomness and its
report ids from the shard's secret and ``(job, t, b)``; a restarted shard reads the same
secret from its key store and re-sends byte-for-byte the same plaintexts and ids, which
the server counts once (a shard restarted where its secret is gone refuses to start).
Every message is signed with the shard's credential for its sender
(:mod:`sealing.credentials`), so the party that sees senders can authenticate them and
enforce the per-sender allowance.
"""
from __future__ import annotations

import os
import time
import warnings

import ray

from rknn_ray.client_step import RoundSpec, client_step


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
    def __init__(self, shard_id: int, source, secrets, fault: dict | None = None,
                 credential=None):
        """``secrets``: a :class:`rknn_ray.shard_secrets.ShardKeyStore` (or, seeded runs,
        :class:`~rknn_ray.shard_secrets.SeededShardSecrets`), never the secret itself."""
        self.shard_id = shard_id
        self.records = source.open()
        self._secrets = secrets
        self._secret = secrets.secret(shard_id, restarted=_restarted())
        self._credential = credential        # sealing.credentials.ShardCredential for its clients
        self._fault = fault or {}
        self.timings: dict[str, float] = {}

    def num_clients(self) -> int:
        return int(self.records.num_clients)

    def max_records_per_client(self) -> int:
        return int(self.records.max_records_per_client)

    def stream_reports(self, spec: RoundSpec, batch_clients: int):
        """Yield the round's sealed batches, one per ``batch_clients`` clients, in a fixed order."""
        self.timings = {}           # this round's stage CPU only (get_timings after the round)
        for b, (x, y, ids) in enumerate(self.records.batches(batch_clients)):
            if b == 0 and self._fault.get("flood"):
                flood = self._flood(spec, x[:1], y[:1], ids[:1], int(self._fault["flood"]))
            batch = client_step(spec, self._secret, b, x, y, ids, self.timings, self._credential)
            if self._fault.get("garbage_every"):
                batch = self._garbage(spec, batch, int(self._fault["garbage_every"]))
            yield batch
            self._maybe_crash(b + 1)
        if self._fault.get("flood"):
            yield flood

    def _flood(self, spec: RoundSpec, x, y, ids, count: int):
        """Fault injection for tests: a hostile client sends ``count`` validly signed reports.

        Its first client re-randomizes its record ``count`` times (fresh batch keys) and signs
        every report with its real credential and seq 0..count-1 -- the attack the per-sender
        allowance exists for.
        """
        import numpy as np
        from sealing.credentials import with_credentials
        from sealing.envelope import from_arrow, to_arrow
        reports = np.concatenate([from_arrow(client_step(spec, self._secret, 10**6 + j, x, y, ids))[0]
                                  for j in range(count)])
        senders = np.repeat(ids[:1], count)
        seqs, tags = self._credential.sign(spec.ctx, senders, reports)
        return with_credentials(to_arrow(reports, senders), seqs, tags)

    def _garbage(self, spec: RoundSpec, batch, every: int):
        """Fault injection for tests: clients whose id is a multiple of ``every`` send random
        bytes behind the round's clear header instead of their reports, validly signed.

        The shuffler admits them (authenticated, right length); the server cannot open them
        (``tampered``): senders that count as authenticated but give no cover.
        """
        import numpy as np
        from sealing.credentials import with_credentials
        from sealing.envelope import CONTEXT_LEN, from_arrow, to_arrow
        reports, senders = from_arrow(batch)
        bad = senders % every == 0
        reports = reports.copy()
        body = reports.shape[1] - CONTEXT_LEN
        reports[bad, CONTEXT_LEN:] = np.frombuffer(os.urandom(int(bad.sum()) * body),
                                                   np.uint8).reshape(-1, body)
        seqs, tags = self._credential.sign(spec.ctx, senders, reports)
        return with_credentials(to_arrow(reports, senders), seqs, tags)

    def _maybe_crash(self, sent: int) -> None:
        """Fault injection for tests: die once after ``exit_after_batches`` batches.

        The marker file makes the restarted incarnation run normally. With ``lose_secret``
        the shard deletes its stored secret first (a restart on another node).
        """
        after, marker = self._fault.get("exit_after_batches"), self._fault.get("marker")
        if after is not None and sent >= after and marker and not os.path.exists(marker):
            open(marker, "w").close()
            if self._fault.get("lose_secret"):
                self._secrets.forget(self.shard_id)
            time.sleep(2.0)     # let Ray deliver the batches already yielded: they get re-sent
            os._exit(1)

    def get_timings(self) -> dict:
        return dict(self.timings)

    def forget_secret(self) -> bool:
        """Delete this shard's stored secret (the job's rounds are over); True if one was."""
        return self._secrets.forget(self.shard_id)


ClientShard = ray.remote(max_restarts=2, max_task_retries=0)(ClientShardImpl)

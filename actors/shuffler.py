"""The Shuffler actor: a thin Ray wrapper around :class:`shuffler.pool.ShufflePool`.

Holds no key that can open a server-layer report: in onion mode it generates a key
for its *own* layer only (:mod:`shuffler.layers`).
"""
from __future__ import annotations

import pyarrow as pa
import ray

from sealing.envelope import RoundContext, from_arrow
from shuffler.pool import ShufflePool


class ShufflerImpl:
    """The Ray actor body: a :class:`ShufflePool`, plus one onion layer when asked.

    ``onion_layer`` (1-based hop index + 1) makes the actor generate its own layer
    key pair; :meth:`public_key` hands out only the public half, and every
    submitted batch is peeled (bad reports rejected and counted) before pooling.
    """

    def __init__(self, min_senders: int, max_batch_messages: int = 65536, *,
                 ctx: RoundContext | None = None, onion_layer: int | None = None,
                 forwarded_input: bool = False):
        self.pool = ShufflePool(min_senders, max_batch_messages, forwarded_input=forwarded_input)
        self._dist = None
        self._peeler = None
        if onion_layer is not None:
            if ctx is None:
                raise ValueError("onion mode needs the RoundContext (job id, round id) to check headers")
            from shuffler.layers import LayerKeyPair, LayerPeeler   # only onion hops load key code
            self._peeler = LayerPeeler(LayerKeyPair.generate(onion_layer), ctx)

    def public_key(self) -> bytes:
        """The public key of this hop's onion layer (clients wrap their reports with it)."""
        if self._peeler is None:
            raise ValueError("this shuffler has no onion layer (start it with onion_layer=hop+1)")
        return self._peeler.keypair.public_bytes()

    def start_round(self, round_id: int, min_senders: int | None = None,
                    distributed: bool = False) -> None:
        """Next round of the same job: its sender floor, and whether the shuffle is distributed.

        Distributed (large rounds, no onion layer): reports stay in Ray's object store and
        are sorted by random keys across the cluster (:mod:`shuffler.distributed`).
        Onion replay memory is kept across rounds.
        """
        floor = self.pool.min_senders if min_senders is None else int(min_senders)
        self.pool = ShufflePool(floor, self.pool.max_batch_messages,
                                forwarded_input=self.pool.forwarded_input)
        self._dist = None
        if distributed:
            if self._peeler is not None:
                raise ValueError("the distributed shuffle takes no onion layers; use "
                                 "shuffle.onion_layers: 0 or keep the round below "
                                 "shuffle.distributed_above")
            from shuffler.distributed import DistributedShuffle
            self._dist = DistributedShuffle(floor)
        if self._peeler is not None:
            self._peeler.start_round(round_id)

    def submit_refs(self, refs: list) -> int:
        """Batches by reference (a list, so Ray does not fetch them into this call)."""
        if self._dist is not None:
            return sum(self._dist.add_ref(r) for r in refs)
        return sum(self.submit(ray.get(r)) for r in refs)

    def submit(self, batch: pa.RecordBatch) -> int:
        """Accept one batch from a client shard (or upstream hop); returns reports pooled."""
        if self._peeler is None:
            return self.pool.add(batch)
        ciphertexts, senders = from_arrow(batch)
        inner, kept, _ = self._peeler.peel(ciphertexts)
        return self.pool.add_reports(inner, None if senders is None else senders[kept])

    def submit_all(self, batches: list) -> int:
        """Accept every batch of one client shard's reply (a list of record batches)."""
        return sum(self.submit(b) for b in batches)

    def release(self) -> list[pa.RecordBatch]:
        """All permuted batches (raises PrivacyBudgetError below the sender floor)."""
        return list(self.pool.release())

    def release_refs(self) -> list:
        if self._dist is not None:
            return self._dist.release()
        return self._release_local_refs()

    def _release_local_refs(self) -> list:
        """Like :meth:`release`, but each batch goes to the object store as it is made."""
        return [ray.put(b) for b in self.pool.release()]

    def stats(self) -> dict:
        if self._dist is not None:
            return self._dist.stats()
        out = self.pool.stats()
        if self._peeler is not None:
            out["onion_layer"] = self._peeler.keypair.layer
            out["rejected"] = dict(self._peeler.totals)
        return out


Shuffler = ray.remote(ShufflerImpl)

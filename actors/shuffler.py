"""The Shuffler actor: a thin Ray wrapper around :class:`shuffler.pool.ShufflePool`.

Holds no key that can open a server-layer report: in onion mode it generates a key
for its *own* layer only (:mod:`shuffler.layers`).
"""
from __future__ import annotations

import pyarrow as pa
import ray

from sealing.credentials import SenderAdmission
from sealing.envelope import RoundContext, from_arrow, to_arrow
from shuffler.distributed import DistributedShuffle
from shuffler.pool import ShufflePool


class ShufflerImpl:
    """The Ray actor body: a :class:`ShufflePool`, plus one onion layer when asked.

    ``onion_layer`` (1-based hop index + 1) makes the actor generate its own layer
    key pair; :meth:`public_key` hands out only the public half, and every
    submitted batch is peeled (bad reports rejected and counted) before pooling.

    ``start_round(distributed=True)`` (the driver decides from the round's expected size,
    ``shuffle.distributed_above``) keeps the round's batches as object refs (only sender
    ids in this process) and sorts them across the cluster (:mod:`shuffler.distributed`).

    ``release_refs(first)`` + ``more_refs(count)`` hand the permuted batches over a few at a
    time, each as soon as it is final, so the server opens while the rest is still
    being made and the object store holds a bounded window of them.
    """

    def __init__(self, min_senders: int, max_batch_messages: int = 65536, *,
                 ctx: RoundContext | None = None, onion_layer: int | None = None,
                 forwarded_input: bool = False):
        self.pool = ShufflePool(min_senders, max_batch_messages, forwarded_input=forwarded_input)
        self._dist = None
        self._local_out = None   # the in-process pool's permuted batches, not yet handed over
        self._peeler = None
        self._admission = None   # set per round by start_round(admission=...)
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
                    distributed: bool = False, admission: tuple | None = None) -> None:
        """Next round of the same job: its sender floor, and whether the shuffle is distributed.

        Distributed (large rounds, no onion layer): reports stay in Ray's object store and
        are sorted by random keys across the cluster (:mod:`shuffler.distributed`).
        Onion replay memory is kept across rounds.

        ``admission = (verifier, ctx, allowance, report_width)`` (first hop): every batch is admitted by
        sender credential and per-sender allowance before it is pooled
        (:class:`sealing.credentials.SenderAdmission`); the floor and the reported
        ``senders`` then count authenticated senders only.
        """
        self._admission = None
        if admission is not None:
            self._admission = SenderAdmission(*admission)
        floor = self.pool.min_senders if min_senders is None else int(min_senders)
        self.pool = ShufflePool(floor, self.pool.max_batch_messages,
                                forwarded_input=self.pool.forwarded_input)
        self._dist = self._local_out = None
        if distributed:
            if self._peeler is not None:
                raise ValueError("the distributed shuffle takes no onion layers; use "
                                 "shuffle.onion_layers: 0 or keep the round below "
                                 "shuffle.distributed_above")
            self._dist = DistributedShuffle(floor, max_batch_messages=self.pool.max_batch_messages)
        if self._peeler is not None:
            self._peeler.start_round(round_id)

    def submit_refs(self, refs: list) -> int:
        """Batches by reference (a list, so Ray does not fetch them into this call)."""
        target = self._dist
        if target is None:
            return sum(self.submit(ray.get(r)) for r in refs)
        if self._admission is None:
            return sum(target.add(r) for r in refs)
        total = 0
        for ref in refs:          # read zero-copy; a fully admitted batch keeps its ref
            batch = ray.get(ref)
            reports, senders, _ = self._admission.admit(batch)
            if len(senders) == batch.num_rows:
                total += target.add(ref)
            elif len(senders):
                total += target.add(to_arrow(reports, senders))
        return total

    def _admit(self, batch: pa.RecordBatch):
        """(reports, senders) of the admitted messages (all of them when no admission is set)."""
        if self._admission is None:
            return from_arrow(batch)
        reports, senders, _ = self._admission.admit(batch)
        return reports, senders

    def submit(self, batch: pa.RecordBatch) -> int:
        """Accept one batch from a client shard (or upstream hop); returns reports pooled."""
        target = self._dist
        if target is not None:
            if self._admission is None:
                return target.add(batch)
            reports, senders = self._admit(batch)
            return target.add(to_arrow(reports, senders)) if len(senders) else 0
        ciphertexts, senders = self._admit(batch)
        if self._peeler is None:
            if senders is not None and len(senders) == 0:
                return 0
            return self.pool.add_reports(ciphertexts, senders)
        if len(ciphertexts) == 0:
            return 0
        inner, kept, _ = self._peeler.peel(ciphertexts)
        return self.pool.add_reports(inner, None if senders is None else senders[kept])

    def release(self) -> list[pa.RecordBatch]:
        """All permuted batches (raises PrivacyBudgetError below the sender floor)."""
        if self._dist is not None:
            return ray.get(self._dist.release())
        return list(self.pool.release())

    def release_refs(self, first: int | None = None) -> list:
        """Refs of the permuted batches: all, or the first ``first`` (:meth:`more_refs` gives
        the rest). Checks the sender floor first (PrivacyBudgetError: nothing released)."""
        if self._dist is not None:
            return self._dist.release(first)
        if self._local_out is None:
            self._local_out = self.pool.release()    # checks the floor now
        return self.more_refs(first)

    def more_refs(self, count: int | None = None) -> list:
        """The next ``count`` permuted batches (all that are left when None), each put into
        the object store as it is made; ``[]`` when the round has been handed over."""
        if self._dist is not None:
            return self._dist.more(count) if self._dist.released else []
        if self._local_out is None:
            return []
        out = []
        for batch in self._local_out:
            out.append(ray.put(batch))
            if count is not None and len(out) >= count:
                break
        return out

    def stats(self) -> dict:
        """Messages, distinct (authenticated) senders, bytes; and what admission rejected."""
        if self._dist is not None:
            out = self._dist.stats()
        else:
            out = self.pool.stats()
            if self._peeler is not None:
                out["onion_layer"] = self._peeler.keypair.layer
                out["rejected"] = dict(self._peeler.totals)
        if self._admission is not None:
            adm = self._admission.stats()
            out["admission"] = adm
            out["rejected"] = {**out.get("rejected", {}), **adm["rejected"]}
        return out


Shuffler = ray.remote(ShufflerImpl)


def remote_class(impl: type = ShufflerImpl):
    """The Ray actor class that runs ``impl`` (ShufflerImpl or a test's subclass)."""
    return Shuffler if impl is ShufflerImpl else ray.remote(impl)

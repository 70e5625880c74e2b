"""The shuffler: collects sealed reports, forgets who sent them, and permutes them.

:class:`ShufflePool` is the whole behaviour as plain Python (testable without a
cluster); :data:`Shuffler` is the same thing as a Ray actor. A plain shuffler
holds no key at all and never imports anything that can open a report; in
onion mode it generates a key for its *own* layer (see :mod:`shuffler.layers`,
imported only then), which cannot open the server's layer.

Privacy rules enforced here:
* sender ids are used only to count distinct senders; forwarded batches carry
  only the ``report`` column;
* nothing is released unless at least ``min_senders`` distinct senders took part
  (the caller derives it from the privacy target: amplification depends on n);
* the permutation comes from the OS CSPRNG (``os.urandom``), never a seeded RNG,
  so the output order is independent of arrival order;
* output leaves in batches of at most ``max_batch_messages`` reports, gathered
  one batch at a time from the stored input (peak memory: input + one batch).
"""
from __future__ import annotations

import os
from typing import Iterator

import numpy as np
import pyarrow as pa

from rknn_ray.errors import PrivacyBudgetError
from sealing.envelope import RoundContext, from_arrow, to_arrow


def round_width(expected: int | None, width: int) -> int:
    """Every report of a round has one length (sealed with one pad_to); the first sets it."""
    if expected is not None and width != expected:
        raise ValueError(f"report length {width} differs from this round's {expected}: every "
                         "report of a round is padded to one length (seal with the same pad_to)")
    return width


def secure_permutation(n: int) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` keyed by ``os.urandom``.

    Sorts by i.i.d. 64-bit random keys from the OS CSPRNG; with distinct keys the
    ranks are an exactly uniform permutation, and ties (chance ~n^2/2^65) are
    redrawn rather than broken by arrival order.
    """
    while True:
        keys = np.frombuffer(os.urandom(8 * n), np.uint64)
        order = np.argsort(keys, kind="stable")
        if n < 2 or np.all(np.diff(keys[order]) != 0):
            return order


class ShufflePool:
    """Reports of one round, held without sender ids until released in random order.

    ``forwarded_input=True`` is for a downstream hop in an onion chain: its input
    comes from another shuffler, has no sender ids, and ``min_senders`` is then
    checked against the number of messages (a necessary, weaker condition: every
    sender sent at least one message; the first hop checks distinct senders).
    """

    def __init__(self, min_senders: int, max_batch_messages: int = 65536, *,
                 forwarded_input: bool = False):
        if int(min_senders) < 0:
            raise ValueError(f"min_senders must be >= 0, got {min_senders}")
        if int(max_batch_messages) < 1:
            raise ValueError(f"max_batch_messages must be >= 1, got {max_batch_messages}")
        self.min_senders, self.max_batch_messages = int(min_senders), int(max_batch_messages)
        self.forwarded_input = forwarded_input
        self._reset()

    def _reset(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._sender_ids: list[np.ndarray] = []   # only ever counted, never forwarded
        self._num_senders: int | None = 0
        self._width: int | None = None
        self._messages = self._bytes = self._batches = self._released_batches = 0
        self._released = False

    # ------------------------------------------------------------------ input
    def add(self, batch: pa.RecordBatch) -> int:
        """Take one Arrow batch (``sender`` int64, ``report`` fixed_size_binary); returns its size."""
        ciphertexts, senders = from_arrow(batch)
        return self.add_reports(ciphertexts, senders)

    def add_reports(self, ciphertexts: np.ndarray, senders: np.ndarray | None) -> int:
        """Take reports as arrays (the onion path, after peeling); returns how many."""
        if self._released:
            self._reset()   # first batch of the next round
        if senders is None and not self.forwarded_input:
            raise ValueError("this batch has no 'sender' column: client shards must send sender ids "
                             "so the shuffler can count distinct senders (they are dropped before "
                             "anything is forwarded); use forwarded_input=True only for a hop fed "
                             "by another shuffler")
        m, width = ciphertexts.shape
        if m == 0:
            return 0
        self._width = round_width(self._width, width)
        self._chunks.append(np.array(ciphertexts, np.uint8, copy=True))   # own it; free Ray's buffer
        if not self.forwarded_input:
            self._sender_ids.append(np.array(senders, np.int64, copy=True))
            self._num_senders = None
        self._messages += m
        self._bytes += m * width
        self._batches += 1
        return m

    @property
    def num_messages(self) -> int:
        return self._messages

    @property
    def num_senders(self) -> int:
        """Distinct senders so far (for forwarded input: messages, see class docstring)."""
        if self.forwarded_input:
            return self._messages
        if self._num_senders is None:
            ids = np.unique(np.concatenate(self._sender_ids))
            self._sender_ids = [ids]
            self._num_senders = int(ids.size)
        return self._num_senders

    # ------------------------------------------------------------------ output
    def release(self) -> Iterator[pa.RecordBatch]:
        """Check the sender floor now, then yield the permuted reports batch by batch.

        Raises :class:`PrivacyBudgetError` (and releases nothing) if fewer than
        ``min_senders`` distinct senders took part. The pool is emptied afterwards.
        """
        if self._released:       # already sent; a second call must not resend anything
            return iter(())
        n_senders = self.num_senders
        if n_senders < self.min_senders:
            what = "messages from the upstream shuffler" if self.forwarded_input else "distinct senders"
            raise PrivacyBudgetError(
                f"shuffler refused to release: {n_senders} {what}, fewer than the {self.min_senders} "
                "the privacy target needs (amplification depends on n); nothing was released. Fix: "
                "wait for more clients to report, or lower the target (larger eps / delta) so that "
                "fewer senders suffice")
        self._sender_ids = []    # the ids have done their only job
        return self._emit(secure_permutation(self._messages))

    def _emit(self, perm: np.ndarray) -> Iterator[pa.RecordBatch]:
        chunks, width = self._chunks, self._width
        offsets = np.cumsum([0] + [len(c) for c in chunks])
        for start in range(0, perm.size, self.max_batch_messages):
            idx = perm[start:start + self.max_batch_messages]
            out = np.empty((idx.size, width), np.uint8)
            owner = np.searchsorted(offsets, idx, side="right") - 1
            order = np.argsort(owner, kind="stable")          # group rows by source chunk
            cuts = np.flatnonzero(np.diff(owner[order])) + 1
            for rows in np.split(order, cuts):
                c = owner[rows[0]]
                out[rows] = chunks[c][idx[rows] - offsets[c]]
            self._released_batches += 1
            yield to_arrow(out)
        self._chunks = []
        self._released = True

    def stats(self) -> dict:
        """What this round's shuffler saw, for the run report (no ids, no order)."""
        return {"messages": self._messages,
                "senders": self.num_senders if not self.forwarded_input else None,
                "bytes": self._bytes, "batches": self._batches,
                "released_batches": self._released_batches, "min_senders": self.min_senders}

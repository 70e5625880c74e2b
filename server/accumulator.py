"""The server step of a round: open a batch, check it, and add it to the round's statistic.

Every estimator here is a function of a *sum* over reports (mechanism.statistic is
additive), so batches can be opened by several processes, in any order and any
batching, and added up: ``finalize`` after the last batch gives exactly what one
``estimate`` over all reports would. Duplicates are judged here, in one place, by
report id across the whole job (a retried client re-sends the same ids), so a
report counts at most once however many openers or retries there were.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from rknn_ray.mechanisms.base import Mechanism
from sealing.envelope import ID_LEN
from sealing.replay import ReplayGuard
from sealing.unseal import empty_rejects
from server.opening import ReportOpener


@dataclass
class OpenedBatch:
    """One batch after opening and format checks: the well-formed reports and what was dropped."""
    payloads: np.ndarray            # (m, message_size) uint8, well-formed
    report_ids: np.ndarray          # (m,) 'S16'
    statistic: np.ndarray | None    # mechanism.statistic(payloads), when an opener computed it
    rejects: Counter = field(default_factory=empty_rejects)
    received: int = 0               # rows in the batch as it arrived


def open_and_check(opener: ReportOpener, mechanism: Mechanism, ciphertexts: np.ndarray,
                   with_statistic: bool = True) -> OpenedBatch:
    """Open one batch, drop (and count) malformed messages, precompute the batch's statistic.

    Runs in an opener process; only the accumulator decides about duplicates.
    """
    received = int(ciphertexts.shape[0]) if getattr(ciphertexts, "ndim", 0) == 2 else 1
    opened = opener.open_batch(ciphertexts)
    rejects = Counter(opened.rejects)
    payloads, ids = opened.payloads, opened.report_ids
    if len(payloads):
        ok = mechanism.well_formed(payloads)
        rejects["malformed"] += int((~ok).sum())
        if not ok.all():
            payloads, ids = payloads[ok], ids[ok]
    stat = mechanism.statistic(payloads) if with_statistic and len(payloads) else None
    return OpenedBatch(payloads, ids, stat, rejects, received)


@dataclass
class Release:
    """What finalize hands back: the released counts and the round's bookkeeping."""
    counts: np.ndarray          # (s, |Y|) float64, noise included where the model adds it
    accepted: int               # reports counted
    received: int               # reports that arrived (accepted + rejected)
    rejected: dict              # by kind (REJECT_KINDS)


class RoundAccumulator:
    """Adds opened batches into one additive statistic; ``finalize`` releases the estimate.

    ``guard`` is the job-wide memory of report ids (pass the same one to every
    round's accumulator): a report id seen before, in this round or an earlier
    one, is counted as ``replayed`` and dropped.
    """

    def __init__(self, mechanism: Mechanism, guard: ReplayGuard | None = None):
        self.mechanism = mechanism
        self.guard = guard if guard is not None else ReplayGuard(ID_LEN)
        self.stat: np.ndarray | None = None     # typed by the first batch's statistic
        self.accepted = 0
        self.received = 0
        self.rejected = empty_rejects()
        self._finalized = False

    def accumulate(self, batch: OpenedBatch) -> int:
        """Add one opened batch; returns how many of its reports were counted."""
        if self._finalized:
            raise RuntimeError("this round was already finalized; start a new RoundAccumulator")
        self.received += batch.received
        self.rejected.update(batch.rejects)
        fresh = self.guard.fresh(batch.report_ids)
        dup = int((~fresh).sum())
        self.rejected["replayed"] += dup
        n = int(fresh.sum())
        if n == 0:
            return 0
        part = batch.statistic if dup == 0 and batch.statistic is not None \
            else self.mechanism.statistic(batch.payloads[fresh])
        self.stat = part.copy() if self.stat is None else self.stat + part
        self.accepted += n
        return n

    def finalize(self, rng: np.random.Generator | None = None) -> Release:
        """The released counts (central noise drawn here, once: rng None = OS CSPRNG)."""
        if self._finalized:
            raise RuntimeError("finalize() releases once per round; a second release would "
                               "draw fresh noise and double the privacy cost")
        self._finalized = True
        stat = self.stat if self.stat is not None else \
            self.mechanism.statistic(np.zeros((0, self.mechanism.message_size), np.uint8))
        counts = self.mechanism.finalize(stat, self.accepted, rng)
        return Release(counts, self.accepted, self.received, dict(self.rejected))

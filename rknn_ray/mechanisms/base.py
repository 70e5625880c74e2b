"""One mechanism interface for the central, local and shuffle trust models.

    mech = calibrate(params)                      # see rknn_ray.mechanisms.build
    batch = mech.randomize(answers, rng)          # client side, vectorized over clients
    stat = mech.statistic(payloads)               # server side: additive over reports
    counts = mech.finalize(stat, m, rng)          # debias with the m reports accepted (+ central noise)
    mech.estimate(payloads, n, rng)               # = finalize(statistic(payloads), len(payloads), rng)
    mech.event(n) -> DpEvent                      # what the release is, for the accountants
    mech.costing() -> Costing                     # the accountant's choices for its events
    guarantee_of(mech, n) -> Guarantee            # rknn_ray.accounting.guarantee: the cost of
                                                  # event(n) under costing(), unit, neighbours
    mech.error_bound(beta, n) -> eta              # (eta, beta)-accuracy per bucket (sup norm)

``statistic`` is additive (``statistic(a ++ b) == statistic(a) + statistic(b)``), so
the server can open and decode batches in several processes, in any order, and add
the parts (server.accumulator). ``event`` is a pure function of the mechanism's public
parameters and ``n``, the number of distinct senders actually shuffled (ignored by the
central and local models; None = the calibrated n). A mechanism never states an
(eps, delta): the accountant costs its event (rknn_ray.accounting).

Messages are fixed-length byte rows (``message_size`` bytes each) so that the
sealing layer can pad every ciphertext of a round to one length. A client may send
several messages (multi-message shuffle); ``MessageBatch.senders`` says whose each
row is, and the shuffler drops it before anything reaches the server.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from rknn_ray.accounting.units import MODELS
from rknn_ray.errors import ConfigError
from rknn_ray.labeling.answers import RecordAnswers
#: privacy.honest_fraction when the config leaves it null, per shuffle mechanism (see
#: docs/threat-model.md "Corrupt clients"): the distributed-noise protocol needs an honest
#: share of clients to send noise; single-message amplification keeps eps0-LDP per record
#: whatever the others do, so it assumes by default that every opened report is honest.
DEFAULT_HONEST_FRACTION = {"multi": 0.5, "rr": 1.0, "collision": 1.0}


def honest_count(fraction: float, n: int) -> int:
    """ceil(fraction * n): the clients assumed to follow the protocol among ``n``.

    The 1e-9 slack keeps 0.9 * 1000 at 900 (its float product is 900.0000000000001).
    """
    return max(0, int(math.ceil(float(fraction) * int(n) - 1e-9)))


def honest_fraction_of(params: "MechanismParams", mechanism: str) -> float:
    """The assumed honest fraction: ``options['honest_fraction']``, else the mechanism default."""
    value = params.options.get("honest_fraction")
    gamma = DEFAULT_HONEST_FRACTION.get(mechanism, 1.0) if value is None else float(value)
    if not 0 < gamma <= 1:
        raise ConfigError("privacy.honest_fraction", f"must be in (0, 1], got {value}",
                          "set the share of clients assumed to follow the protocol, e.g. 0.5")
    return gamma
@dataclass(frozen=True)
class MechanismParams:
    """Everything a mechanism is calibrated from (public parameters only)."""
    num_queries: int            # s
    num_classes: int            # |Y|
    k: int                      # neighbours per record
    eps: float                  # target eps (central eps; local eps for the local model)
    r: int = 1                  # labels per record (r-hot)
    delta: float = 0.0
    num_clients: int = 1        # n (expected senders)
    max_records_per_client: int = 1
    options: dict = field(default_factory=dict)
    #: single-message shuffle: the local eps0 a rounds plan chose (calibrated for the rounds'
    #: composition, rknn_ray.mechanisms.composed_rounds); None: calibrated for ``eps``
    local_eps0: float | None = None

    @property
    def num_cells(self) -> int:
        return self.num_queries * self.num_classes

    @property
    def sensitivity_l1(self) -> int:
        """Replace-one L1 sensitivity of the BSVS sum: one record adds k*r ones. It holds for
        every ``rknn.connection`` rule: each picks a record's k queries from that record and
        public data only (rknn_ray.labeling.connection), so no other record's ones move."""
        return 2 * self.k * self.r


@dataclass
class MessageBatch:
    """Messages of many virtual clients: ``payloads[i]`` was sent by ``senders[i]``."""
    payloads: np.ndarray  # (M, message_size) uint8
    senders: np.ndarray   # (M,) int64

    def __post_init__(self):
        if self.payloads.dtype != np.uint8 or self.payloads.ndim != 2:
            raise ValueError("payloads must be an (M, message_size) uint8 array")
        if self.senders.shape != (self.payloads.shape[0],):
            raise ValueError("one sender id per message")

    def __len__(self) -> int:
        return int(self.payloads.shape[0])


class Mechanism(ABC):
    """A privacy mechanism for the BSVS problem (see module docstring)."""

    name: str = "abstract"
    model: str = "central"
    unit: str = "record"

    def __init__(self, params: MechanismParams):
        self.params = params

    @property
    @abstractmethod
    def message_size(self) -> int:
        """Bytes per message (fixed for a round)."""

    @abstractmethod
    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        """Client side: the messages of every virtual client in ``answers``."""

    @property
    def statistic_size(self) -> int:
        """Length of :meth:`statistic` (d = s |Y| unless a mechanism needs more)."""
        return self.params.num_cells

    @abstractmethod
    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Additive sufficient statistic of well-formed messages: a 1-D array of statistic_size.

        int64 wherever the reports are integers, so that sums of batches in any order
        are bit-identical to the one-shot statistic; float64 only for float reports.
        """

    @abstractmethod
    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        """The (s, |Y|) float64 estimate from the summed statistic of ``num_reports`` messages.

        Central mechanisms draw their noise here (rng None: ChaCha20 keyed by the OS CSPRNG).
        """

    def estimate(self, payloads: np.ndarray, num_clients: int | None = None,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        """Server side in one call: ``finalize(statistic(payloads), len(payloads), rng)``.

        ``num_clients`` is kept for callers; estimators debias with the reports given.
        """
        payloads = np.asarray(payloads)
        return self.finalize(self.statistic(payloads), int(payloads.shape[0]), rng)

    @abstractmethod
    def event(self, n: int | None = None):
        """The release as a dp_accounting-style event (rknn_ray.accounting.events)."""

    def costing(self):
        """The accountant's choices for this mechanism's events (defaults: pure DP events)."""
        # defers dp_accounting and scipy: processes that only unpickle a mechanism never cost it
        from rknn_ray.accounting.accountants import DEFAULT_COSTING
        return DEFAULT_COSTING

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        """What the guarantee of ``event`` shows beside its cost (rknn_ray.accounting.guarantee):
        ``note`` (how the mechanism protects), ``n`` (senders it rests on), ``unit``; ``n``
        and ``opened``: the round's senders and the reports the server opened, when known."""
        return {"note": "", "n": None, "unit": self.unit}

    @abstractmethod
    def error_bound(self, beta: float, num_clients: int) -> float:
        """eta such that the estimate is (eta, beta)-accurate at each bucket."""

    def round_event(self, senders: int, opened: int):
        """The event of a round whose reports the server has opened, never refused.

        ``senders``: distinct authenticated senders the shuffler admitted (an upper bound
        on the cover); ``opened``: reports the server opened and counted. The caller
        compares its cost with the target: past this point the server has seen the reports,
        so a round that misses it is recorded at this cost and refused for labelling.
        Default: the event for ``senders`` (models whose release does not depend on which
        reports opened).
        """
        return self.event(senders)

    def messages_per_sender(self) -> int:
        """The most messages one client may send in a round (the admitting party enforces it).

        One report per client for the central, local and single-message shuffle models;
        the multi-message mechanism allows its true messages plus a noise cap.
        """
        return 1

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        """Boolean mask of messages that decode to a valid report.

        The server drops (and counts as 'malformed') the rest before ``estimate``;
        mechanisms override this with their format's checks.
        """
        return np.ones(payloads.shape[0], dtype=bool)

    def describe(self) -> dict:
        """Facts for report.json: name, model, message size, parameters (the amplification
        bound only where a mechanism reads it: the single-message shuffle says it itself)."""
        return {"mechanism": self.name, "model": self.model,
                "message_bytes": self.message_size,
                **{k: v for k, v in self.params.options.items() if k != "bound"}}

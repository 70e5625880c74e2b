"""One mechanism interface for the central, local and shuffle trust models.

    mech = calibrate(params)                      # see rknn_ray.mechanisms.build
    batch = mech.randomize(answers, rng)          # client side, vectorized over clients
    stat = mech.statistic(payloads)               # server side: additive over reports
    counts = mech.finalize(stat, m, rng)          # debias with the m reports accepted (+ central noise)
    mech.estimate(payloads, n, rng)               # = finalize(statistic(payloads), len(payloads), rng)
    mech.event(n) -> DpEvent                      # what the release is, for the accountants
    mech.guarantee(n) -> Guarantee                # the accountant's cost of event(n): eps, delta,
                                                  # model, unit, neighbour relation, its Costing
    mech.error_bound(beta, n) -> eta              # (eta, beta)-accuracy per bucket (sup norm)

``statistic`` is additive (``statistic(a ++ b) == statistic(a) + statistic(b)``), so
the server can open and decode batches in several processes, in any order, and add
the parts (server.accumulator). ``guarantee`` and ``event`` are pure functions of the
mechanism's public parameters and ``n``, the number of distinct senders actually
shuffled (ignored by the central and local models; None = the calibrated n).

Messages are fixed-length byte rows (``message_size`` bytes each) so that the
sealing layer can pad every ciphertext of a round to one length. A client may send
several messages (multi-message shuffle); ``MessageBatch.senders`` says whose each
row is, and the shuffler drops it before anything reaches the server.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers

MODELS = ("central", "local", "shuffle")
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
    from rknn_ray.errors import ConfigError
    value = params.options.get("honest_fraction")
    gamma = DEFAULT_HONEST_FRACTION.get(mechanism, 1.0) if value is None else float(value)
    if not 0 < gamma <= 1:
        raise ConfigError("privacy.honest_fraction", f"must be in (0, 1], got {value}",
                          "set the share of clients assumed to follow the protocol, e.g. 0.5")
    return gamma
UNITS = ("record", "client", "label")
NEIGHBOUR_REPLACE_ONE = "replace-one"


@dataclass(frozen=True)
class Guarantee:
    """What a release promises: (eps, delta)-DP for ``unit`` under ``neighbour``.

    ``model`` is the trust model (who must be trusted for the guarantee to hold);
    ``n`` is the number of distinct senders the guarantee was computed from where
    it depends on it (shuffle amplification), else None. A mechanism never computes
    (eps, delta) itself: :meth:`Mechanism.guarantee_of` states them as the accountant's
    cost of its event, and ``accounting`` records the accountant's choices for it
    (rknn_ray.accounting.accountants.Costing: the amplification bound, the delta at
    which a non-pure event is stated, rdp/pld).
    """
    eps: float
    delta: float
    model: str
    mechanism: str
    unit: str = "record"
    neighbour: str = NEIGHBOUR_REPLACE_ONE
    n: int | None = None
    note: str = ""
    accounting: object = None

    def __post_init__(self):
        if isinstance(self.accounting, dict):         # read back from report.json / release.npz
            from rknn_ray.accounting.accountants import Costing
            object.__setattr__(self, "accounting", Costing.from_dict(self.accounting))
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.unit not in UNITS:
            raise ValueError(f"unit must be one of {UNITS}, got {self.unit!r}")

    def to_dict(self) -> dict:
        return asdict(self)


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
    def guarantee(self, n: int | None = None) -> Guarantee:
        """The (eps, delta) guarantee, its unit and neighbour relation (see module docstring)."""

    @abstractmethod
    def event(self, n: int | None = None):
        """The release as a dp_accounting-style event (rknn_ray.accounting.events)."""

    def costing(self):
        """The accountant's choices for this mechanism's events (defaults: pure DP events)."""
        from rknn_ray.accounting.accountants import DEFAULT_COSTING
        return DEFAULT_COSTING

    def guarantee_of(self, event, n: int | None = None, note: str = "",
                     unit: str = "record") -> Guarantee:
        """The guarantee of ``event``: (eps, delta) are the accountant's cost of it, never
        computed beside it (rknn_ray.accounting.accountants.event_cost)."""
        from rknn_ray.accounting.accountants import event_cost
        costing = self.costing()
        eps, delta = event_cost(event, costing)
        return Guarantee(eps, delta, self.model, self.name, unit=unit, n=n, note=note,
                         accounting=costing)

    @abstractmethod
    def error_bound(self, beta: float, num_clients: int) -> float:
        """eta such that the estimate is (eta, beta)-accurate at each bucket."""

    def round_cost(self, senders: int, opened: int) -> tuple[Guarantee, object]:
        """(guarantee, event) of a round whose reports the server has opened, never refused.

        ``senders``: distinct authenticated senders the shuffler admitted (an upper bound
        on the cover); ``opened``: reports the server opened and counted. The caller
        compares the eps with the target: past this point the server has seen the reports,
        so a round that misses it is recorded at this cost and refused for labelling.
        Default: the guarantee for ``senders`` (models whose guarantee does not depend on
        which reports opened).
        """
        return self.guarantee(senders), self.event(senders)

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
        """Facts for report.json: name, model, message size, parameters."""
        return {"mechanism": self.name, "model": self.model,
                "message_bytes": self.message_size, **self.params.options}

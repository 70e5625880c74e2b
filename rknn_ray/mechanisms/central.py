"""Central model: clients send exact answers (sealed); the trusted server adds noise.

Guarantee: (eps, 0)-DP at the *record* level under replace-one neighbours. One
record adds one to ``k * r`` cells; replacing it changes the BSVS sum by at most
``2kr`` in L1 (under any ``rknn.connection`` rule: a record's k queries depend on it and public
data only, :mod:`rknn_ray.labeling.connection`), so noise of scale ``2kr / eps`` on every cell
suffices. The scale is an
exact rational rounded up (:func:`rknn_ray.mechanisms.exact.noisier_scale`), never the
float 2kr/eps, which rounds down for about half of all (eps, k) and would imply an eps
above the target by ~1e-16.

Noise (``options['noise']``):
* ``discrete`` (default): exact discrete Laplace (:func:`rknn_ray.mechanisms.exact.discrete_laplace`,
  vectorized integer draws) from a ChaCha20 stream keyed by 256 fresh bits of the OS
  CSPRNG per release, unless the run asked for a seeded generator. The sampler's decay
  rate is ``1/scale`` itself when it lies on the samplers' 2^-40 grid (eps/(2kr) = 1/2, 1/4,
  ...), else that rate rounded down to the grid: more noise by < 2^-40 / rate relative,
  so the stated scale and event never claim less noise than is drawn.
* ``continuous``: the paper's Laplace(2kr/eps) in floating point (Mironov 2012:
  floating-point Laplace can leak; offered to reproduce the paper, not default).

Message format (one per client, fixed length per round): uint32 little-endian
``nnz`` followed by ``slots`` pairs ``(cell, count)``; unused slots are zero.
``slots = min(d, max_records_per_client * k * r)`` is public.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import Mechanism, MechanismParams, MessageBatch
from rknn_ray.mechanisms.exact import discrete_laplace, noisier_scale
from rknn_ray.mechanisms.noise import continuous_laplace
from rknn_ray.rng import secure_generator

NOISE_KINDS = ("discrete", "continuous")


def encode_sparse_counts(answers: RecordAnswers, slots: int) -> MessageBatch:
    """Per-client sparse count vectors as fixed-length uint32 rows (vectorized)."""
    d = answers.num_cells
    ids, _, _ = answers.clients()
    client_index = np.searchsorted(ids, answers.client_ids)
    cells = answers.flat_cells()
    keys = (client_index[:, None] * d + cells).ravel()
    uniq, counts = np.unique(keys, return_counts=True)
    owner, cell = np.divmod(uniq, d)
    nnz = np.bincount(owner, minlength=ids.size)
    if nnz.max(initial=0) > slots:
        raise ValueError(f"a client has {nnz.max()} non-zero cells but the round allows {slots}; "
                         "raise max_records_per_client to the largest client's record count")
    first = np.concatenate([[0], np.cumsum(nnz)[:-1]])
    pos = np.arange(uniq.size) - first[owner]
    rows = np.zeros((ids.size, 1 + 2 * slots), dtype="<u4")
    rows[:, 0] = nnz
    rows[owner, 1 + 2 * pos] = cell
    rows[owner, 2 + 2 * pos] = counts
    return MessageBatch(rows.view(np.uint8).reshape(ids.size, -1), ids.astype(np.int64))


def decode_sparse_counts(payloads: np.ndarray, slots: int, d: int) -> np.ndarray:
    """Sum of the decoded sparse count vectors: a flat length-``d`` int64 vector."""
    rows = np.ascontiguousarray(payloads).view("<u4").reshape(payloads.shape[0], 1 + 2 * slots)
    nnz = rows[:, 0].astype(np.int64)
    used = np.arange(slots)[None, :] < nnz[:, None]
    cells = rows[:, 1::2][used].astype(np.int64)
    counts = rows[:, 2::2][used].astype(np.int64)
    return np.bincount(cells, weights=counts, minlength=d).astype(np.int64)


class CentralLaplace(Mechanism):
    """Identity client step; discrete (default) or continuous Laplace at the server."""

    name = "laplace"
    model = "central"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        if not params.eps > 0:
            raise ValueError(f"eps must be > 0, got {params.eps}")
        self.noise = params.options.get("noise", "discrete")
        if self.noise not in NOISE_KINDS:
            raise ValueError(f"privacy.noise must be one of {NOISE_KINDS}, got {self.noise!r}")
        self.slots = min(params.num_cells,
                         params.max_records_per_client * params.k * params.r)

    @property
    def scale(self) -> Fraction:
        """Noise scale >= 2kr / eps, exactly: 1 / (eps/(2kr) rounded down to a float).
        A float 2kr/eps may round down and imply an eps above the target."""
        return noisier_scale(self.params.sensitivity_l1, self.params.eps)

    @property
    def message_size(self) -> int:
        return 4 * (1 + 2 * self.slots)

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        return encode_sparse_counts(answers, self.slots)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        if payloads.ndim != 2 or payloads.shape[1] != self.message_size:
            return np.zeros(payloads.shape[0] if payloads.ndim else 0, dtype=bool)
        rows = np.ascontiguousarray(payloads).view("<u4").reshape(payloads.shape[0], -1)
        nnz = rows[:, 0].astype(np.int64)
        ok = nnz <= self.slots
        used = np.arange(self.slots)[None, :] < np.minimum(nnz, self.slots)[:, None]
        cells, counts = rows[:, 1::2].astype(np.int64), rows[:, 2::2].astype(np.int64)
        p = self.params
        ok &= ~np.any(used & (cells >= p.num_cells), axis=1)
        ok &= ~np.any(used & ((counts < 1) | (counts > p.max_records_per_client)), axis=1)
        ok &= np.where(used, counts, 0).sum(axis=1) <= p.max_records_per_client * p.k * p.r
        return ok

    def exact_sum(self, payloads: np.ndarray) -> np.ndarray:
        """The noiseless aggregate (s, |Y|) of well-formed messages."""
        flat = decode_sparse_counts(payloads, self.slots, self.params.num_cells)
        return flat.reshape(self.params.num_queries, self.params.num_classes)

    def add_noise(self, counts: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
        """Counts plus noise of scale 2kr/eps (rng None: ChaCha20 keyed by the OS CSPRNG)."""
        if rng is None:
            rng = secure_generator()
        if self.noise == "discrete":
            return counts + discrete_laplace(rng, self.scale, counts.shape)
        return counts + continuous_laplace(float(self.scale), counts.shape, rng)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        return decode_sparse_counts(payloads, self.slots, self.params.num_cells)

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        counts = np.asarray(stat, np.int64).reshape(self.params.num_queries, self.params.num_classes)
        return self.add_noise(counts, rng).astype(np.float64)

    def event(self, n: int | None = None):
        from dp_accounting import dp_event  # defers dp_accounting
        if self.noise == "discrete":      # P[x] ~ exp(-a|x|), a = 1/scale; L1 sensitivity 2kr
            return dp_event.DiscreteLaplaceDpEvent(noise_parameter=float(1 / self.scale),
                                                  sensitivity=int(self.params.sensitivity_l1))
        return dp_event.LaplaceDpEvent(
            noise_multiplier=float(self.scale / self.params.sensitivity_l1))

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        how = ("exact discrete" if self.noise == "discrete" else
               "approximate, float sampling: the eps of ideal real-valued Laplace, not of "
               "float64 arithmetic (Mironov 2012);")
        return {**super().guarantee_facts(event, n),
                "note": f"{how} Laplace noise of scale 2kr/eps = {float(self.scale):.4g} on "
                        "every cell; trusted server"}

    def error_bound(self, beta: float, num_clients: int = 0) -> float:
        """eta with P[max_c |noise_c| >= eta] <= beta within one bucket of |Y| cells.

        Continuous: Proposition 1 of paper 000, 2kr log(|Y|/beta) / eps.
        Discrete: exact tail P[|X| >= t] = 2 q^t / (1 + q), union over |Y| cells.
        """
        if not 0 < beta < 1:
            raise ValueError(f"beta must be in (0, 1), got {beta}")
        return central_error_bound(float(self.scale), self.params.num_classes, beta, self.noise)

    def describe(self) -> dict:
        return {**super().describe(), "noise": self.noise, "scale": float(self.scale)}


def central_error_bound(scale: float, num_classes: int, beta: float,
                        noise: str = "continuous") -> float:
    """(eta, beta)-accuracy of per-cell Laplace noise of ``scale`` over |Y| cells."""
    if noise == "continuous":
        return scale * math.log(num_classes / beta)
    q = math.exp(-1.0 / scale)
    return float(math.ceil(scale * math.log(2 * num_classes / (beta * (1 + q)))))


@register("central", "laplace")
def _build(params: MechanismParams) -> Mechanism:
    return CentralLaplace(params)

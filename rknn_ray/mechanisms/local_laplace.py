"""Naive local Laplace: every client adds Laplace(2kr/eps) noise to each of its d cells.

The paper's comparison point, dominated by randomized response. Sensitivity:
the L1 distance between two valid inputs is <= 2kr (a kr-hot record, or under
``multi_record=normalize`` two normalized answers A^i/m_i, each of L1 norm kr and
nonnegative), so noise of scale 2kr/eps per cell is eps-LDP, whichever ``rknn.connection``
rule chose the k queries (every rule gives a kr-hot record).

* ``multi_record=sample`` (default): the input is a 0/1 record vector; the noise is
  discrete Laplace, P[x] ~ exp(-|x| eps/(2kr)), drawn *exactly* from integer
  arithmetic (:mod:`rknn_ray.mechanisms.exact`; the rate eps/(2kr) is rounded down to
  a 2^-40 grid, i.e. towards more noise). Report: d little-endian int32 (4 d bytes).
  Variance 2a/(1-a)^2, a = e^{-eps/(2kr)}.
* ``multi_record=normalize``: the input A^i/m_i is fractional, so integer noise
  cannot hide it; the noise is the paper's continuous Laplace(2kr/eps) in float64,
  sent as float32 (4 d bytes). Variance 2 (2kr/eps)^2. Floating-point Laplace is
  open to Mironov's (2012) attack: the eps is that of the ideal real-valued
  mechanism; the guarantee says "approximate, float sampling". Use it as a baseline
  only (describe() says so).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import MechanismParams, MessageBatch
from rknn_ray.mechanisms.exact import geometric, noisier_rate
from rknn_ray.mechanisms.randomized_response import FlatLocalMechanism


class LocalLaplace(FlatLocalMechanism):
    """Per-cell Laplace(2kr/eps) on each client's answer (see module docstring)."""

    name = "laplace"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        self.discrete = self.multi_record in ("sample", "each")
        self.takes_fractional_input = not self.discrete

    @property
    def scale(self) -> float:
        return self.params.sensitivity_l1 / self.local_eps

    @property
    def rate(self):
        """The exact sampler's decay rate: eps/(2kr), computed exactly and rounded down to a
        2^-40 grid (more noise); never from the float scale 2kr/eps, which may round down."""
        return noisier_rate(Fraction(self.local_eps) / self.params.sensitivity_l1)

    @property
    def decay(self) -> float:
        """a = e^{-rate}: the discrete Laplace pmf is proportional to a^|x|."""
        return math.exp(-float(self.rate))

    @property
    def message_size(self) -> int:
        return 4 * self.params.num_cells

    def noise_variance(self) -> float:
        if self.discrete:
            a = self.decay
            return 2 * a / (1 - a) ** 2
        return 2 * self.scale ** 2

    def _normalized(self, answers: RecordAnswers, sl: slice, start, count) -> np.ndarray:
        """A^i / m_i for the clients in ``sl`` (dense rows)."""
        d = self.params.num_cells
        lo, hi = start[sl.start], start[sl.stop - 1] + count[sl.stop - 1]
        cells = answers.flat_cells()[lo:hi]
        local = np.repeat(np.arange(sl.stop - sl.start), count[sl])
        w = np.repeat(1.0 / count[sl], count[sl])
        kr = cells.shape[1]
        flat = np.bincount((local[:, None] * d + cells).ravel(), weights=np.repeat(w, kr),
                           minlength=(sl.stop - sl.start) * d)
        return flat.reshape(-1, d)

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        d = self.params.num_cells
        if self.discrete:
            ids, rec = self.client_records(answers, rng)
            cells = rec.flat_cells()
            out = np.empty((len(ids), d), dtype="<i4")
            rate = self.rate
            for sl in self._chunks(len(ids), d):
                shape = (sl.stop - sl.start, d)
                size = shape[0] * d
                noisy = (geometric(rng, rate, size) - geometric(rng, rate, size)).reshape(shape)
                noisy[np.arange(shape[0])[:, None], cells[sl]] += 1
                out[sl] = noisy
        else:
            self._check_answers(answers)
            ids, start, count = answers.clients()
            out = np.empty((len(ids), d), dtype="<f4")
            for sl in self._chunks(len(ids), d):
                x = self._normalized(answers, sl, start, count)
                out[sl] = x + rng.laplace(0.0, self.scale, x.shape)
        return MessageBatch(out.view(np.uint8).reshape(len(ids), -1), ids)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        ok = self._shape_ok(payloads)
        if not self.discrete and ok.any():
            vals = np.ascontiguousarray(payloads).view("<f4")
            ok &= np.isfinite(vals).all(axis=1)
        return ok

    def client_estimates(self, payloads: np.ndarray) -> np.ndarray:
        payloads, p = np.ascontiguousarray(self._checked(payloads)), self.params
        vals = payloads.view("<i4" if self.discrete else "<f4").astype(np.float64)
        return vals.reshape(-1, p.num_queries, p.num_classes)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Per cell: the sum of the noisy reports (int64, exact, for integer noise; else float64)."""
        payloads, p = np.ascontiguousarray(self._checked(payloads)), self.params
        dtype = np.int64 if self.discrete else np.float64
        total = np.zeros(p.num_cells, dtype)
        for sl in self._chunks(payloads.shape[0], p.num_cells):
            total += payloads[sl].view("<i4" if self.discrete else "<f4").sum(axis=0, dtype=dtype)
        return total

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        return np.asarray(stat, np.float64).reshape(self.params.num_queries, self.params.num_classes)

    def flat_variances(self) -> tuple[float, float]:
        v = self.noise_variance()
        return v, v

    def error_bound(self, beta: float, num_clients: int, method: str = "chernoff") -> float:
        """Chernoff bound for the sum of n Laplace noises, union over |Y| cells."""
        from rknn_ray.mechanisms import bounds  # defers scipy
        if method != "chernoff":
            raise ValueError(f"local Laplace has one error bound, 'chernoff'; got {method!r}")
        return bounds.laplace_sum_bound(num_clients, self.params.num_classes, beta,
                                        self.scale, discrete=self.discrete)

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        facts = super().guarantee_facts(event, n)
        if self.discrete:
            return facts
        return {**facts, "note": "approximate, float sampling: the eps of ideal real-valued "
                                 "Laplace, not of float64/float32 arithmetic (Mironov 2012); "
                                 + facts["note"]}

    def _facts(self) -> dict:
        return {"scale": self.scale,
                "noise": "exact discrete Laplace (integer sampler, int32)" if self.discrete else
                         "continuous float Laplace (baseline only: floating-point Laplace "
                         "is open to Mironov's attack)"}


@register("local", "laplace")
def _build(params: MechanismParams) -> LocalLaplace:
    return LocalLaplace(params)

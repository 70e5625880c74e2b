"""Separation and Concatenation (paper 000, Appendix B): estimate A^i = T_i y_i^T.

A record's answer is the outer product of its query indicator T (k of s) and its
label indicator y (r of |Y|). Both mechanisms report T and y through the
Collision oracle (collision.py) and estimate the outer product.

Separation: T through a (s, k, f eps, l_T)-Collision and y through an
(|Y|, r, (1-f) eps, l_y)-Collision (f = ``options["separation_split"]``, 0.5 as
in the paper); sequential composition gives eps. The two reports use independent
hashes (tags 1 and 2 of one 64-bit seed), so a_hat * b_hat is unbiased for a*b
and Var = Va Vb + a^2 Vb + b^2 Va exactly.

Concatenation: one (s + |Y|, k + r, eps, l)-Collision report of the concatenated
vector. Here the naive product a_hat * b_hat of one report is *biased*: for a
query and a label both in the record, one output z can hit both only through a
hash collision, so E[a_hat b_hat] = -q/(p - q) instead of 1 (it is unbiased, with
variance V^2, on the other cells -- the paper's approximation). We use instead
the unbiased estimator, linear in the hits X_u, X_w and their product,

    g = (q X_u + q X_w - X_u X_w - q^2) / (q (p - q)),

which uses E[X_u X_w] = q p if u or w is in the record, q^2 otherwise (true for a
(c+2)-wise independent hash). Note g = -((p - q)/q) a_hat b_hat: the naive product
rescaled, the only unbiased estimator in span{1, X_u, X_w, X_u X_w}. The pair
signal lives in the rare event H(u) = H(w) = z, so g has variance ~ p l/(p-q)^2 on
cells whose query or label is in the record (exact values:
:func:`concatenation_client_variance`); benchmarks/local_mse.py shows what this
does to the paper's Figure 6 claim.
"""
from __future__ import annotations

from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import MechanismParams, MessageBatch
from rknn_ray.mechanisms.collision import (SEED_BYTES, CollisionOracle, collision_l,
                                           collision_rates, decode_reports, encode_reports)
from rknn_ray.mechanisms.exact import float_below
from rknn_ray.mechanisms.options import option
from rknn_ray.mechanisms.randomized_response import DECODE_CHUNK_ELEMENTS, LocalMechanism


def separation_client_variance(var_t: tuple[float, float],
                               var_y: tuple[float, float]) -> dict:
    """Per-report Var[a_hat b_hat] by class (a, b) from the two oracles' (V_in, V_out)."""
    out = {}
    for a in (0, 1):
        for b in (0, 1):
            va, vb = var_t[1 - a], var_y[1 - b]
            out[a, b] = va * vb + a * vb + b * va
    return out


def concatenation_moments(eps: float, l: int, c: int, naive: bool = False) -> dict:
    """(mean, variance) of the per-report estimator g for each class (a, b).

    ``naive``: of the paper's plain product a_hat b_hat instead (biased on (1, 1)).
    """
    p, q = collision_rates(eps, l, c)
    D = p - q
    num = {(1, 1): -(1 - q) ** 2, (1, 0): q * (1 - q), (0, 1): q * (1 - q), (0, 0): -q * q}
    if naive:    # a_hat b_hat = -(q / D) g, i.e. numerator / D^2 instead of / (q D)
        num = {o: -v * q / D for o, v in num.items()}
    out = {}
    for a in (0, 1):
        for b in (0, 1):
            eu, ew = (p if a else q), (p if b else q)
            p11 = q * p if (a or b) else q * q
            prob = {(1, 1): p11, (1, 0): eu - p11, (0, 1): ew - p11}
            prob[0, 0] = 1 - sum(prob.values())
            m1 = sum(prob[o] * num[o] for o in prob) / (q * D)
            m2 = sum(prob[o] * num[o] ** 2 for o in prob) / (q * D) ** 2
            out[a, b] = (m1, m2 - m1 * m1)
    return out


def concatenation_client_variance(eps: float, l: int, c: int) -> dict:
    """Per-report Var[g] by class (a, b) (see module docstring)."""
    return {key: v for key, (_, v) in concatenation_moments(eps, l, c).items()}


# ---------------------------------------------------------------- the pair statistic
# Both estimators are linear in a report's query hits X_T (s,), label hits X_y (|Y|,)
# and their outer product, so the server only needs the three integer sums.

def _pair_statistic_size(s: int, ny: int) -> int:
    return s + ny + s * ny


def _pair_statistic(hit_chunks, s: int, ny: int) -> np.ndarray:
    """[sum X_T, sum X_y, sum X_T X_y^T (flat)] over chunks of (B, s), (B, |Y|) 0/1 hits."""
    st, sy, pair = np.zeros(s, np.int64), np.zeros(ny, np.int64), np.zeros((s, ny), np.int64)
    for xt, xy in hit_chunks:
        st += xt.sum(axis=0, dtype=np.int64)
        sy += xy.sum(axis=0, dtype=np.int64)
        # 0/1 products summed in float64 are exact below 2^53 reports per chunk
        pair += np.rint(xt.astype(np.float64).T @ xy.astype(np.float64)).astype(np.int64)
    return np.concatenate([st, sy, pair.ravel()])


def _pair_parts(stat: np.ndarray, s: int, ny: int):
    """(query hits, label hits, pair hits (s, |Y|)) of a pair statistic, as float64."""
    stat = np.asarray(stat, np.float64)
    if stat.shape != (_pair_statistic_size(s, ny),):
        raise ValueError(f"statistic has shape {stat.shape}, expected "
                         f"({_pair_statistic_size(s, ny)},): sum statistic() outputs of this "
                         "mechanism only")
    return stat[:s], stat[s:s + ny], stat[s + ny:].reshape(s, ny)


class SeparationMechanism(LocalMechanism):
    """Two Collision reports, T at f*eps and y at (1-f)*eps, one seed."""

    name = "separation"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        f = float(option(params.options, "separation_split"))
        self.split = f
        # sequential composition: e_t + e_y <= eps exactly (float f*eps and (1-f)*eps
        # may round up and sum to just above eps)
        eps = Fraction(self.local_eps)
        e_t = float_below(Fraction(f) * eps)
        e_y = float_below(eps - Fraction(e_t))
        self.oracle_t = CollisionOracle(params.num_queries, params.k, e_t,
                                        collision_l(e_t, params.k), tag=1)
        self.oracle_y = CollisionOracle(params.num_classes, params.r, e_y,
                                        collision_l(e_y, params.r), tag=2)

    @property
    def _zb(self) -> list[int]:
        return [self.oracle_t.z_bytes, self.oracle_y.z_bytes]

    @property
    def message_size(self) -> int:
        return SEED_BYTES + sum(self._zb)

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        ids, rec = self.client_records(answers, rng)
        seeds = rng.integers(0, 1 << 64, size=len(ids), dtype=np.uint64)
        zt = self.oracle_t.randomize(rec.neighbors, seeds, rng)
        zy = self.oracle_y.randomize(rec.labels, seeds, rng)
        return MessageBatch(encode_reports(seeds, [zt, zy], self._zb), ids)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        ok = self._shape_ok(payloads)
        if ok.any():
            _, (zt, zy) = decode_reports(payloads, self._zb)
            ok &= (zt < self.oracle_t.l) & (zy < self.oracle_y.l)
        return ok

    def _parts(self, seeds, zt, zy) -> tuple[np.ndarray, np.ndarray]:
        return (self.oracle_t.client_estimates(seeds, zt),
                self.oracle_y.client_estimates(seeds, zy))

    def client_estimates(self, payloads: np.ndarray) -> np.ndarray:
        seeds, (zt, zy) = decode_reports(self._checked(payloads), self._zb)
        a, b = self._parts(seeds, zt, zy)
        return a[:, :, None] * b[:, None, :]

    @property
    def statistic_size(self) -> int:
        return _pair_statistic_size(self.params.num_queries, self.params.num_classes)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Query hits, label hits and their pairs, summed over reports (int64, exact)."""
        seeds, (zt, zy) = decode_reports(self._checked(payloads), self._zb)
        return _pair_statistic(((self.oracle_t.hits(seeds[sl], zt[sl]),
                                 self.oracle_y.hits(seeds[sl], zy[sl]))
                                for sl in self._chunks(len(seeds), self.params.num_queries
                                                       + self.params.num_classes,
                                                       DECODE_CHUNK_ELEMENTS)),
                               self.params.num_queries, self.params.num_classes)

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        """sum_i a_i b_i^T expanded: a_i = (X_i - q_T)/(p_T - q_T), b_i likewise for labels."""
        st, sy, pair = _pair_parts(stat, self.params.num_queries, self.params.num_classes)
        (pt, qt), (py, qy) = self.oracle_t.rates, self.oracle_y.rates
        return (pair - qy * st[:, None] - qt * sy[None, :] + num_reports * qt * qy) \
            / ((pt - qt) * (py - qy))

    def _class_variances(self) -> dict:
        return separation_client_variance(self.oracle_t.variances, self.oracle_y.variances)

    def _range(self) -> float:
        def amax(o):
            p, q = o.rates
            return max(1 - q, q) / (p - q)
        return amax(self.oracle_t) * amax(self.oracle_y) + 1.0

    def error_bound(self, beta: float, num_clients: int, method: str = "bernstein") -> float:
        """Bernstein bound (the paper gives only O() rates for Separation)."""
        return self._bernstein(beta, num_clients, method)

    def _facts(self) -> dict:
        return {"split": self.split,
                "query_oracle": {"d": self.oracle_t.d, "c": self.oracle_t.c,
                                 "eps": self.oracle_t.eps, "l": self.oracle_t.l},
                "label_oracle": {"d": self.oracle_y.d, "c": self.oracle_y.c,
                                 "eps": self.oracle_y.eps, "l": self.oracle_y.l},
                "payload": "seed u64 LE + z_T + z_y (LE); hashes tagged 1 and 2"}


class ConcatenationMechanism(LocalMechanism):
    """One Collision report of [T, y] (length s + |Y|, k + r ones)."""

    name = "concatenation"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        c = params.k + params.r
        l = int(option(params.options, "collision_l") or collision_l(self.local_eps, c))
        self.oracle = CollisionOracle(params.num_queries + params.num_classes, c,
                                      self.local_eps, l, tag=0)

    @property
    def message_size(self) -> int:
        return SEED_BYTES + self.oracle.z_bytes

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        ids, rec = self.client_records(answers, rng)
        cells = np.concatenate([rec.neighbors, self.params.num_queries + rec.labels], axis=1)
        seeds = rng.integers(0, 1 << 64, size=len(ids), dtype=np.uint64)
        z = self.oracle.randomize(cells, seeds, rng)
        return MessageBatch(encode_reports(seeds, [z], [self.oracle.z_bytes]), ids)

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        ok = self._shape_ok(payloads)
        if ok.any():
            _, (z,) = decode_reports(payloads, [self.oracle.z_bytes])
            ok &= z < self.oracle.l
        return ok

    def _hits(self, seeds, z) -> tuple[np.ndarray, np.ndarray]:
        x = self.oracle.hits(seeds, z)
        s = self.params.num_queries
        return x[:, :s].astype(np.float64), x[:, s:].astype(np.float64)

    def client_estimates(self, payloads: np.ndarray) -> np.ndarray:
        seeds, (z,) = decode_reports(self._checked(payloads), [self.oracle.z_bytes])
        xt, xy = self._hits(seeds, z)
        p, q = self.oracle.rates
        g = q * xt[:, :, None] + q * xy[:, None, :] - xt[:, :, None] * xy[:, None, :] - q * q
        return g / (q * (p - q))

    @property
    def statistic_size(self) -> int:
        return _pair_statistic_size(self.params.num_queries, self.params.num_classes)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Query hits, label hits and their pairs, summed over reports (int64, exact)."""
        seeds, (z,) = decode_reports(self._checked(payloads), [self.oracle.z_bytes])
        s, ny = self.params.num_queries, self.params.num_classes

        def parts():
            for sl in self._chunks(len(z), self.oracle.d, DECODE_CHUNK_ELEMENTS):
                x = self.oracle.hits(seeds[sl], z[sl])
                yield x[:, :s], x[:, s:]
        return _pair_statistic(parts(), s, ny)

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        st, sy, pair = _pair_parts(stat, self.params.num_queries, self.params.num_classes)
        p, q = self.oracle.rates
        return (q * st[:, None] + q * sy[None, :] - pair - num_reports * q * q) / (q * (p - q))

    def _class_variances(self) -> dict:
        return concatenation_client_variance(self.local_eps, self.oracle.l, self.oracle.c)

    def _range(self) -> float:
        p, q = self.oracle.rates
        return (1 - q) ** 2 / (q * (p - q)) + 1.0

    def error_bound(self, beta: float, num_clients: int, method: str = "bernstein") -> float:
        """Bernstein bound (the paper gives only O() rates for Concatenation)."""
        return self._bernstein(beta, num_clients, method)

    def _facts(self) -> dict:
        p, q = self.oracle.rates
        return {"d": self.oracle.d, "c": self.oracle.c, "l": self.oracle.l,
                "estimator": "unbiased pair estimator (q X_u + q X_w - X_u X_w - q^2)/(q(p-q))",
                "naive_product_mean_on_true_cells": -q / (p - q),
                "payload": f"seed u64 LE + z u{8 * self.oracle.z_bytes} LE"}


@register("local", "separation")
def _build_separation(params: MechanismParams) -> SeparationMechanism:
    return SeparationMechanism(params)


@register("local", "concatenation")
def _build_concatenation(params: MechanismParams) -> ConcatenationMechanism:
    return ConcatenationMechanism(params)

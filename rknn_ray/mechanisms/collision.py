"""The (d, c, eps, l)-Collision mechanism (Wang et al. 2021; paper 000, Appendix A).

A client holding a set V of at most c cells out of d hashes V into [0, l) with a
fresh hash H and reports one z in [0, l) (Definition 5, Omega = c e^eps + l - c):

    P[z | V, H] = e^eps / Omega                          if z in H(V)
                = (Omega - e^eps h) / ((l - h) Omega)    otherwise, h = |H(V)|.

Privacy holds for *every* fixed H chosen independently of the data: the largest
probability is e^eps/Omega and the smallest is >= 1/Omega (because h <= c), so the
likelihood ratio is <= e^eps, with equality when H(V) has no collision. The report
carries the 64-bit seed of its hash, which reveals H but nothing about V.

Exact parameters: the sampler does not use the float e^eps / Omega. Each
hashed value gets pi = e^eps/Omega rounded *down* to a multiple of 2^-53 from an exact
lower bound w of e^eps (so pi (l - c) / (1 - c pi) <= w <= e^eps in exact arithmetic),
the rest share 1 - h pi uniformly, and every draw is an integer one (a uniform integer
below a threshold for the coin, ``rng.integers`` for the uniform picks). The estimator
uses p = pi.

Hash family (the paper assumes a fully random H). We use a random polynomial of
degree c+1 over GF(P), P = 2^31 - 1, with coefficients expanded from the seed by
SplitMix64, then reduced to [0, l) by multiply-shift ``(h * l) >> 31``. Over GF(P)
the family is exactly (c+2)-wise independent, which is all the analysis uses:
unbiasedness of the flat estimator needs H(v) uniform and independent of H(V)
for v not in V ((c+1)-wise), and the Concatenation pair estimator needs the same
for two cells ((c+2)-wise). The reduction to [0, l) is uniform up to a relative
error < l / P (< 1e-5 for l < 2e4); we ignore it. SplitMix64 is not a PRF in the
cryptographic sense; since privacy does not depend on H this only affects
unbiasedness, which the tests check by simulation.

Estimator: the report hits cell v iff H(v) = z; P[hit] = p = e^eps/Omega if v in V
and exactly q = 1/l otherwise (averaged over H), so (hit - q)/(p - q) is unbiased
for 1[v in V] and its variance is p(1-p)/(p-q)^2 (v in V) or q(1-q)/(p-q)^2.

Rounding of l: the paper sets l "around" 2c - 1 + c e^eps; we take whichever of
floor/ceil (at least c + 1) gives the smaller exact variance q(1-q)/(p-q)^2 of an
empty cell, and use the exact Omega of that integer l everywhere.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from rknn_ray.labeling.answers import RecordAnswers
from rknn_ray.errors import ConfigError
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import MechanismParams, MessageBatch
from rknn_ray.mechanisms.exact import COIN_BITS, coin, exp_lower, grid_down
from rknn_ray.mechanisms.options import option
from rknn_ray.mechanisms.randomized_response import DECODE_CHUNK_ELEMENTS, FlatLocalMechanism

PRIME = (1 << 31) - 1          # Mersenne prime 2^31 - 1: the hash field
_P = np.uint64(PRIME)
_S31 = np.uint64(31)
SEED_BYTES = 8


# ---------------------------------------------------------------- exact probabilities

def collision_omega(eps: float, l: int, c: int) -> float:
    """Normalisation Omega = c e^eps + l - c of Definition 5 (as a float, for reports)."""
    return c * math.exp(eps) + l - c


@functools.lru_cache(maxsize=256)
def collision_member_threshold(eps: float, l: int, c: int) -> int:
    """t with pi = t / 2^53 the probability of each hashed input value: the largest such
    pi <= w / (c w + l - c) for an exact lower bound w of e^eps. Then the likelihood ratio
    pi / ((1 - c pi) / (l - c)) <= w <= e^eps in exact arithmetic."""
    w = exp_lower(Fraction(eps))
    return int(grid_down(w / (c * w + l - c)) * (1 << COIN_BITS))


def collision_rates(eps: float, l: int, c: int) -> tuple[float, float]:
    """(p, q): P[hit] for a cell in V (pi ~ e^eps/Omega, rounded down to a multiple of
    2^-53, exactly what the sampler uses) and for one not in V (1/l)."""
    return collision_member_threshold(eps, l, c) / float(1 << COIN_BITS), 1.0 / l


def collision_client_variance(eps: float, l: int, c: int) -> tuple[float, float]:
    """Per-report variance of the unbiased cell estimate: (cell in V, cell not in V)."""
    p, q = collision_rates(eps, l, c)
    return p * (1 - p) / (p - q) ** 2, q * (1 - q) / (p - q) ** 2


def collision_l(eps: float, c: int) -> int:
    """Integer Bloom-filter length near 2c - 1 + c e^eps (see module docstring)."""
    real = 2 * c - 1 + c * math.exp(eps)
    cands = sorted({max(c + 1, math.floor(real)), max(c + 1, math.ceil(real))})
    return min(cands, key=lambda l: (collision_client_variance(eps, l, c)[1], l))


def collision_probabilities(eps: float, l: int, c: int, hashed) -> np.ndarray:
    """Exact P[z | V, H] over z in [0, l) given the hashed input H(V) (any duplicates):
    pi on each of the h distinct hashed values, (1 - h pi) / (l - h) elsewhere.

    This is the randomizer's full output distribution for a fixed hash; with the
    seed drawn independently of the data it is the whole likelihood.
    """
    hashed = np.unique(np.asarray(hashed, dtype=np.int64))
    h = hashed.size
    if h > c or h >= l or (h and (hashed.min() < 0 or hashed.max() >= l)):
        raise ValueError(f"need at most c={c} hashed values in [0, {l}) and h < l")
    pi, _ = collision_rates(eps, l, c)
    out = np.full(l, (1 - h * pi) / (l - h))
    out[hashed] = pi
    return out


# ---------------------------------------------------------------- the hash family

def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, vectorised (seed expansion for the hash coefficients)."""
    z = np.asarray(x, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def hash_coefficients(seeds: np.ndarray, tag: int, degree: int) -> np.ndarray:
    """(B, degree+1) polynomial coefficients in GF(P) from 64-bit seeds.

    ``tag`` separates independent hashes derived from one seed (Separation uses two).
    """
    base = splitmix64(np.asarray(seeds, dtype=np.uint64)
                      ^ np.uint64((0xD1B54A32D192ED03 * (tag + 1)) & 0xFFFFFFFFFFFFFFFF))
    j = np.arange(degree + 1, dtype=np.uint64)
    return splitmix64(base[:, None] + j[None, :]) % _P


def _fold_into(h: np.ndarray, scratch: np.ndarray) -> None:
    """One Mersenne fold in place: h <- (h & P) + (h >> 31), h mod P up to a multiple of P
    (result < 2^33). In place: fresh temporaries of a decode-sized array cost page faults."""
    np.bitwise_and(h, _P, out=scratch)
    np.right_shift(h, _S31, out=h)
    h += scratch


def poly_hash(coeffs: np.ndarray, keys: np.ndarray, l: int) -> np.ndarray:
    """H_i(key) in [0, l) for every row i of ``coeffs`` and every key: (B, K) int64.

    ``keys`` is (K,) shared by all rows or (B, K) per row; keys must be < 2^29 so
    lazy Horner steps stay below 2^63. Two (B, K) arrays in all, updated in place.
    """
    keys = np.asarray(keys, dtype=np.uint64)
    if keys.ndim == 1:
        keys = keys[None, :]
    t = coeffs.shape[1]
    h = np.broadcast_to(coeffs[:, t - 1:t], (coeffs.shape[0], keys.shape[1])).copy()
    scratch = np.empty_like(h)
    for j in range(t - 2, -1, -1):
        h *= keys
        h += coeffs[:, j:j + 1]
        _fold_into(h, scratch)
    _fold_into(h, scratch)
    _fold_into(h, scratch)
    np.subtract(h, _P, out=h, where=h >= _P)
    h *= np.uint64(l)
    h >>= _S31
    return h.view(np.int64)          # < l < 2^32: the same values as int64


def key_powers(num_keys: int, degree: int) -> np.ndarray:
    """(degree+1, K) uint64: v^j mod P for every key v < K and j <= degree."""
    v = np.arange(num_keys, dtype=np.uint64)
    powers = np.empty((degree + 1, num_keys), dtype=np.uint64)
    powers[0] = 1
    for j in range(1, degree + 1):
        powers[j] = powers[j - 1] * v % _P        # < 2^31 * 2^29: no overflow
    return powers


def hash_every_key(coeffs: np.ndarray, powers: np.ndarray, l: int,
                   out: np.ndarray | None = None, scratch: np.ndarray | None = None) -> np.ndarray:
    """H_i(v) in [0, l) for every row i of ``coeffs`` and every key v < K: (B, K) int64.

    The same values as ``poly_hash(coeffs, np.arange(K), l)`` (the same polynomial mod P),
    for the server's decoding, where every report's hash is evaluated on every cell: the
    sum of c_j * (v^j mod P) over precomputed powers folds once per four terms (each
    product <= (P-1)^2 < 2^62 - 2^32, so four of them and a folded rest < 2^34 stay below
    2^64; tests/test_mech_local.py fails at five) instead of once per Horner step,
    and ``out``/``scratch`` let a caller reuse its (B, K) buffers across chunks.
    """
    b, t = coeffs.shape
    k = powers.shape[1]
    h = np.empty((b, k), np.uint64) if out is None else out[:b, :k]
    tmp = np.empty_like(h) if scratch is None else scratch[:b, :k]
    np.multiply(coeffs[:, t - 1:t], powers[t - 1][None, :], out=h)
    terms = 1
    for j in range(t - 2, 0, -1):
        if terms == 4:
            _fold_into(h, tmp)
            terms = 0
        np.multiply(coeffs[:, j:j + 1], powers[j][None, :], out=tmp)
        h += tmp
        terms += 1
    if t > 1:                       # (t == 1: powers[0] is 1, h is the constant already)
        h += coeffs[:, 0:1]
    _fold_into(h, tmp)              # < 2^34
    _fold_into(h, tmp)              # < 2P
    np.subtract(h, _P, out=h, where=h >= _P)
    h *= np.uint64(l)
    h >>= _S31
    return h.view(np.int64)


# ---------------------------------------------------------------- client sampler

def sample_collision(hashed: np.ndarray, eps: float, l: int, c: int,
                     rng: np.random.Generator) -> np.ndarray:
    """One z per row of ``hashed`` ((B, <=c) hashed input cells), per Definition 5."""
    distinct, h = distinct_cells(hashed)
    return collision_pick(distinct, h, *collision_draws(rng, h, eps, l, c))


def distinct_cells(hashed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's distinct hashed cells, sorted (then a sentinel), and how many (row by row)."""
    srt = np.sort(hashed, axis=1)
    dup = np.zeros_like(srt, dtype=bool)
    dup[:, 1:] = srt[:, 1:] == srt[:, :-1]
    sentinel = np.int64(np.iinfo(np.int64).max)
    return np.sort(np.where(dup, sentinel, srt), axis=1), (~dup).sum(axis=1)


def collision_draws(rng: np.random.Generator, h: np.ndarray, eps: float, l: int,
                    c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sampler's draws for rows of ``h`` distinct cells, in its order: every draw is an
    exact integer one: P[inside] = h pi, then a uniform member or a uniform non-member
    (rng.integers rejects out-of-range draws, so no float bias)."""
    inside = coin(rng, h * collision_member_threshold(eps, l, c), h.shape[0])
    pick = rng.integers(0, np.maximum(h, 1))
    z_out = rng.integers(0, l - h)
    return inside, pick, z_out


def collision_pick(distinct: np.ndarray, h: np.ndarray, inside: np.ndarray, pick: np.ndarray,
                   z_out: np.ndarray) -> np.ndarray:
    """z from the draws: the picked member, or the non-member skipping the members."""
    z_in = distinct[np.arange(h.shape[0]), pick]
    for j in range(distinct.shape[1]):
        z_out += z_out >= distinct[:, j]
    return np.where(inside, z_in, z_out)


# ---------------------------------------------------------------- one oracle

def _uint_bytes(l: int) -> int:
    return max(1, ((l - 1).bit_length() + 7) // 8)


@dataclass(frozen=True)
class CollisionOracle:
    """A (d, c, eps, l)-Collision sparse-vector oracle with hash tag ``tag``."""
    d: int
    c: int
    eps: float
    l: int
    tag: int = 0

    def __post_init__(self):
        if self.d >= (1 << 29):
            raise ConfigError("mechanism", f"domain d={self.d} too large for the GF(2^31-1) "
                              "hash", "use fewer queries/classes (d < 2^29)")
        if self.l <= self.c or self.l >= (1 << 32):
            raise ConfigError("options.collision_l", f"l={self.l} must be in (c={self.c}, 2^32)",
                              "leave collision_l unset to use the paper's 2c-1+c e^eps")

    @property
    def degree(self) -> int:
        return self.c + 1       # (c+2)-wise independent polynomial hash

    @property
    def z_bytes(self) -> int:
        return _uint_bytes(self.l)

    @property
    def rates(self) -> tuple[float, float]:
        return collision_rates(self.eps, self.l, self.c)

    @property
    def variances(self) -> tuple[float, float]:
        return collision_client_variance(self.eps, self.l, self.c)

    def randomize(self, cells: np.ndarray, seeds: np.ndarray,
                  rng: np.random.Generator) -> np.ndarray:
        """z for each row of ``cells`` ((B, <=c) indices in [0, d))."""
        hashed = poly_hash(hash_coefficients(seeds, self.tag, self.degree), cells, self.l)
        return sample_collision(hashed, self.eps, self.l, self.c, rng)

    @functools.cached_property
    def _powers(self) -> np.ndarray:
        return key_powers(self.d, self.degree)

    def hits(self, seeds: np.ndarray, z: np.ndarray) -> np.ndarray:
        """(B, d) bool: does report i hit cell v, i.e. H_i(v) == z_i."""
        coeffs = hash_coefficients(seeds, self.tag, self.degree)
        return hash_every_key(coeffs, self._powers, self.l) == z[:, None]

    def hit_counts(self, seeds: np.ndarray, z: np.ndarray, chunk_elements: int) -> np.ndarray:
        """(d,) int64: how many reports hit each cell, ``chunk_elements`` hashes at a time in
        two reused buffers (fresh ones per chunk cost page faults)."""
        counts = np.zeros(self.d, dtype=np.int64)
        rows = max(1, int(chunk_elements) // max(1, self.d))
        coeffs = hash_coefficients(seeds, self.tag, self.degree)
        out = np.empty((min(rows, len(z)), self.d), np.uint64)
        scratch = np.empty_like(out)
        for lo in range(0, len(z), rows):
            hashed = hash_every_key(coeffs[lo:lo + rows], self._powers, self.l, out, scratch)
            counts += (hashed == z[lo:lo + rows, None]).sum(axis=0, dtype=np.int64)
        return counts

    def client_estimates(self, seeds: np.ndarray, z: np.ndarray) -> np.ndarray:
        """(B, d) unbiased per-report estimates of the input indicator vector."""
        p, q = self.rates
        return (self.hits(seeds, z) - q) / (p - q)


def encode_reports(seeds: np.ndarray, zs: list[np.ndarray], z_bytes: list[int]) -> np.ndarray:
    """Rows [seed: 8 bytes LE][z_1: z_bytes[0] LE]...; uint8 (B, 8 + sum z_bytes)."""
    parts = [np.ascontiguousarray(seeds.astype("<u8")).view(np.uint8).reshape(-1, 8)]
    for z, nb in zip(zs, z_bytes):
        parts.append(np.ascontiguousarray(z.astype("<u4")).view(np.uint8).reshape(-1, 4)[:, :nb])
    return np.concatenate(parts, axis=1)


def decode_reports(payloads: np.ndarray, z_bytes: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Inverse of :func:`encode_reports`: (seeds uint64, [z int64, ...])."""
    payloads = np.ascontiguousarray(payloads)
    seeds = payloads[:, :8].copy().view("<u8").reshape(-1).astype(np.uint64)
    zs, off = [], 8
    for nb in z_bytes:
        buf = np.zeros((payloads.shape[0], 4), dtype=np.uint8)
        buf[:, :nb] = payloads[:, off:off + nb]
        zs.append(buf.view("<u4").reshape(-1).astype(np.int64))
        off += nb
    return seeds, zs


# ---------------------------------------------------------------- the flat mechanism

class CollisionMechanism(FlatLocalMechanism):
    """Flat Collision on the s*|Y| cell vector with c = k r ones (Theorem 2).

    Option ``collision_l`` overrides the Bloom-filter length.
    """

    name = "collision"

    def __init__(self, params: MechanismParams):
        super().__init__(params)
        c = params.k * params.r
        l = int(option(params.options, "collision_l") or collision_l(self.local_eps, c))
        self.oracle = CollisionOracle(params.num_cells, c, self.local_eps, l, tag=0)

    @property
    def l(self) -> int:
        return self.oracle.l

    @property
    def message_size(self) -> int:
        return SEED_BYTES + self.oracle.z_bytes

    def randomize(self, answers: RecordAnswers, rng: np.random.Generator) -> MessageBatch:
        ids, rec = self.client_records(answers, rng)
        cells = rec.flat_cells()
        seeds = rng.integers(0, 1 << 64, size=len(ids), dtype=np.uint64)
        z = self.oracle.randomize(cells, seeds, rng)
        return MessageBatch(encode_reports(seeds, [z], [self.oracle.z_bytes]), ids)

    def randomize_many(self, answers: list[RecordAnswers],
                       rngs: list[np.random.Generator]) -> list[MessageBatch]:
        """``randomize(answers[i], rngs[i])`` for every i (many holders in one process): each
        generator makes the same draws in the same order as alone; the hash and the
        sampler's arithmetic, row by row, run once over all rows."""
        if type(self).randomize is not CollisionMechanism.randomize:
            return [self.randomize(a, rng) for a, rng in zip(answers, rngs)]
        o, ids, cells, seeds = self.oracle, [], [], []
        for a, rng in zip(answers, rngs):
            who, rec = self.client_records(a, rng)
            ids.append(who)
            cells.append(rec.flat_cells())
            seeds.append(rng.integers(0, 1 << 64, size=len(who), dtype=np.uint64))
        if not ids:
            return []
        at = np.concatenate([[0], np.cumsum([len(i) for i in ids])])
        seed = np.concatenate(seeds)
        hashed = poly_hash(hash_coefficients(seed, o.tag, o.degree), np.concatenate(cells), o.l)
        distinct, h = distinct_cells(hashed)
        draws = [collision_draws(rng, h[lo:hi], o.eps, o.l, o.c)
                 for rng, lo, hi in zip(rngs, at[:-1], at[1:])]
        z = collision_pick(distinct, h, *(np.concatenate(d) for d in zip(*draws)))
        payloads = encode_reports(seed, [z], [o.z_bytes])
        return [MessageBatch(payloads[lo:hi], who) for who, lo, hi in zip(ids, at[:-1], at[1:])]

    def well_formed(self, payloads: np.ndarray) -> np.ndarray:
        ok = self._shape_ok(payloads)
        if ok.any():
            _, (z,) = decode_reports(payloads, [self.oracle.z_bytes])
            ok &= z < self.l
        return ok

    def client_estimates(self, payloads: np.ndarray) -> np.ndarray:
        seeds, (z,) = decode_reports(self._checked(payloads), [self.oracle.z_bytes])
        est = self.oracle.client_estimates(seeds, z)
        return est.reshape(-1, self.params.num_queries, self.params.num_classes)

    def statistic(self, payloads: np.ndarray) -> np.ndarray:
        """Per cell: how many reports hit it (H_i(v) == z_i)."""
        seeds, (z,) = decode_reports(self._checked(payloads), [self.oracle.z_bytes])
        return self.oracle.hit_counts(seeds, z, DECODE_CHUNK_ELEMENTS)

    def finalize(self, stat: np.ndarray, num_reports: int,
                 rng: np.random.Generator | None = None) -> np.ndarray:
        p, q = self.oracle.rates
        est = (np.asarray(stat, np.float64) - num_reports * q) / (p - q)
        return est.reshape(self.params.num_queries, self.params.num_classes)

    def flat_variances(self) -> tuple[float, float]:
        return self.oracle.variances

    def error_bound(self, beta: float, num_clients: int, method: str = "theorem") -> float:
        """Theorem 2 ('theorem', l in the numerator as its tail bound solves to;
        'printed' for the paper's final line) or a Bernstein bound ('bernstein')."""
        from rknn_ray.mechanisms import bounds  # defers scipy
        p = self.params
        if method in ("theorem", "printed"):
            return bounds.theorem2_bound(self.local_eps, p.k, p.r, p.num_classes, num_clients,
                                         beta, l=self.l,
                                         variant="solved" if method == "theorem" else "printed")
        return self._bernstein(beta, num_clients, method)

    def _range(self) -> float:
        p, q = self.oracle.rates
        return max(1 - q, p) / (p - q)

    def _facts(self) -> dict:
        p, q = self.oracle.rates
        return {"d": self.oracle.d, "c": self.oracle.c, "l": self.l,
                "l_rule": "floor/ceil of 2c-1+c*e^eps with the smaller exact variance",
                "omega": collision_omega(self.local_eps, self.l, self.oracle.c),
                "p_hit_member": p, "p_hit_other": q,
                "hash": "degree-(c+1) polynomial over GF(2^31-1), SplitMix64-expanded 64-bit "
                        "seed per report, multiply-shift to [0, l)",
                "payload": f"seed u64 LE + z u{8 * self.oracle.z_bytes} LE"}


@register("local", "collision")
def _build(params: MechanismParams) -> CollisionMechanism:
    return CollisionMechanism(params)

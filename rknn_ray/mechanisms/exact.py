"""Exact, vectorized integer samplers: geometric, discrete Laplace, negative binomial, Poisson.

Where a mechanism claims pure (or exactly accounted) DP, its noise must have
*exactly* the distribution the proof uses: a float sampler has bounded support and
rounding artefacts (Mironov 2012; numpy's float geometric fails pure eps with
delta ~ 1e-17). Every sampler here uses only uniform integers ``rng.integers(0, m)``
(exactly uniform: numpy rejects out-of-range draws) and integer comparisons, after
Canonne, Kamath and Steinke (2020, "The Discrete Gaussian for Differential
Privacy", Algorithms 1-2):

* ``bernoulli_exp(g)``: exact Bernoulli(exp(-g)) for rational g (CKS Alg. 1);
* ``geometric(g)``: P[Y = y] = (1 - e^-g) e^-gy, y >= 0 (CKS Alg. 2's inner loop);
* ``discrete_laplace(scale)``: the difference of two such geometrics, P[x] ~ exp(-|x|/scale);
* ``negative_binomial(r, g)``: P[k] = C(k+r-1, k) (1-q)^r q^k with q = e^-g, by
  rejection from geometric(g): accept k with prod_{i<k} (i+r)/(i+1) <= 1 (r <= 1;
  r > 1 adds floor(r) geometrics);
* ``poisson(lam)``: sum of ceil(2 lam) Poisson(<= 1/2) draws, each by rejection from
  a geometric with ratio lam' (accept k with 1/k!, coin by coin).

Parameters are rationals. A float parameter is first rounded *towards more noise*
to a denominator of 2^40 (:func:`noisier_rate`, :func:`noisier_mean`): the noise
is then exactly the one of the rounded parameter, the mechanism states the guarantee
of the rounded parameter (never better than asked), and the difference is < 1e-12
relative. ``rng`` is the caller's generator: a ChaCha20 stream on the private path
(:mod:`rknn_ray.rng`).
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

DENOMINATOR_BITS = 40
_MAX_INT = 1 << 62        # numpy int64 draws: keep every modulus below this


def noisier_rate(g: float | Fraction) -> Fraction:
    """A rational decay rate <= g (so exp(-rate) >= exp(-g): at least as much noise)."""
    g = Fraction(g)
    if g <= 0:
        raise ValueError(f"a decay rate must be > 0, got {float(g)}")
    den = 1 << DENOMINATOR_BITS
    num = math.floor(g * den)
    if num <= 0:
        raise ValueError(f"decay rate {float(g)} is below 2^-{DENOMINATOR_BITS}: the noise "
                         "would be astronomically large; raise eps")
    return Fraction(num, den)


def noisier_mean(lam: float | Fraction) -> Fraction:
    """A rational mean >= lam (flooding: at least as many dummy messages as asked)."""
    lam = Fraction(lam)
    if lam < 0:
        raise ValueError(f"a Poisson mean must be >= 0, got {float(lam)}")
    den = 1 << DENOMINATOR_BITS
    return Fraction(math.ceil(lam * den), den)


# ---------------------------------------------------------------- exact parameters
# The randomizers' coins and the central scale are rationals rounded toward more privacy,
# so the eps each one implies, computed exactly, never exceeds its target.

COIN_BITS = 53            # a coin's probability is a multiple of 2^-53 (exact as a float64)
_EXP_BITS = 160           # fixed-point precision of exp_lower


def exp_lower(x: float | Fraction) -> Fraction:
    """A dyadic rational <= e^x for x >= 0, within ~2^-150 relative: the Taylor series
    with every term rounded down in 160-bit fixed point (each term, hence the sum, is a
    lower bound), so ``ratio <= exp_lower(x)`` proves ``ratio <= e^x`` exactly."""
    x = Fraction(x)
    if x < 0:
        raise ValueError(f"exp_lower needs x >= 0, got {float(x)}")
    one = 1 << _EXP_BITS
    xn, xd = x.numerator, x.denominator
    term, total, j = one, one, 1
    while term:
        term = term * xn // (xd * j)          # floor(t_{j-1} x / j) <= x^j / j!
        total += term
        j += 1
    return Fraction(total, one)


def grid_up(p: Fraction, bits: int = COIN_BITS) -> Fraction:
    """The smallest multiple of 2^-bits that is >= p."""
    p = Fraction(p)
    return Fraction(-((-p.numerator << bits) // p.denominator), 1 << bits)


def grid_down(p: Fraction, bits: int = COIN_BITS) -> Fraction:
    """The largest multiple of 2^-bits that is <= p."""
    p = Fraction(p)
    return Fraction((p.numerator << bits) // p.denominator, 1 << bits)


def coin(rng, threshold, size) -> np.ndarray:
    """Exact Bernoulli(threshold / 2^COIN_BITS) draws (``threshold`` an int or int array):
    uniform integers compared with an integer, no float in the way (the same 64 random
    bits per draw as ``rng.random``)."""
    return rng.integers(0, 1 << COIN_BITS, size=size, dtype=np.int64) < threshold


def float_below(x: Fraction) -> float:
    """The largest float <= x (a float parameter that must not exceed an exact value)."""
    f = float(x)
    return f if Fraction(f) <= x else math.nextafter(f, -math.inf)


def noisier_scale(sensitivity: int, eps: float | Fraction) -> Fraction:
    """Laplace scale >= sensitivity / eps, exactly: 1 / (eps / sensitivity rounded down to a
    float), within 2^-52 relative; a float 2kr/eps may round down and imply an eps above
    the target. :func:`discrete_laplace` draws at this scale, or (off its 2^-40 grid) at a
    scale larger by < 2^-40 / rate relative."""
    rate = float_below(Fraction(eps) / int(sensitivity))
    if not rate > 0:
        raise ValueError(f"eps / sensitivity = {float(eps)}/{sensitivity} is not a positive float")
    return 1 / Fraction(rate)


def _below(rng: np.random.Generator, m, size: int) -> np.ndarray:
    """Uniform integers in [0, m) (m scalar or array, every m < 2^62), exactly."""
    m_max = int(np.max(m)) if np.ndim(m) else int(m)
    if m_max >= _MAX_INT:
        raise ValueError(f"modulus {m_max} too large for the vectorized exact samplers")
    return rng.integers(0, m, size=size, dtype=np.int64)


def _bernoulli_exp_le1(rng, num: np.ndarray, den: int) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) per element, 0 <= num <= den (CKS 2020 Alg. 1).

    Draw A_k ~ Bernoulli(g / k) for k = 1, 2, ... until the first failure; the result is
    1 iff that k is odd. Every active element shares k, so one vector draw per step.
    """
    num = np.asarray(num, np.int64)
    out = np.zeros(num.shape, bool)
    active = np.arange(num.size)
    k = 1
    while active.size:
        coin = _below(rng, den * k, active.size) < num[active]
        stopped = active[~coin]
        out[stopped] = (k % 2) == 1
        active = active[coin]
        k += 1
    return out


def bernoulli_exp(rng, g: Fraction, size: int) -> np.ndarray:
    """Exact Bernoulli(exp(-g)) draws for a rational g >= 0."""
    g = Fraction(g)
    if g < 0:
        raise ValueError(f"g must be >= 0, got {float(g)}")
    out = np.ones(size, bool)
    whole, frac = int(g), g - int(g)
    for _ in range(whole):                          # exp(-g) = exp(-1)^whole * exp(-frac)
        out &= _bernoulli_exp_le1(rng, np.ones(size, np.int64), 1)
    if frac:
        out &= _bernoulli_exp_le1(rng, np.full(size, frac.numerator, np.int64), frac.denominator)
    return out


def geometric(rng, g: Fraction, size: int) -> np.ndarray:
    """Exact P[Y = y] = (1 - e^-g) e^-gy on y >= 0, for a rational g = a / b > 0.

    X = U + b V with U ~ Unif{0..b-1} kept with probability exp(-U/b) and V the number
    of successes of Bernoulli(exp(-1)) before the first failure has P[X = x] ~ e^{-x/b};
    Y = floor(X / a) then has P[Y = y] ~ e^{-a y / b} (CKS 2020, Alg. 2).
    """
    g = Fraction(g)
    if g <= 0:
        raise ValueError(f"geometric decay rate must be > 0, got {float(g)}")
    a, b = g.numerator, g.denominator
    out = np.empty(size, np.int64)
    todo = np.arange(size)
    while todo.size:
        u = _below(rng, b, todo.size)
        keep = _bernoulli_exp_le1(rng, u, b)
        idx, u = todo[keep], u[keep]
        v = np.zeros(idx.size, np.int64)
        active = np.arange(idx.size)
        while active.size:                         # V: successes of Bernoulli(e^-1)
            hit = _bernoulli_exp_le1(rng, np.ones(active.size, np.int64), 1)
            v[active[hit]] += 1
            active = active[hit]
        out[idx] = (u + b * v) // a
        todo = todo[~keep]
    return out


def discrete_laplace(rng, scale: float | Fraction, shape) -> np.ndarray:
    """Exact discrete Laplace, P[x] ~ exp(-|x| / scale'), scale' = 1/noisier_rate(1/scale) >= scale."""
    scale = Fraction(scale)
    if scale <= 0:
        raise ValueError(f"discrete Laplace scale must be > 0, got {float(scale)}")
    g = noisier_rate(1 / scale)
    size = int(np.prod(shape))
    return (geometric(rng, g, size) - geometric(rng, g, size)).reshape(shape)


def negative_binomial(rng, r: Fraction, g: Fraction, size: int) -> np.ndarray:
    """Exact NB: P[k] = Gamma(k+r)/(k! Gamma(r)) (1-q)^r q^k, q = e^-g, rational r > 0, g > 0.

    The number of failures before r successes when each trial fails with probability q
    (numpy's ``negative_binomial(r, 1 - q)``). r = m + f: m geometrics plus, for the
    fraction f in (0, 1), rejection from geometric(g): the ratio of the pmfs is
    (1-q)^(f-1) w_k with w_k = prod_{i<k} (i+f)/(i+1) <= 1, so accepting k with
    probability w_k (one exact rational coin per factor) gives NB(f) exactly.
    """
    r, g = Fraction(r), Fraction(g)
    if r <= 0:
        raise ValueError(f"NB shape must be > 0, got {float(r)}")
    whole, f = int(r), r - int(r)
    out = np.zeros(size, np.int64)
    for _ in range(whole):
        out += geometric(rng, g, size)
    if not f:
        return out
    fn, fd = f.numerator, f.denominator
    todo = np.arange(size)
    while todo.size:
        # K >= 1 with probability q; the first factor of w_K is f, so most proposals
        # are settled by two coins and only the survivors draw the rest of K.
        positive = bernoulli_exp(rng, g, todo.size)
        first = np.zeros(todo.size, bool)
        first[positive] = _below(rng, fd, int(positive.sum())) < fn
        rest = np.flatnonzero(first)
        k = 1 + geometric(rng, g, rest.size)         # memoryless: K | K >= 1 is 1 + geometric
        ok = np.ones(rest.size, bool)
        for i in range(1, int(k.max()) if k.size else 0):
            live = np.flatnonzero(ok & (k > i))
            if not live.size:
                break
            ok[live] = _below(rng, (i + 1) * fd, live.size) < i * fd + fn
        out[todo[rest[ok]]] += k[ok]
        done = ~positive
        done[rest[ok]] = True
        todo = todo[~done]
    return out


def poisson(rng, lam: Fraction, size: int) -> np.ndarray:
    """Exact Poisson(lam) for a rational lam >= 0.

    lam = m * l with l <= 1/2; each Poisson(l) by rejection from P[k] = (1-l) l^k (the
    successes of Bernoulli(l) before a failure), accepting k with probability 1/k!
    (coins Bernoulli(1/i), i = 2..k): the accepted k has P ~ l^k / k!.
    """
    lam = Fraction(lam)
    if lam < 0:
        raise ValueError(f"Poisson mean must be >= 0, got {float(lam)}")
    out = np.zeros(size, np.int64)
    if lam == 0 or size == 0:
        return out
    parts = max(1, math.ceil(2 * lam))
    part = lam / parts
    pn, pd = part.numerator, part.denominator
    todo = np.repeat(np.arange(size), parts)        # one slot per (element, part)
    while todo.size:
        k = np.zeros(todo.size, np.int64)
        active = np.arange(todo.size)
        while active.size:
            hit = _below(rng, pd, active.size) < pn
            k[active[hit]] += 1
            active = active[hit]
        ok = np.ones(todo.size, bool)
        for i in range(2, int(k.max()) + 1 if k.size else 0):
            live = np.flatnonzero(ok & (k >= i))
            ok[live] = _below(rng, i, live.size) == 0
        np.add.at(out, todo[ok], k[ok])
        todo = todo[~ok]
    return out

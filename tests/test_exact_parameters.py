"""Issue 21 item 5: no float on the pure-DP path may imply an eps above the target.

Every parameter a sampler uses (the central scale, RR's flip probability, Collision's
hit probability, the local Laplace rate, Separation's eps split) is checked in exact
rational arithmetic on a grid of (eps, k): the eps it implies never exceeds the target,
and it stays within 1e-12 of it (the rounding costs no utility). e^x comes from Python's
``decimal`` at 80 digits (correctly rounded), turned into an exact lower bound.
"""
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pytest

from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import MechanismParams
from rknn_ray.mechanisms.collision import collision_l, collision_rates

EPS = [float(e) for e in np.linspace(0.01, 10.0, 999)]
KS = (1, 2, 3, 4)
TIGHT = Fraction(1, 10 ** 12)


def exp_at_least(x: Fraction) -> Fraction:
    """An exact rational <= e^x (80-digit correctly rounded exp, minus its rounding bound)."""
    with localcontext() as ctx:
        ctx.prec = 80
        e = (Decimal(x.numerator) / Decimal(x.denominator)).exp()
    return Fraction(e) * (1 - Fraction(1, 10 ** 78))


def exp_at_most(x: Fraction) -> Fraction:
    with localcontext() as ctx:
        ctx.prec = 80
        e = (Decimal(x.numerator) / Decimal(x.denominator)).exp()
    return Fraction(e) * (1 + Fraction(1, 10 ** 78))


def _params(k, eps, r=1, **options):
    return MechanismParams(num_queries=8, num_classes=3, k=k, eps=eps, r=r, options=options)


def test_central_scale_never_implies_more_than_eps():
    over = 0
    for eps in EPS:
        for k in KS:
            for noise in ("discrete", "continuous"):
                mech = build("central", "laplace", _params(k, eps, noise=noise))
                implied = Fraction(2 * k) / Fraction(mech.scale)      # sensitivity / scale
                over += implied > Fraction(eps)
                assert implied >= Fraction(eps) * (1 - TIGHT)
            # what the accountants read from the event is no larger either
            ev = build("central", "laplace", _params(k, eps)).event()
            assert Fraction(ev.noise_parameter) * ev.sensitivity <= Fraction(eps)
    assert over == 0, f"{over} (eps, k, noise) triples imply an eps above the target"


def test_rr_flip_probability_never_implies_more_than_eps():
    over = 0
    for eps in EPS:
        for k in KS:
            q = Fraction(build("local", "rr", _params(k, eps)).flip_probability)
            x = Fraction(eps) / (2 * k)                # per bit: ratio (1-q)/q <= e^{eps/(2kr)}
            ratio = (1 - q) / q
            over += ratio > exp_at_least(x)
            assert ratio >= exp_at_most(x) * (1 - TIGHT)
    assert over == 0, f"{over} (eps, k) pairs: RR's flip probability exceeds e^(eps/2k)"


def test_collision_hit_probability_never_implies_more_than_eps():
    """The worst likelihood ratio of the sampler's exact distribution, pi on each hashed
    value vs (1 - c pi)/(l - c) off them, is at most e^eps (c = kr hashed values)."""
    over = 0
    for eps in EPS:
        for c in KS:
            l = collision_l(eps, c)
            pi = Fraction(collision_rates(eps, l, c)[0])
            assert pi > Fraction(1, l)         # a hit on a held cell beats a chance hit
            ratio = pi * (l - c) / (1 - c * pi)
            over += ratio > exp_at_least(Fraction(eps))
            assert ratio >= exp_at_most(Fraction(eps)) * (1 - TIGHT)
    assert over == 0, f"{over} (eps, c) pairs: Collision's ratio exceeds e^eps"


def test_local_laplace_rate_and_separation_split_stay_within_eps():
    for eps in EPS[::7]:
        for k in KS:
            lap = build("local", "laplace", _params(k, eps))
            assert lap.rate * 2 * k <= Fraction(eps)
            assert lap.rate * 2 * k >= Fraction(eps) * (1 - Fraction(1, 10 ** 9))
        for f in (0.1, 0.3, 0.5, 0.7, 0.9):
            sep = build("local", "separation", _params(1, eps, separation_split=f))
            total = Fraction(sep.oracle_t.eps) + Fraction(sep.oracle_y.eps)
            assert Fraction(eps) * (1 - TIGHT) <= total <= Fraction(eps)


@pytest.mark.parametrize("name", ["rr", "collision"])
def test_samplers_draw_with_the_stated_probability(name):
    """The randomizers' coins are the exact rationals above: frequencies on the ChaCha20
    path match the stated probabilities (RR flips; Collision hits on a held cell)."""
    from rknn_ray.labeling.answers import RecordAnswers
    from rknn_ray.rng import derived_generator
    m, eps = 40_000, 1.3
    mech = build("local", name, _params(1, eps))
    ans = RecordAnswers(np.zeros((m, 1), np.int64), np.zeros((m, 1), np.int64),
                        np.arange(m, dtype=np.int64), 8, 3)
    stat = mech.statistic(mech.randomize(ans, derived_generator(b"\x01" * 32, "t")).payloads)
    p = (1 - mech.flip_probability) if name == "rr" else collision_rates(eps, mech.l, 1)[0]
    assert abs(stat[0] - m * p) < 5 * np.sqrt(m * p * (1 - p))

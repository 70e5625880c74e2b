"""Amplification bounds by name, as a job names them (``privacy.amplification_bound``).

:func:`get_bound` resolves a name (and, for 'variation_ratio' or 'tight', a randomizer) to a
bound object; :func:`round_bound` picks the form that applies to one shuffled randomizer;
:func:`upper_bound_names` lists the names a release may be costed with;
:func:`amplified_local_eps` inverts a bound. Kept apart from :mod:`.bounds` (the bound
classes) and :mod:`.tight` (which builds on them), so neither imports the other both ways.
"""
from __future__ import annotations

import functools

from rknn_ray.accounting.bounds import (BOUNDS, AmplificationBound, ConfigError,
                                        variation_ratio_bound)
from rknn_ray.accounting.tight import tight_bound


def get_bound(name: str, mechanism: str = "generic", **mech_params) -> AmplificationBound:
    """Bound by name; 'variation_ratio' or 'tight' with a mechanism gives the
    mechanism-specific one ('tight': :mod:`rknn_ray.accounting.tight`)."""
    if name == "tight":
        return tight_bound(mechanism, **mech_params)
    if name == "variation_ratio" and mechanism != "generic":
        return variation_ratio_bound(mechanism, **mech_params)
    if name not in BOUNDS:
        raise ConfigError("bound", f"unknown amplification bound {name!r}",
                          f"use one of {sorted(BOUNDS) + ['tight']}")
    return BOUNDS[name]


#: bounds a job applies to its randomizer in their mechanism-specific form where one exists
#: (the others are generic eps0-LDP bounds whatever the randomizer)
MECHANISM_SPECIFIC = ("tight",)


@functools.lru_cache(maxsize=1)
def upper_bound_names() -> tuple:
    """Names of the upper bounds a release may be costed with (``get_bound`` resolves them)."""
    names = {b for b in BOUNDS if BOUNDS[b].kind == "upper"}
    for name in MECHANISM_SPECIFIC:
        try:
            if get_bound(name).kind == "upper":
                names.add(name)
        except ConfigError:
            pass                                  # not in this version
    return tuple(sorted(names))


def round_bound(name: str, local_mechanism: str = "", collision_c: int = 0,
                collision_l: int = 0, rr_kr: int = 0, rr_d: int = 0) -> AmplificationBound:
    """The bound ``name`` as it applies to one shuffled randomizer (one object per argument
    set: accountants cache by it). A bound in :data:`MECHANISM_SPECIFIC` takes its Collision
    form for a Collision randomizer whose (c, l) is known, its per-bit RR form ('bitrr') for
    an ``rr`` randomizer whose (kr, d) is known, else (and where that form does not cover the
    randomizer: Collision c > 1, rr kr > 1) its generic eps0-LDP form; every other bound is
    generic."""
    return _round_bound(str(name), str(local_mechanism), int(collision_c), int(collision_l),
                        int(rr_kr), int(rr_d))


@functools.lru_cache(maxsize=64)
def _round_bound(name: str, local_mechanism: str, collision_c: int, collision_l: int,
                 rr_kr: int, rr_d: int) -> AmplificationBound:
    if name in MECHANISM_SPECIFIC and local_mechanism == "collision" and collision_c > 0 \
            and collision_l > collision_c:
        try:
            return get_bound(name, "collision", c=int(collision_c), l=int(collision_l))
        except ConfigError:
            pass
    if name in MECHANISM_SPECIFIC and local_mechanism == "rr" and rr_kr > 0 and rr_d > 0:
        try:
            return get_bound(name, "bitrr", kr=int(rr_kr), d=int(rr_d))
        except ConfigError:
            pass                                  # kr > 1: not covered, the generic form
    if local_mechanism or collision_c or collision_l or rr_kr or rr_d:
        return _round_bound(name, "", 0, 0, 0, 0)   # the one generic object
    bound = get_bound(name)
    if bound.kind != "upper":
        raise ConfigError("bound", f"{name!r} is a lower bound and grants no budget",
                          f"use one of {list(upper_bound_names())}")
    return bound


def amplified_local_eps(target_eps: float, delta: float, n: int,
                        bound: str = "clones_numerical", mechanism: str = "generic",
                        **mech_params) -> float:
    """The local eps0 a single-message shuffle client may use for a central (eps, delta).

    ``n`` must be the number of distinct senders actually shuffled (after dropouts).
    Never below ``target_eps`` for the numerical upper bounds (shuffling never hurts).
    """
    b = get_bound(bound, mechanism, **mech_params)
    if b.kind != "upper":
        raise ConfigError("bound", f"{bound!r} is a lower bound and grants no budget",
                          "use 'clones_numerical' or 'variation_ratio'")
    return b.local_eps0(target_eps, n, delta)

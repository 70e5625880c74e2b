"""One monotone search for every calibration that is the same search.

Three calibrations look for the edge of a monotone predicate: the local eps0 an
amplification bound grants (largest eps0 whose central eps meets the target), the
sender floor a shuffler enforces (smallest n that still meets it), and the
multi-message flooding mean (smallest mu that meets it). :func:`monotone_edge`
does all three, and always answers on the safe side: a value the predicate accepts.
:func:`guided_edge` is the same search for a predicate that is the sign of a continuous
score (an amplification bound's central eps against its target): it probes where the score
crosses zero instead of at the middle, so a bound whose evaluation is costly is evaluated
a handful of times instead of ~25.
"""
from __future__ import annotations

import math
from typing import Callable


def monotone_edge(ok: Callable[[float], bool], lo: float, hi: float, *, want: str,
                  tol: float = 1e-6, relative: bool = False, integer: bool = False) -> float:
    """The edge of a monotone predicate on ``[lo, hi]``, returned on its accepted side.

    ``want="largest"``: ``ok`` holds up to an edge (true at ``lo``, false at ``hi``);
    returns the largest accepted value found. ``want="smallest"``: ``ok`` holds from an
    edge on (false at ``lo``, true at ``hi``); returns the smallest accepted value found.
    The search stops when the bracket is narrower than ``tol`` (times ``lo`` when
    ``relative``), or is one integer wide when ``integer``. The caller checks the
    preconditions at the ends (it knows what to say when they fail).
    """
    if want not in ("largest", "smallest"):
        raise ValueError(f"want must be 'largest' or 'smallest', got {want!r}")

    def narrow_enough(a, b):
        if integer:
            return b - a <= 1
        return b - a <= (tol * max(abs(a), 1e-12) if relative else tol)

    while not narrow_enough(lo, hi):
        mid = (lo + hi) // 2 if integer else 0.5 * (lo + hi)
        if ok(mid) == (want == "largest"):
            lo = mid
        else:
            hi = mid
    return lo if want == "largest" else hi


def guided_edge(score: Callable[[float], float], lo: float, hi: float, *, tol: float = 1e-6,
                relative: bool = False) -> float:
    """The largest accepted value of ``score(x) <= 0`` on ``[lo, hi]`` (``score``
    nondecreasing; ``score(lo) <= 0 < score(hi)``, which the caller checks).

    Like ``monotone_edge(lambda x: score(x) <= 0, lo, hi, want="largest")``, and answers on
    the same safe side (the returned value was evaluated and accepted), but each probe is
    where the straight line through the bracket's scores crosses zero (regula falsi with the
    Illinois step, so neither end stalls), at least half a tolerance inside the bracket; a
    non-finite score, or a bracket that did not halve in three probes, takes the middle.
    """
    def step_of(a):
        return tol * max(abs(a), 1e-12) if relative else tol

    f_lo, f_hi = score(lo), score(hi)
    side, widths = 0, [hi - lo]                # which end the last probe replaced; widths
    while hi - lo > step_of(lo):
        w, half = hi - lo, 0.5 * step_of(lo)
        stalled = len(widths) > 3 and w > 0.5 * widths[-4]
        if math.isfinite(f_lo) and math.isfinite(f_hi) and f_hi > f_lo and not stalled:
            x = lo + w * (-f_lo) / (f_hi - f_lo)
            x = min(max(x, lo + half), hi - half)
        else:
            x = lo + 0.5 * w
        f = score(x)
        if f <= 0:
            lo, f_lo = x, f
            if side == -1 and math.isfinite(f_hi):
                f_hi *= 0.5                    # Illinois: an end kept twice has its score halved
            side = -1
        else:
            hi, f_hi = x, f
            if side == 1 and math.isfinite(f_lo):
                f_lo *= 0.5
            side = 1
        widths.append(hi - lo)
    return lo

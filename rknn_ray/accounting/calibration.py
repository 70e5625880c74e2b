"""One monotone search for every calibration that is the same search.

Three calibrations look for the edge of a monotone predicate: the local eps0 an
amplification bound grants (largest eps0 whose central eps meets the target), the
sender floor a shuffler enforces (smallest n that still meets it), and the
multi-message flooding mean (smallest mu that meets it). :func:`monotone_edge`
does all three, and always answers on the safe side: a value the predicate accepts.
"""
from __future__ import annotations

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

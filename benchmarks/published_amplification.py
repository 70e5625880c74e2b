"""Amplification numbers the anchors publish, beside the project's bounds for the same setting.

Each row is a number read in a source (paper repository, file, commit below), never one
guessed: a central eps for a given eps0, or the eps0 a bound grants for a central target.
For each, :func:`compare` recomputes the project's bound of the same math where it has one
(it must match within the rounding the source allows), its tight bound and its lower bound
for the same randomizer (``rknn_ray.accounting.tight``), and checks consistency: a published
*upper* bound below our lower bound is unsound (an explicit neighbouring pair whose shuffled
output already needs more); an eps0 a published bound grants must keep our lower bound's eps
at or under the target.

Not here, and why: Su-Cheng-Wang (arXiv 2504.07414), Koskela-Heikkila-Honkela (arXiv
2106.00477) and Wang et al. (VLDB 2024, arXiv 2304.05007): their tables and figures were not
readable in the stored copies (only each paper's opening), and their public code
(wangsw/PrivacyAmplification, DPBayes/numerical-shuffler-experiments, the 2504.07414
repository) prints no reference values. Balle et al.'s Laplace rows: the project has no
Laplace randomizer.
"""
from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from rknn_ray.accounting import BOUNDS
from rknn_ray.accounting.tight import tight_bound

SOURCES = {
    "FMT21": "Feldman, McMillan, Talwar, Hiding Among the Clones (FOCS 2021, arXiv 2012.12803): "
             "apple/ml-shuffling-amplification README.md at 3fde4936 (output of example.py)",
    "BBGN19": "Balle, Bell, Gascon, Nissim, The Privacy Blanket of the Shuffle Model (CRYPTO 2019): "
              "BorjaBalle/amplification-by-shuffling, 'Bounds on Privacy Amplification by "
              "Shuffling.ipynb' at 1778a0dd (notebook last changed in 295c2b82, 2020-11-10)",
    "BBGN19-initial": "the same notebook at its initial release 89a50859 (2019-05-31), before "
                      "7994ad3 'Fixed typo in Bennett bounds' (2020-07-06)",
}

SUPERSEDED = "superseded"


@dataclass(frozen=True)
class PublishedRow:
    source: str                     # key of SOURCES
    label: str                      # the source's name of the bound
    mechanism: str                  # "generic" (any eps0-LDP) | "krr"
    n: int
    delta: float
    value: float                    # published eps (eps0 given) or eps0 (target_eps given)
    eps0: float | None = None
    target_eps: float | None = None
    k: int | None = None            # k-RR alphabet
    value_hi: float | None = None   # a bracket [value, value_hi] (a bisection's two ends)
    same_as: str = ""               # project bound computing the same math, if any
    status: str = "current"         # or SUPERSEDED (kept: the check must flag it)

    @property
    def quantity(self) -> str:
        return "eps" if self.eps0 is not None else "eps0"


_FMT = dict(source="FMT21", mechanism="generic", n=100_000, delta=1e-6, eps0=4.0)
# Balle et al.'s notebook: n = 5000, eps0 = 0.4, delta = 1e-6; calibration for eps = 0.005.
_B = dict(n=5000, delta=1e-6)
_E, _T = dict(eps0=0.4), dict(target_eps=0.005)
_GEN, _RR2, _RR100 = dict(mechanism="generic"), dict(mechanism="krr", k=2), dict(mechanism="krr", k=100)

ROWS: tuple[PublishedRow, ...] = (
    PublishedRow(label="numerical (clone), bisection bracket", value=0.1675385583317841,
                 value_hi=0.172790550755978, same_as="clones_numerical", **_FMT),
    PublishedRow(label="closed form", value=0.5378040242374512,
                 same_as="fmt_closed_form_final", **_FMT),
    # central eps at eps0 = 0.4
    PublishedRow("BBGN19", "EFMRTT'19", value=0.2523130449483328, **_GEN, **_B, **_E),
    PublishedRow("BBGN19", "Hoeffding, Generic", value=0.05746164784348143, **_GEN, **_B, **_E),
    PublishedRow("BBGN19", "Bennett, Generic", value=0.11301679081207759, **_GEN, **_B, **_E),
    PublishedRow("BBGN19", "Hoeffding, RR-2", value=0.02397882347116631, **_RR2, **_B, **_E),
    PublishedRow("BBGN19", "Bennett, RR-2", value=0.02428301504607527, **_RR2, **_B, **_E),
    PublishedRow("BBGN19", "Hoeffding, RR-100", value=0.026881289729458715, **_RR100, **_B, **_E),
    PublishedRow("BBGN19", "Bennett, RR-100", value=0.0035207898339832183, **_RR100, **_B, **_E),
    # eps0 granted for central eps = 0.005
    PublishedRow("BBGN19", "EFMRTT'19", value=0.00792666110628386, **_GEN, **_B, **_T),
    PublishedRow("BBGN19", "Hoeffding, Generic", value=0.04963572123548638, **_GEN, **_B, **_T),
    PublishedRow("BBGN19", "Bennett, Generic", value=0.005, **_GEN, **_B, **_T),
    PublishedRow("BBGN19", "Hoeffding, RR-2", value=0.09933108921716256, **_RR2, **_B, **_T),
    PublishedRow("BBGN19", "Bennett, RR-2", value=0.09839052251746179, **_RR2, **_B, **_T),
    PublishedRow("BBGN19", "Hoeffding, RR-100", value=0.0970004939783926, **_RR100, **_B, **_T),
    PublishedRow("BBGN19", "Bennett, RR-100", value=0.5191456848866671, **_RR100, **_B, **_T),
    # the Bennett rows before the typo fix (the Hoeffding rows did not change)
    PublishedRow("BBGN19-initial", "Bennett, Generic", value=0.07289999361525873,
                 status=SUPERSEDED, **_GEN, **_B, **_E),
    PublishedRow("BBGN19-initial", "Bennett, RR-2", value=0.016758539828689575,
                 status=SUPERSEDED, **_RR2, **_B, **_E),
    PublishedRow("BBGN19-initial", "Bennett, RR-100", value=0.0026771940444477024,
                 status=SUPERSEDED, **_RR100, **_B, **_E),
    PublishedRow("BBGN19-initial", "Bennett, RR-2", value=0.12960673355421864,
                 status=SUPERSEDED, **_RR2, **_B, **_T),
    PublishedRow("BBGN19-initial", "Bennett, RR-100", value=0.6523204278217724,
                 status=SUPERSEDED, **_RR100, **_B, **_T),
)

#: relative slack on the consistency and same-math checks (the sources print ~16 digits)
RTOL = 1e-9


@functools.lru_cache(maxsize=None)
def _bounds(mechanism: str, k: int | None):
    tight = tight_bound(mechanism, **({"k": k} if k else {}))
    return tight, tight.lower_bound()


@functools.lru_cache(maxsize=None)
def _ours(mechanism: str, k: int | None, quantity: str, x: float, n: int, delta: float):
    """(tight, lower) at one setting: eps at eps0 = x, or the eps0 each grants for eps = x
    (cached: several sources' rows share a setting)."""
    tight, lower = _bounds(mechanism, k)
    if quantity == "eps":
        return tight.central_eps(x, n, delta), lower.central_eps(x, n, delta)
    return tight.local_eps0(x, n, delta), lower.local_eps0(x, n, delta)


def compare_row(row: PublishedRow) -> dict:
    """The row, the project's numbers for it, the ratio published / tight and the checks."""
    out = {**asdict(row), "quantity": row.quantity, "citation": SOURCES[row.source]}
    hi = row.value_hi if row.value_hi is not None else row.value
    given = row.eps0 if row.quantity == "eps" else row.target_eps
    out["tight"], out["lower_bound"] = _ours(row.mechanism, row.k, row.quantity, given,
                                             row.n, row.delta)
    if row.quantity == "eps":
        # an upper bound is sound only if no neighbouring pair needs more
        out["consistent"] = hi >= out["lower_bound"] * (1 - RTOL)
    else:
        # eps of our lower bound's pair at the eps0 the source grants: must be <= the target
        lower = _bounds(row.mechanism, row.k)[1]
        out["lower_eps_at_published"] = lower.central_eps(row.value, row.n, row.delta)
        out["consistent"] = out["lower_eps_at_published"] <= row.target_eps * (1 + RTOL)
    out["ratio"] = hi / out["tight"]
    if row.same_as:
        ours = BOUNDS[row.same_as].central_eps(row.eps0, row.n, row.delta)
        out["ours_same_math"] = ours
        out["same_math_match"] = (row.value * (1 - RTOL) <= ours <= hi * (1 + RTOL))
    return out


def compare(rows=ROWS) -> list[dict]:
    return [compare_row(r) for r in rows]


def failures(results) -> list[dict]:
    """Current rows that are inconsistent or miss their same-math value (superseded rows are
    expected to fail and are reported, not counted)."""
    return [r for r in results if r["status"] != SUPERSEDED and
            (not r["consistent"] or r.get("same_math_match") is False)]


def _g(x) -> str:
    return "-" if x is None else f"{x:.6g}"


def format_markdown(results) -> str:
    lines = ["| source | bound (as published) | randomizer | n | delta | given | published | "
             "ours, same math | ours tight | ours lower | published / tight | consistent |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        mech = r["mechanism"] + (f" k={r['k']}" if r["k"] else "")
        given = f"eps0={r['eps0']:g}" if r["quantity"] == "eps" else f"eps={r['target_eps']:g}"
        pub = _g(r["value"]) + (f" - {_g(r['value_hi'])}" if r["value_hi"] is not None else "")
        same = "-"
        if "ours_same_math" in r:
            same = f"{_g(r['ours_same_math'])} ({r['same_as']}, {'match' if r['same_math_match'] else 'MISMATCH'})"
        ok = "yes" if r["consistent"] else "**no**"
        if r["status"] == SUPERSEDED:
            ok += " (superseded)"
        lines.append(f"| {r['source']} | {r['label']} | {mech} | {r['n']:g} | {r['delta']:g} | {given} | "
                     f"{r['quantity']} {pub} | {same} | {_g(r['tight'])} | {_g(r['lower_bound'])} | "
                     f"{r['ratio']:.3f} | {ok} |")
    lines += ["", "Sources:"] + [f"- {k}: {v}" for k, v in SOURCES.items()]
    lines += ["", "eps rows: published central eps at that eps0; consistent = published >= our lower "
              "bound. eps0 rows: the eps0 the bound grants for a central eps; ours tight / lower = "
              "the eps0 our tight bound grants / the largest eps0 our lower bound's pair allows; "
              "consistent = our lower bound's eps at the published eps0 <= the target."]
    return "\n".join(lines)

"""Amplification numbers the anchors publish, beside the project's bounds for the same setting.

Each row is a number read in a source (paper repository, file, commit below), never one
guessed: a central eps for a given eps0, or the eps0 a bound grants for a central target.
For each, :func:`compare` recomputes the project's bound of the same math where it has one
(it must match within the rounding the source allows), its tight bound and its lower bound
for the same randomizer (``rknn_ray.accounting.tight``), and checks consistency: a published
*upper* bound below our lower bound is unsound (an explicit neighbouring pair whose shuffled
output already needs more); an eps0 a published bound grants must keep our lower bound's eps
at or under the target.

Beyond the printed numbers (issue 50): Koskela et al.'s committed reference values (the
pickles their figure scripts plot), rows computed by this project with Su et al.'s and Wang
et al.'s released code (``origin`` "computed": the anchor's code, run here, not vendored),
composed rounds (``rounds``), delta-at-eps rows (quantity "delta") and rows whose claim is a
lower bound (``kind`` "lower": consistent when at or below our tight upper bound). A row of
status "unsound" is an upper bound an explicit data set's exact divergence exceeds: kept,
flagged, with that data set (``witness``). Balle et al.'s Laplace rows: the project has no
Laplace randomizer. Su et al.'s and Wang et al.'s papers' own tables were not readable in the
stored copies (issue 39 found only each paper's opening stored): only what their released code
computes is here, run by this project (the ``origin`` says so).
"""
from __future__ import annotations

import functools
import math
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
    "KHH-fig1": "Koskela, Heikkila, Honkela (arXiv 2106.00477), Fig. 1: "
                "DPBayes/numerical-shuffler-experiments clones_comparison_fig1/pickles/deltas_pld.p "
                "at 75068f33 (written by delta_shuffler_fa.py: the FMT clone reduction's PLD, "
                "n = 1e4, eps0 = 4, eps = linspace(0.1, 1, 60); list i = i+1 compositions)",
    "KHH-fig4": "Koskela, Heikkila, Honkela (arXiv 2106.00477), Fig. 4: "
                "DPBayes/numerical-shuffler-experiments blankets_fig4/pickles/"
                "eps_blanket_{weak,strong,feldman_fa}{1,4,16}.p at 75068f33 (4-RR, gamma = 0.25, "
                "i.e. eps0 = ln 13, n = 1000, delta = 10^linspace(-4, -7, 5); 1, 4, 16 "
                "compositions). Committed in 2945c04 (2023-03-03), before 9e8210f 'fix handling "
                "of corner cases, significant especially with small n and k' (2023-03-21) changed "
                "compute_epsilon_bin_weak_tight.py: the weak-adversary pickles predate that fix",
    "SCW25-code": "Su, Cheng, Wang (arXiv 2504.07414): computed by this project with their "
                  "released code, Optimal-amplification-bound/Decomposition-Based-Optimal-Bounds-"
                  "for-Shuffle-DP at d3b769d5 (amplification_bounds.py FFTbound.get_eps / "
                  "FFTLowerBound.get_eps on mechanisms.py RRMechanism(eps0, 10) / "
                  "RRMechanism_lowerbound(eps0, 10), BinaryLocalHashMechanism / "
                  "BLHMechanism_lowerbound, RapporMechanism (D >> 1) / RapporMechanism_lowerbound; "
                  "delta = 1e-6), run on CPU with numpy's FFT in place of CuPy's. Their eps is "
                  "the upper end of a 1e-5 bisection bracket, for the lower bound too; their FFT "
                  "path renormalises and clips the convolved pmf (no error bound)",
    "WANG24-code": "Wang et al., VLDB 2024 (arXiv 2304.05007): computed by this project with their "
                   "released code, wangsw/PrivacyAmplification unifiedamplification.py at 34ca048 "
                   "(amplificationUB(*computeUBParameters(eps0, 'krr', k), n, delta, T=20))",
}

SUPERSEDED = "superseded"
#: an upper bound that an explicit data set's exact divergence exceeds (kept and flagged)
UNSOUND = "unsound"
#: a row computed by this project with an anchor's released code (not printed by the anchor)
COMPUTED = "computed"


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
    status: str = "current"         # or SUPERSEDED / UNSOUND (kept: the check must flag it)
    l: int | None = None            # Collision (c = 1) Bloom length
    d: int | None = None            # per-bit RR (bitrr) report length
    rounds: int = 1                 # compositions of the shuffled round
    eps: float | None = None        # delta rows: the central eps the source gives delta at
    kind: str = "upper"             # the source's claim: "upper" or "lower" bound
    origin: str = "published"       # or COMPUTED (the anchor's released code, run here)
    witness: str = ""               # UNSOUND rows: the explicit data set that shows it
    note: str = ""

    @property
    def quantity(self) -> str:
        if self.eps is not None:
            return "delta"
        return "eps" if self.eps0 is not None else "eps0"


_FMT = dict(source="FMT21", mechanism="generic", n=100_000, delta=1e-6, eps0=4.0)
# Balle et al.'s notebook: n = 5000, eps0 = 0.4, delta = 1e-6; calibration for eps = 0.005.
_B = dict(n=5000, delta=1e-6)
_E, _T = dict(eps0=0.4), dict(target_eps=0.005)
_GEN, _RR2, _RR100 = dict(mechanism="generic"), dict(mechanism="krr", k=2), dict(mechanism="krr", k=100)

# Koskela et al. Fig. 1 (deltas_pld.p): delta at eps = linspace(0.1, 1, 60)[i], generic eps0-LDP
_K1 = dict(source="KHH-fig1", mechanism="generic", n=10_000, delta=0.0, eps0=4.0)
_KHH1 = ((1, 0, 0.1, 0.00920948955229734), (1, 20, 0.4050847457627119, 1.2621309363156461e-06),
         (4, 20, 0.4050847457627119, 0.002176207281254359),
         (4, 40, 0.7101694915254237, 1.8426229916197544e-05),
         (4, 59, 1.0, 3.314190123382294e-08))
# Koskela et al. Fig. 4: eps at delta = 10^linspace(-4, -7, 5), 4-RR, eps0 = ln 13, n = 1000
_FIG4_DELTAS = (1e-4, 1.778279410038923e-05, 3.162277660168379e-06, 5.62341325190349e-07, 1e-07)
_FIG4 = {
    ("weak", 1): (0.38951635360717773, 0.45746564865112305, 0.5191445350646973,
                  0.5761861801147461, 0.6296396255493164),
    ("weak", 4): (0.8431911468505859, 0.9698152542114258, 1.0845065116882324,
                  1.1901259422302246, 1.2885332107543945),
    ("weak", 16): (1.849687099456787, 2.091813087463379, 2.311873435974121,
                   2.5148391723632812, 2.7040958404541016),
    ("strong", 1): (0.547325611114502, 0.6415009498596191, 0.7288217544555664,
                    0.8112907409667969, 0.8902907371520996),
    ("strong", 4): (1.1746406555175781, 1.3437986373901367, 1.498091220855713,
                    1.64107084274292, 1.7750978469848633),
    ("strong", 16): (2.586662769317627, 2.907288074493408, 3.199589252471924,
                     3.4698843955993652, 3.7224888801574707),
    ("feldman_fa", 1): (0.42201614379882807, 0.48771972656249996, 0.5469238281249998,
                        0.6012695312499999, 0.6515625),
    ("feldman_fa", 4): (0.9934585571289065, 1.1171630859375004, 1.2291015625000004,
                        1.3320312500000004, 1.4281250000000005),
    ("feldman_fa", 16): (2.4905288696289056, 2.7271240234374985, 2.942138671874998,
                         3.140624999999997, 3.324999999999996),
}
_FIG4_LABEL = {"weak": "PLD, weak adversary A_w (pre-fix pickle)", "strong": "PLD, strong adversary A_s",
               "feldman_fa": "Feldman et al. 2023 Thm 5.1, via their PLD"}
_KHH_ROWS = tuple(
    PublishedRow(label=f"clone-reduction PLD, {r} composition(s)", value=v, eps=e, rounds=r,
                 note=f"eps index {i}", **_K1) for r, i, e, v in _KHH1) + tuple(
    PublishedRow("KHH-fig4", _FIG4_LABEL[who], mechanism="krr", k=4, n=1000, delta=dl,
                 eps0=math.log(13.0), value=_FIG4[who, r][j], rounds=r,
                 note="predates their weak-adversary fix (9e8210f)" if who == "weak" else "")
    for who in ("weak", "strong", "feldman_fa") for r in (1, 4, 16)
    for j, dl in enumerate(_FIG4_DELTAS) if who == "weak" or j in (0, 4))
# Su et al.'s released code, run by this project (delta = 1e-6): {(mechanism, n, eps0): (upper, lower)}
# (their FFT has n (N - 1) points, 2^25 at n = 1e4: 90-2619 s per bound on this 2-core machine,
# niced beside other work; every cell of the grid is filled: eps0 0.1 / 1 / 2, n = 1e3 / 1e4;
# the raw output with seconds per bound: benchmarks/results/su-code-n1e4.json)
_SU = {
    ("10-RR", 1000, 0.1): (0.004203768306015045, 0.004163043806925752),
    ("BLH", 1000, 0.1): (0.0068182811475476605, 0.006565789253194044),
    ("RAPPOR", 1000, 0.1): (0.0068182811475476605, 0.006565789253194044),
    ("10-RR", 1000, 1.0): (0.08110386878017241, 0.07978568699503702),
    ("BLH", 1000, 1.0): (0.10330482516140009, 0.08286805192118067),
    ("RAPPOR", 1000, 1.0): (0.10588172188422115, 0.09058883094840225),
    ("10-RR", 1000, 2.0): (0.27317896399688724, 0.27100458764266966),
    ("BLH", 1000, 2.0): (0.2764901195678712, 0.19745726113510134),
    ("RAPPOR", 1000, 2.0): (0.3039788143196106, 0.2577294477958679),
    ("10-RR", 10000, 0.1): (0.0012346443916957102, 0.001144597355805512),
    ("BLH", 10000, 0.1): (0.0019280065680502328, 0.0018289548285710154),
    ("RAPPOR", 10000, 0.1): (0.0019280065680502328, 0.0018289548285710154),
    ("10-RR", 10000, 1.0): (0.024054987741153833, 0.02265260964556127),
    ("BLH", 10000, 1.0): (0.03009873902622031, 0.023428544733985583),
    ("RAPPOR", 10000, 1.0): (0.031017047525364688, 0.025485840518890423),
    ("10-RR", 10000, 2.0): (0.0817577515109004, 0.07683668849246042),
    ("BLH", 10000, 2.0): (0.07961676954833238, 0.05489162337613804),
    ("RAPPOR", 10000, 2.0): (0.0882286298306023, 0.07485548130321837),
}
_SU_MECH = {"10-RR": dict(mechanism="krr", k=10), "BLH": dict(mechanism="collision", l=2),
            "RAPPOR": dict(mechanism="bitrr", d=20)}
_SU_ROWS = tuple(
    PublishedRow("SCW25-code", f"{m}: {'FFT upper (FFTbound)' if kind == 'upper' else 'FFT lower (FFTLowerBound)'}",
                 n=n, delta=1e-6, eps0=e0, value=v, kind=kind, origin=COMPUTED, **_SU_MECH[m])
    for (m, n, e0), vals in sorted(_SU.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0]))
    for kind, v in zip(("upper", "lower"), vals) if v is not None)
# Wang et al.'s released k-RR "upper bound" (n = 1000, delta = 1e-6): {(k, eps0): eps}
_WANG = {(10, 4.0): 1.5223884582519531, (10, 5.0): 3.4825944900512695, (10, 6.0): 4.950639724731445,
         (100, 4.0): 0.758697509765625, (100, 5.0): 1.6817522048950195, (100, 6.0): 3.0117759704589844}
_WITNESS = ("user 1 holds x vs x', the other n - 1 = 999 users all hold a third value: the exact "
            "divergence of the shuffled histogram (KRRThirdValueDelta) at the claimed eps is above "
            "delta (their number is that data set's x / x' counts alone)")
_WANG_ROWS = tuple(
    PublishedRow("WANG24-code", "variation-ratio numerical (amplificationUB)", mechanism="krr", k=k,
                 n=1000, delta=1e-6, eps0=e0, value=v, origin=COMPUTED, status=UNSOUND,
                 witness=_WITNESS) for (k, e0), v in _WANG.items())

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
) + _KHH_ROWS + _SU_ROWS + _WANG_ROWS

#: relative slack on the consistency and same-math checks (the sources print ~16 digits)
RTOL = 1e-9


def _params(mechanism: str, k: int | None, l: int | None, d: int | None) -> dict:
    return ({"k": k} if mechanism == "krr" else {"l": l, "c": 1} if mechanism == "collision"
            else {"kr": 1, "d": d} if mechanism == "bitrr" else {})


@functools.lru_cache(maxsize=None)
def _bounds(mechanism: str, k: int | None, l: int | None = None, d: int | None = None):
    tight = tight_bound(mechanism, **_params(mechanism, k, l, d))
    return tight, tight.lower_bound()


@functools.lru_cache(maxsize=None)
def _ours(mechanism: str, k: int | None, quantity: str, x: float, n: int, delta: float,
          l: int | None = None, d: int | None = None):
    """(tight, lower) at one setting: eps at eps0 = x, or the eps0 each grants for eps = x
    (cached: several sources' rows share a setting)."""
    tight, lower = _bounds(mechanism, k, l, d)
    if quantity == "eps":
        return tight.central_eps(x, n, delta), lower.central_eps(x, n, delta)
    return tight.local_eps0(x, n, delta), lower.local_eps0(x, n, delta)


def _lower_pairs(mechanism: str, k: int | None, eps0: float, n: int) -> list:
    """Explicit data sets' exact delta(eps) (estimate, up, down) objects: the pairs of the
    tight bound's lower bound (generic: binary RR and the 3-/4-RR pairs; k-RR: its own)."""
    from rknn_ray.accounting.bounds import _RRCountDelta, _pair_delta
    from rknn_ray.accounting.shuffled_rr import KRRThirdValueDelta, exp_lo, krr_pair
    p = exp_lo(eps0)        # at most e^eps0: the lower bound's side
    pairs = [_RRCountDelta(p, n)] if mechanism == "generic" else []
    for kk in ([3, 4] if mechanism == "generic" else [k]):
        a = 1.0 / (p + kk - 1.0)
        pairs += [krr_pair(eps0, n, kk), _pair_delta(p, a, 1.0 - (p + 1.0) * a, a, n)]
        if mechanism == "krr" and KRRThirdValueDelta.terms(eps0, n, kk) <= 300_000:
            pairs.append(KRRThirdValueDelta.shared(eps0, n, kk))
    return pairs


@functools.lru_cache(maxsize=None)
def _plds(mechanism: str, k: int | None, eps0: float, n: int):
    """(pessimistic PLD of the tight bound's dominating pair, optimistic PLD of an explicit
    data set's pair: binary RR / k-RR with the others on x'): one round each, to compose."""
    from rknn_ray.accounting.shuffle_pld import (histogram_lower_pair, pld_from_pair,
                                                 round_pld, rr_lower_pair)
    from rknn_ray.accounting.shuffled_rr import exp_lo
    tight, _ = _bounds(mechanism, k)
    if mechanism == "generic":
        lp, lq = rr_lower_pair(eps0, n)
    else:
        p = exp_lo(eps0)    # at most e^eps0: the lower bound's side
        a = 1.0 / (p + k - 1.0)
        lp, lq = histogram_lower_pair(p, n, a, p * a)
    return round_pld(tight, eps0, n), pld_from_pair(lp, lq, pessimistic=False)


@functools.lru_cache(maxsize=None)
def _composed(mechanism: str, k: int | None, eps0: float, n: int, rounds: int, what: str,
              x: float):
    """(tight, lower) of ``rounds`` compositions: eps at delta = x ("eps"), delta at eps = x."""
    up, low = (p.self_compose(rounds) if rounds > 1 else p for p in _plds(mechanism, k, eps0, n))
    if what == "eps":
        return float(up.get_epsilon_for_delta(x)), float(low.get_epsilon_for_delta(x))
    return float(up.get_delta_for_epsilon(x)), float(low.get_delta_for_epsilon(x))


def _delta_at(row: PublishedRow):
    """(tight delta, lower delta) at the row's eps: one round exactly (upper + err / lower -
    err), composed rounds by the PLDs of :func:`_plds`."""
    if row.rounds > 1:
        return _composed(row.mechanism, row.k, row.eps0, row.n, row.rounds, "delta", row.eps)
    tight, _ = _bounds(row.mechanism, row.k, row.l, row.d)
    est, up, _ = tight.pair_delta(row.eps0, row.n).delta(row.eps)
    low = max(pd.delta(row.eps)[0] - pd.delta(row.eps)[2]
              for pd in _lower_pairs(row.mechanism, row.k, row.eps0, row.n))
    return est + up, max(low, 0.0)


def compare_row(row: PublishedRow) -> dict:
    """The row, the project's numbers for it, the ratio published / tight and the checks."""
    out = {**asdict(row), "quantity": row.quantity, "citation": SOURCES[row.source]}
    hi = row.value_hi if row.value_hi is not None else row.value
    q = row.quantity
    if q == "delta":
        out["tight"], out["lower_bound"] = _delta_at(row)
    elif row.rounds > 1:
        out["tight"], out["lower_bound"] = _composed(row.mechanism, row.k, row.eps0, row.n,
                                                     row.rounds, "eps", row.delta)
    else:
        given = row.eps0 if q == "eps" else row.target_eps
        out["tight"], out["lower_bound"] = _ours(row.mechanism, row.k, q, given, row.n,
                                                 row.delta, row.l, row.d)
    if q == "eps0":
        # eps of our lower bound's pair at the eps0 the source grants: must be <= the target
        lower = _bounds(row.mechanism, row.k, row.l, row.d)[1]
        out["lower_eps_at_published"] = lower.central_eps(row.value, row.n, row.delta)
        out["consistent"] = out["lower_eps_at_published"] <= row.target_eps * (1 + RTOL)
    elif row.kind == "lower":
        # a lower bound is sound only if no upper bound is below it
        out["consistent"] = row.value <= out["tight"] * (1 + RTOL)
    else:
        # an upper bound is sound only if no neighbouring pair needs more
        out["consistent"] = hi >= out["lower_bound"] * (1 - RTOL)
    out["ratio"] = hi / out["tight"] if out["tight"] else float("inf")
    if row.same_as:
        ours = BOUNDS[row.same_as].central_eps(row.eps0, row.n, row.delta)
        out["ours_same_math"] = ours
        out["same_math_match"] = (row.value * (1 - RTOL) <= ours <= hi * (1 + RTOL))
    if row.status == UNSOUND and row.mechanism == "krr" and q == "eps":
        from rknn_ray.accounting.shuffled_rr import KRRThirdValueDelta
        est, _, down = KRRThirdValueDelta.shared(row.eps0, row.n, row.k).delta(row.value)
        out["witness_delta"] = est - down     # certified: > delta shows the claim unsound
    return out


def compare(rows=ROWS) -> list[dict]:
    return [compare_row(r) for r in rows]


def failures(results) -> list[dict]:
    """Current rows that are inconsistent or miss their same-math value (superseded rows are
    expected to fail and are reported, not counted)."""
    return [r for r in results if r["status"] not in (SUPERSEDED, UNSOUND) and
            (not r["consistent"] or r.get("same_math_match") is False)]


def _g(x) -> str:
    return "-" if x is None else f"{x:.6g}"


def format_markdown(results) -> str:
    lines = ["| source | bound (as published) | randomizer | n | delta | given | published | "
             "ours, same math | ours tight | ours lower | published / tight | consistent |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        mech = r["mechanism"] + "".join(f" {key}={r[key]}" for key in ("k", "l", "d")
                                        if r.get(key))
        if r.get("rounds", 1) > 1:
            mech += f", {r['rounds']} rounds"
        q = r["quantity"]
        given = (f"eps0={r['eps0']:.6g}" if q == "eps" else f"eps={r['target_eps']:g}" if q == "eps0"
                 else f"eps0={r['eps0']:g}, eps={r['eps']:.6g}")
        pub = _g(r["value"]) + (f" - {_g(r['value_hi'])}" if r["value_hi"] is not None else "")
        if r.get("kind", "upper") == "lower":
            pub += " (lower bound)"
        if r.get("origin") == COMPUTED:
            pub += " (computed here with their code)"
        same = "-"
        if "ours_same_math" in r:
            same = f"{_g(r['ours_same_math'])} ({r['same_as']}, {'match' if r['same_math_match'] else 'MISMATCH'})"
        ok = "yes" if r["consistent"] else "**no**"
        if r["status"] == SUPERSEDED:
            ok += " (superseded)"
        if r["status"] == UNSOUND:
            ok += f" (unsound: certified delta {r.get('witness_delta', float('nan')):.3g} > " \
                  f"{r['delta']:g} on the data set below)"
        if r.get("note"):
            ok += f"; {r['note']}"
        delta = "-" if q == "delta" else f"{r['delta']:.4g}"
        lines.append(f"| {r['source']} | {r['label']} | {mech} | {r['n']:g} | {delta} | {given} | "
                     f"{q} {pub} | {same} | {_g(r['tight'])} | {_g(r['lower_bound'])} | "
                     f"{r['ratio']:.3f} | {ok} |")
    lines += ["", "Sources:"] + [f"- {k}: {v}" for k, v in SOURCES.items()]
    witnesses = sorted({r["witness"] for r in results if r.get("witness")})
    if witnesses:
        lines += ["", "Unsound rows, the explicit data set:"] + [f"- {w}" for w in witnesses]
    lines += ["", "eps rows: published central eps at that eps0; consistent = published >= our lower "
              "bound (for a published *lower* bound: <= our tight bound). delta rows: the published "
              "delta at that eps, against our tight / lower delta there. Rows with rounds: ours are the "
              "composed PLDs of the tight bound's dominating pair (pessimistic) and of an explicit data "
              "set's pair (optimistic; binary RR / k-RR with the others on x'). eps0 rows: the eps0 "
              "the bound grants for a central eps; ours tight / lower = the eps0 our tight bound "
              "grants / the largest eps0 our lower bound's pair allows; consistent = our lower "
              "bound's eps at the published eps0 <= the target."]
    return "\n".join(lines)

"""Calibration of the multi-message shuffle histogram protocol (negative-binomial shares).

Protocol (Ghazi, Kumar, Manurangsi, Pagh, Sinha, "Differentially Private Aggregation in
the Shuffle Model: Almost Central Accuracy in Almost a Single Message", ICML 2021,
arXiv 2109.13158, correlated-noise protocol; its counting predecessor Ghazi, Kumar,
Manurangsi, Pagh, "Private Counting from Anonymous Messages", ICML 2020, cited by
paper 000), applied per cell of the d = s*|Y| BSVS vector.  Every message is a pair
(cell j, sign +-1); each of n clients sends

* its true messages: (j, +1) for each of the k*r cells each of its records votes into;
* Z+_j, Z-_j ~ NB(1/n, p) messages (j, +1) and (j, -1), for every cell j.  Negative
  binomials are infinitely divisible: the n shares of one cell sum to NB(1, p) =
  Geometric, so sum(+) - sum(-) is exactly discrete Laplace DLap(p) (P[z] prop. p^|z|);
* F_j *flooding pairs* {(j, +1), (j, -1)} for every cell j, which cancel in the
  estimate and hide where the geometric noise starts: NB(r/n, q) pairs per client, so
  the cell's total is F ~ NB(r, q) with mean mu = r q/(1-q) (``flood_shape`` r), or
  Poisson(mu/n) per client (``flood_shape`` 0, the r -> infinity limit; the protocol
  as first written).

The server estimates cell j by N+_j - N-_j = x_j + DLap(p): unbiased, variance
2p/(1-p)^2, i.e. the error of the central discrete Laplace mechanism.

Privacy (our derivation, exact; the cited theorem states the protocol's (eps, delta)
asymptotically, and we compute the constants rather than copy them).  Per cell the
view is (N+, N-) = (x + G+ + F, G- + F), G+- ~ Geometric, F the flooding.  With
Phi(u) = sum_{f <= u} P[F=f] p^-2f, the likelihood ratio of x vs x+1 is p on {N- <= N+ - x - 1} and p Phi(u)/Phi(u-1) on
{N- >= N+ - x = u}, so the shift x -> x+1 is exactly the discrete pair

    P(u) = (1-p) p^{2u} Phi(u),  Q(u) = (1-p) p^{2u-1} Phi(u-1),  u = 0, 1, ...
    P(low) = 1 - sum P,           Q(low) = 1 - sum Q = P(low) / p.

Replacing one record changes at most k*r cells by +1 and k*r by -1 (L1 = 2kr); the
cells are independent, so the PLD of a neighbouring pair is the composition of
ceil(L1/2) copies of (P, Q) and as many of (Q, P).  ``dp_accounting`` composes them
(pessimistic discretisation: an upper bound) and reads off eps at delta.  Only the
honest clients' noise is counted; it needs all ``n`` shares, so calibrate with the
minimum number of clients that will send (extra senders only add noise).

Why negative-binomial flooding. The flooding pays for the lower edge
of G+ + F: on the half of the outcomes where the DLap difference sits below x, the view
also shifts W = Geometric(p^2) + F by one, so W must itself be shift-private with the
eps left over from the DLap. A Poisson's log-pmf slope changes by ~1/sqrt(mu) per
standard deviation, so it needs mu ~ 2 ln(1/delta)/eps2^2 pairs; an over-dispersed
NB(r, q) (a Gamma-like shape, log-slope ~ (r-1)/f - (1-q)) flattens that and needs
1.8x (eps 2) to 5.9x (eps 0.5) fewer messages at r = 8 to 32, 3.2x at eps 1 (the
measured table in docs/results.md, "multi-message noise messages per cell"). Each calibration tries Poisson and r in ``FLOOD_SHAPES`` and keeps
the smallest mean; every candidate is costed by the same exact PLD.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache

import numpy as np

# scipy and dp_accounting are imported in the functions that use them: an opener or a
# client shard unpickles mechanisms that refer to this module and never calls them
# (eager imports would cost each such process seconds of CPU before its first report)

from rknn_ray.accounting.calibration import monotone_edge
from rknn_ray.errors import ConfigError

PLD_DISCRETIZATION = 1e-3
_TAIL = 1e-16
POISSON = 0.0                          # flood_shape meaning Poisson flooding (r -> infinity)
FLOOD_SHAPES = (POISSON, 32.0, 16.0, 8.0)   # integers: a client's share r B/m stays rational


@dataclass(frozen=True)
class MultiMessageCalibration:
    """Public parameters of one round of the multi-message protocol."""
    eps: float                 # central eps achieved (<= target)
    delta: float
    n: int                     # clients whose shares are counted
    sensitivity_l1: int        # 2 k r
    num_cells: int             # d = s |Y|
    dlap_p: float              # DLap parameter p of the summed noise per cell
    nb_shape: float            # per-client NB shape 1/n  (for numpy: negative_binomial(nb_shape, 1-dlap_p))
    nb_success_prob: float     # 1 - p (numpy's success probability)
    flood_mean_total: float    # mu: mean flooding pairs per cell, all clients together
    flood_mean_per_client: float   # mu / n: mean pairs per cell per client
    noise_messages_per_client: float   # expected noise + flooding messages per client
    true_messages_per_record: int      # k r
    error_variance: float      # 2p/(1-p)^2 per cell (= DLap)
    laplace_equivalent_scale: float    # sqrt(var/2): the Laplace scale with this variance
    flood_shape: float = POISSON       # r of the NB(r, q) flooding per cell; 0: Poisson(mu)
    dlap_share: float = 0.85           # the DLap's share of the per-cell eps (step 1 below)

    def to_dict(self) -> dict:
        return asdict(self)


def flood_nb_q(mu: float, shape: float) -> float:
    """q of NB(shape, q) flooding with mean mu (P[f] prop. C(f+shape-1, f) q^f)."""
    return mu / (mu + shape)


def flood_log_pmf(f: np.ndarray, mu: float, shape: float) -> np.ndarray:
    """log P[F = f] of one cell's total flooding: Poisson(mu) (shape 0) or NB mean mu."""
    from scipy import stats  # defers scipy
    if shape == POISSON:
        return stats.poisson.logpmf(f, mu)
    return stats.nbinom.logpmf(f, shape, 1.0 - flood_nb_q(mu, shape))


def _flood_upper(mu: float, shape: float) -> float:
    """A u with P[F > u] <= _TAIL (scipy's isf, or a Chernoff-safe fallback where it fails)."""
    from scipy import stats  # defers scipy
    if shape == POISSON:
        u = stats.poisson.isf(_TAIL, mu)
        fallback = mu + 12 * math.sqrt(mu) + 60
    else:
        u = stats.nbinom.isf(_TAIL, shape, 1.0 - flood_nb_q(mu, shape))
        fallback = (mu + shape) * 40 + 60
    return float(u) if np.isfinite(u) else fallback


def _pmfs(p: float, mu: float, shape: float = POISSON) -> tuple[dict, dict]:
    """log-pmfs of the per-cell pair (P, Q) on outcomes {'low', 0, 1, ...}."""
    # P(u) = (1-p) sum_{f<=u} P[F=f] p^{2(u-f)}: the law of F + Geometric(p^2) (times
    # 1/(1+p)), so the grid covers F's upper tail plus the geometric's.
    g_hi = math.log(_TAIL) / math.log(p) if p > 0 else 0.0
    u_max = int(_flood_upper(mu, shape) + g_hi + 10)
    u = np.arange(0, u_max + 1)
    # log Phi by a running logsumexp of log-terms: no closed form needed, and nothing
    # underflows in the far left tail, where the mass sits when mu is large.
    log_phi = np.logaddexp.accumulate(flood_log_pmf(u, mu, shape) - 2 * u * math.log(p))
    lp = math.log1p(-p) + 2 * u * math.log(p) + log_phi
    lq = np.full(u.shape, -np.inf)
    lq[1:] = math.log1p(-p) + (2 * u[1:] - 1) * math.log(p) + log_phi[:-1]
    sp, sq = float(np.exp(lp).sum()), float(np.exp(lq[1:]).sum())
    # the same dicts as {int(k): float(v) for k, v in zip(u, lp) if v > -745}, built from
    # lists (a Python loop over numpy scalars cost seconds per calibration at large mu)
    P = dict(zip(u[lp > -745].tolist(), lp[lp > -745].tolist()))
    Q = dict(zip(u[lq > -745].tolist(), lq[lq > -745].tolist()))
    # Exact identity Q(low) = P(low) / p: a truncated grid breaks it, and a silently
    # truncated grid would put the missing mass on 'low' and understate eps.
    if not math.isclose(1.0 - sq, (1.0 - sp) / p, rel_tol=1e-6, abs_tol=1e-12):
        raise ArithmeticError(f"multi-message pmf grid lost mass (p={p}, mu={mu}, "
                              f"shape={shape}); this is a bug: please report it")
    P["low"] = math.log(max(1e-300, 1.0 - sp))
    Q["low"] = math.log(max(1e-300, 1.0 - sq))
    return P, Q


def protocol_pld(p: float, mu: float, sensitivity_l1: int, flood_shape: float = POISSON,
                 discretization: float = PLD_DISCRETIZATION):
    """The PLD of a neighbouring pair of the protocol with DLap parameter p and flood mean mu
    (flooding NB with shape ``flood_shape``, or Poisson for 0): ceil(L1/2) copies of the
    per-cell pair (P, Q) composed with as many of (Q, P), pessimistic discretisation at
    ``discretization`` (an upper bound). The calibration reads eps off it; the pld
    accountant composes it with the other rounds (the interval must match theirs). Not
    cached here: a calibration's bisection builds many it never needs again."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # defers dp_accounting
    P, Q = _pmfs(p, mu, float(flood_shape))
    half = int(math.ceil(sensitivity_l1 / 2))
    # dp_accounting's truncation bounds take a logsumexp whose maximum can be infinite:
    # numpy warns "overflow encountered in divide" and the infinity is then handled. The
    # value is right; the warning is only noise on the user's console.
    with np.errstate(over="ignore"):
        up = _pld_of_pair(pld_lib, P, Q, discretization)
        down = _pld_of_pair(pld_lib, Q, P, discretization)
        return up.self_compose(half).compose(down.self_compose(half))


def _pld_of_pair(pld_lib, lower: dict, upper: dict, interval: float):
    """``pld_lib.from_two_probability_mass_functions(lower, upper, value_discretization_interval=
    interval)`` (pessimistic, symmetric, no truncation), the same object to the bit, with its
    per-outcome Python loops (seconds per calibration at large flood means: 1e5 outcomes
    per pair) done in arrays: the same float losses, math.exp masses added per exact loss
    and then per key ceil(loss / interval), each in the library's order (bincount adds
    sequentially), keys in first-seen order."""
    inf = -math.inf
    lo_v = np.fromiter(lower.values(), dtype=float, count=len(lower))
    if np.any(lo_v == inf):
        return pld_lib.from_two_probability_mass_functions(
            lower, upper, value_discretization_interval=interval)
    infinity_mass = 0
    only_upper = upper.keys() - lower.keys()
    for o in (upper if len(only_upper) > 1 else only_upper):   # the library's order
        if o in only_upper:
            infinity_mass += math.exp(upper[o])
    up_v = np.fromiter(map(upper.get, lower, [inf] * len(lower)), dtype=float, count=len(lower))
    kept = up_v > inf
    if not kept.all():                      # the library adds exp(-inf) = 0.0 there
        infinity_mass += 0.0
    vals = up_v[kept] - lo_v[kept]
    if vals.size == 0:
        return pld_lib.from_two_probability_mass_functions(
            lower, upper, value_discretization_interval=interval)
    mass = np.fromiter(map(math.exp, up_v[kept].tolist()), dtype=float, count=vals.size)
    # per exact loss, in outcome order; the losses in first-seen order
    uniq, first, inv = np.unique(vals, return_index=True, return_inverse=True)
    per_loss = np.bincount(inv.reshape(-1), weights=mass, minlength=uniq.size)
    seen = np.argsort(first, kind="stable")
    keys = np.ceil(uniq[seen] / interval).astype(np.int64)     # math.ceil's integers
    k0 = int(keys.min())
    sums = np.bincount(keys - k0, weights=per_loss[seen])
    kuniq, kfirst = np.unique(keys, return_index=True)
    order = kuniq[np.argsort(kfirst, kind="stable")]
    # a dict, not the library's defaultdict: its pmf only iterates it and reads its keys
    rounded = dict(zip(order.tolist(), sums[order - k0].tolist()))
    return pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        rounded, infinity_mass, interval, True)


@lru_cache(maxsize=256)
def protocol_eps(p: float, mu: float, sensitivity_l1: int, delta: float,
                 flood_shape: float = POISSON) -> float:
    """Central eps at ``delta`` of the protocol with DLap parameter p and flood mean mu
    (flooding NB with shape ``flood_shape``, or Poisson for 0): :func:`protocol_pld`'s."""
    with np.errstate(over="ignore"):
        return float(protocol_pld(p, mu, sensitivity_l1, float(flood_shape))
                     .get_epsilon_for_delta(delta))


def dlap_limit_eps(p: float, sensitivity_l1: int, delta: float) -> float:
    """eps of the central DLap alone (the mu -> infinity limit of the protocol)."""
    from dp_accounting.pld import privacy_loss_distribution as pld_lib  # defers dp_accounting
    half = int(math.ceil(sensitivity_l1 / 2))
    one = pld_lib.from_discrete_laplace_mechanism(-math.log(p), sensitivity=1,
                                                  value_discretization_interval=PLD_DISCRETIZATION)
    return float(one.self_compose(2 * half).get_epsilon_for_delta(delta))


def smallest_flood_mean(p: float, shape: float, sensitivity_l1: int, eps: float,
                        delta: float) -> float | None:
    """Smallest flood mean mu (to 2%) whose protocol meets (eps, delta), by bisection on
    log mu (eps decreases in mu); None when even 1e9 pairs per cell do not."""
    def ok(mu):
        return protocol_eps(p, mu, sensitivity_l1, delta, shape) <= eps
    lo, hi = math.log(1.0), math.log(max(10.0, 50 * math.log(2 / delta) / (1 - p) ** 2))
    while not ok(math.exp(hi)):
        hi += math.log(4.0)
        if hi > math.log(1e9):
            return None
    return math.exp(monotone_edge(lambda log_mu: ok(math.exp(log_mu)), lo, hi,
                                  want="smallest", tol=0.02))


@lru_cache(maxsize=64)
def calibrate_multi_message(eps: float, delta: float, n: int, sensitivity_l1: int,
                            num_cells: int, dlap_share: float = 0.85,
                            flood_shapes: tuple = FLOOD_SHAPES) -> MultiMessageCalibration:
    """Parameters of the NB-share + flooding protocol meeting central (eps, delta).

    1. The DLap parameter p is set so the noise *alone* (mu = infinity) would spend
       eps at delta if its per-cell eps were 1/``dlap_share`` larger: the remaining
       headroom pays for finite flooding.
    2. For each flooding law in ``flood_shapes`` (Poisson, NB(r)) the smallest mean mu
       (to 2%) that meets (eps, delta) exactly; the law with the smallest mu is kept:
       the fewest noise messages for the same guarantee and the same DLap error.
    The shuffle mechanism samples, per client and cell, NB(nb_shape, nb_success_prob)
    positive and negative noise messages and NB(flood_shape/n, q) (or
    Poisson(flood_mean_per_client)) flooding pairs.
    """
    from scipy import optimize  # defers scipy
    for key, ok in (("eps", 0 < eps < 50), ("delta", 0 < delta < 1), ("n", n >= 1),
                    ("sensitivity_l1", sensitivity_l1 >= 1), ("num_cells", num_cells >= 1),
                    ("dlap_share", 0 < dlap_share < 1),
                    ("flood_shapes", len(flood_shapes) > 0
                     and all(r == POISSON or r > 0 for r in flood_shapes))):
        if not ok:
            raise ConfigError(f"multi_message.{key}", f"{key} out of range",
                              "use eps in (0,50), delta in (0,1), n>=1, L1>=1, d>=1, "
                              "0<dlap_share<1, flood shapes 0 (Poisson) or > 0")
    # largest per-cell eps1 (p = e^-eps1) whose pure-noise limit meets (eps, delta/2)
    f = lambda e1: dlap_limit_eps(math.exp(-e1), sensitivity_l1, delta / 2) - eps  # noqa: E731
    e1_max = optimize.brentq(f, 1e-4 * eps / sensitivity_l1, 4.0 * eps, xtol=1e-6)
    p = math.exp(-dlap_share * e1_max)
    found = [(mu, float(r)) for r in flood_shapes
             if (mu := smallest_flood_mean(p, float(r), sensitivity_l1, eps, delta)) is not None]
    if not found:
        raise ConfigError("multi_message.eps", f"cannot reach eps={eps} at delta={delta} "
                          "with flooding up to 1e9 pairs per cell",
                          "raise eps or delta, or lower dlap_share")
    mu, shape = min(found)
    achieved = protocol_eps(p, mu, sensitivity_l1, delta, shape)
    if not achieved <= eps:          # the bisection answers on the accepted side
        raise ArithmeticError(f"multi-message calibration missed eps={eps} ({achieved}); "
                              "this is a bug: please report it")
    mean_nb = p / (1 - p)
    noise_msgs = num_cells * (2 * mean_nb + 2 * mu) / n
    var = 2 * p / (1 - p) ** 2
    return MultiMessageCalibration(
        eps=achieved, delta=delta, n=int(n), sensitivity_l1=int(sensitivity_l1),
        num_cells=int(num_cells), dlap_p=p, nb_shape=1.0 / n, nb_success_prob=1.0 - p,
        flood_mean_total=mu, flood_mean_per_client=mu / n,
        noise_messages_per_client=noise_msgs,
        true_messages_per_record=int(math.ceil(sensitivity_l1 / 2)),
        error_variance=var, laplace_equivalent_scale=math.sqrt(var / 2),
        flood_shape=shape, dlap_share=float(dlap_share))

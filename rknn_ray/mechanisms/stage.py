"""The mechanism stage read from a run config: the one place a mechanism is built from a
config (:func:`mechanism_for`, calibrated by :func:`mechanism_params`), and what its
calibration says before a release (a count's noise, the multi-message cap on s, the DLap
shares left free). Public parameters only."""
from __future__ import annotations

import dataclasses
import math

from rknn_ray.mechanisms import build
from rknn_ray.mechanisms.base import Mechanism, MechanismParams
from rknn_ray.mechanisms.shuffle_multi import AUTO_DLAP_SHARES


def mechanism_params(cfg, data: "PreparedData", eps: float | None = None,
                     num_clients: int | None = None, delta: float | None = None) -> MechanismParams:
    """The mechanism's parameters from the config and the data's public counts (clients,
    classes, the record bound); ``eps``/``delta``/``num_clients`` a round's or a what-if's."""
    p = cfg.privacy
    options = {"noise": p.noise, "multi_record": p.multi_record,
               "bound": p.amplification_bound, **(p.options or {})}
    if p.honest_fraction is not None:          # else the mechanism's default (shuffle only)
        options["honest_fraction"] = p.honest_fraction
    return MechanismParams(num_queries=cfg.queries.s, num_classes=data.num_classes,
                           k=cfg.rknn.k, r=cfg.rknn.r,
                           eps=float(p.eps if eps is None else eps),
                           delta=float(p.delta if delta is None else delta),
                           num_clients=int(num_clients or data.num_clients),
                           max_records_per_client=data.max_records_per_client, options=options)


def mechanism_for(cfg, data: "PreparedData", *, eps: float | None = None,
                  delta: float | None = None, num_queries: int | None = None,
                  k: int | None = None, model: str | None = None,
                  name: str | None = None, eps0: float | None = None) -> Mechanism:
    """The one place a mechanism is built from a config: ``privacy.model``/``mechanism``
    (or ``model``/``name``) calibrated by :func:`mechanism_params`; ``eps``/``delta`` a
    round's share, ``num_queries`` a round's s, ``k`` a what-if (public parameters only);
    ``eps0``: a single-message shuffle round's local eps, chosen by a rounds plan
    (rknn_ray.mechanisms.composed_rounds) instead of calibrated for ``eps``."""
    params = mechanism_params(cfg, data, eps=eps, delta=delta)
    if eps0 is not None:
        params = dataclasses.replace(params, local_eps0=float(eps0))
    changes = {key: int(v) for key, v in (("num_queries", num_queries), ("k", k)) if v is not None}
    if changes:
        params = dataclasses.replace(params, **changes)
    return build(model or cfg.privacy.model, name or cfg.privacy.mechanism, params)


def noise_std_per_count(cfg, data: "PreparedData", k: int = 1, s: int | None = None,
                        eps: float | None = None) -> float:
    """Standard deviation of the mechanism's error on one count, from its error bound:
    the bound at beta = 1/2 read as a Laplace union bound over |Y| cells,
    eta = b*ln(2|Y|), gives the equivalent scale b and std sqrt(2)*b. Public parameters only."""
    mech = mechanism_for(cfg, data, eps=eps, k=k, num_queries=s or len(data.splits.public_y))
    variances = getattr(mech, "_class_variances", None)
    if variances is not None:       # a local randomizer: its exact per-report variances
        return _local_count_std(mech, variances(), data, k, s)
    eta = float(mech.error_bound(0.5, data.num_clients))
    return math.sqrt(2.0) * eta / math.log(2 * data.num_classes)


def _local_count_std(mech, V: dict, data, k: int, s: int | None) -> float:
    """The std of one count of a local randomizer's estimate (RR, Collision, ..., also at a
    shuffle model's eps0) from its exact per-report variances: a cell holding a query's
    mu = n*k*r/s votes, the other n - mu reports adding the non-member variance, plus the
    sampling of one record where clients hold several. The error *bound* (Theorem 2 for
    Collision, l in its numerator) reads as a std many times this one: it made auto s fall
    to |Y| on Fashion-MNIST, where s = 100 labels 20 points better (docs/results.md)."""
    n = max(1, int(data.num_clients))
    queries = int(s or len(data.splits.public_y))
    mu = min(n, n * k * mech.params.r / max(1, queries))
    member, other = (V[1], V[0]) if 1 in V else (V[1, 1], V[0, 0])
    var = mu * member + (n - mu) * other
    if not mech.takes_fractional_input and data.max_records_per_client > 1:
        var += mu                       # which record a client sampled (at most S per cell)
    return math.sqrt(var)


def message_cap(cfg, data: "PreparedData") -> tuple[int, str] | None:
    """(the expected messages a client may send, the key that sets it), or None: the smaller
    of ``shuffle.max_messages_per_client`` and ``shuffle.max_messages_per_record`` times the
    public record bound, so a holder of many records has the budget of as many one-record
    clients (public parameters only)."""
    sh, bound = cfg.shuffle, data.max_records_per_client
    caps = []
    if sh.max_messages_per_record is not None:
        caps.append((int(sh.max_messages_per_record) * bound,
                     f"shuffle.max_messages_per_record = {sh.max_messages_per_record}"
                     + (f" x {bound} records" if bound > 1 else "")))
    if sh.max_messages_per_client is not None:
        caps.append((int(sh.max_messages_per_client),
                      f"shuffle.max_messages_per_client = {sh.max_messages_per_client}"))
    return min(caps) if caps else None


def multi_message_s_cap(cfg, data: "PreparedData", k: int = 1) -> tuple[int, str] | None:
    """The largest s whose multi-message round costs a client at most :func:`message_cap`
    expected messages (its k*r*R real ones per kept record plus noise and flooding
    messages, which grow linearly in the s*|Y| cells), or None when the mechanism is not
    multi-message or no cap is set. Public parameters only."""
    capped = message_cap(cfg, data)
    if cfg.privacy.model != "shuffle" or cfg.privacy.mechanism != "multi" or capped is None:
        return None
    cap, why = capped
    mech = mechanism_for(cfg, data, k=k, num_queries=1)
    per_cell = mech.cal.noise_messages_per_client / mech.cal.num_cells
    real = mech.cal.true_messages_per_record * data.max_records_per_client
    s_cap = max(1, int((cap - real) // (per_cell * data.num_classes)))
    return s_cap, (f"{why}: {real} real + "
                   f"{per_cell:.4g} noise messages per cell x s x {data.num_classes} classes")


def free_dlap_shares(cfg) -> tuple[float, ...]:
    """The DLap shares :func:`rknn_ray.job.stages.resolve_auto` chooses from, or () where the
    share is not free: another mechanism, s fixed, no message cap, or
    ``privacy.options.dlap_share`` set.

    Under the cap a smaller share means fewer flooding messages per cell, so more queries
    for the same messages per client; query count is what bounds the labels there (on
    Fashion-MNIST at eps = 1 the release at the capped s is as accurate as the exact counts,
    docs/results.md), so the share that allows the most queries is chosen."""
    p = cfg.privacy
    if (p.model != "shuffle" or p.mechanism != "multi" or cfg.queries.s != "auto"
            or (cfg.shuffle.max_messages_per_client is None
                and cfg.shuffle.max_messages_per_record is None)
            or "dlap_share" in (p.options or {})):
        return ()
    return AUTO_DLAP_SHARES

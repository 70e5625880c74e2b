"""Rounds calibrated together: a T-round job under the PLD accountant.

With ``privacy.accountant: pld`` the ledger charges T rounds the composition of their
privacy loss distributions, which at the job's delta can be well below the sum of the
rounds' own eps. Splitting eps into T shares and calibrating each round for its share then
leaves budget unused. Here the rounds are calibrated *jointly*: round t runs at x times its
``rounds.budget_split`` share eps_t (an even split gives every round the same noise), with
the largest x whose composed cost of the T planned rounds' events, by the pld accountant at
the ledger's delta, stays within the job's eps. What "x times the share" means is the
model's (:data:`JOINT_MODELS`):

* single-message shuffle (``rr``, ``collision``): the local eps0 = x * eps_t (PLD of the
  amplification bound's dominating pair, rknn_ray.accounting.shuffle_pld);
* central (``laplace``, discrete or continuous) with delta > 0: the noise scale
  2kr / (x * eps_t) (exact Laplace PLDs). The composition of T pure eps_t rounds stays near
  T * eps_t until T is large (at delta = 1e-6 it gains nothing measurable for T <= 10 and
  ~15% less noise at T = 20); then the plan is the basic split. With delta = 0 the pld
  composition of pure-DP rounds is exactly their sum, so there is nothing to gain and the
  rounds keep the basic split.
* multi-message shuffle (``multi``): the protocol calibrated for x * eps_t at delta_t (its
  DLap parameter and flooding mean, rknn_ray.accounting.multi_message), composed by the
  protocol's exact PLD with its message cap's failure mass charged at the composed eps
  (``accountants.cap_failure_mass``). The round's own target, as for central, is the eps
  it is calibrated for (its event costs at most that); its sender floor does not depend
  on eps.

The local model's rounds are pure eps-LDP on the same records: nothing to gain.

The events are the mechanisms' own (built at that scale, for the planned senders), so the
plan is costed exactly as the ledger will cost the rounds; the ledger still checks the
composition before every round, and each round is recorded at the cost of the event it
actually released (the reports actually opened).

A round's own target (what the shuffler's sender floor and the short-round refusal compare
to) is the cost of its planned event: a round that opens fewer reports than planned costs
more than that and is refused for labelling at its true cost (rknn_ray.job.session), as in
a single-round job. Neighbour relation and unit are those of the mechanism (record level,
replace-one); only the split of the budget over the rounds changes.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

from rknn_ray.accounting.accountants import Composition, event_cost
from rknn_ray.accounting.calibration import guided_edge
from rknn_ray.labeling.stage import round_budgets
from rknn_ray.mechanisms.stage import mechanism_for, mechanism_params

#: relative width of the final bracket on x (the composed eps lands just below the target)
RTOL = 2e-3
#: no round's eps0 above this (the bounds' tables and pairs are built for eps0 <= ~20)
EPS0_CAP = 16.0

_PLANS: dict = {}


@dataclass(frozen=True)
class RoundShare:
    """One round's part of the job's budget: its own target (eps, delta), and the local
    eps0 the plan chose for it (None: the mechanism calibrates eps0 for ``eps``, or has
    none); ``together``: the share comes from a joint plan, not the basic split."""
    eps: float
    delta: float
    eps0: float | None = None
    together: bool = False


@dataclass(frozen=True)
class JointModel:
    """How one model's rounds scale in a joint plan.

    ``at_scale(cfg, data, eps_t, delta_t, x)``: the round's mechanism at x times its share
    (one query: the cost does not depend on s); ``cap(eps_t, target_eps)``: the largest x
    worth trying; ``share(mechanism, eps_t, delta_t, cost)``: the round's
    :class:`RoundShare` given its planned event's cost, or None where the plan gains
    nothing over the share (then the whole plan is the basic split)."""
    at_scale: Callable
    cap: Callable
    share: Callable


def _shuffled_at(cfg, data, e, d, x):
    """A single-message shuffle round at local eps0 = x eps_t (its target: eps0 itself)."""
    return mechanism_for(cfg, data, eps=x * e, delta=d, num_queries=1, eps0=x * e)


def _shuffled_share(m, e, d, cost):
    # no amplification at this eps0, or less than the round's share: the basic split
    # (each round calibrated for its share) grants at least as much
    if not e <= cost < m.local_eps:
        return None
    return RoundShare(float(cost), float(d), float(m.local_eps), True)


def _eps_at(cfg, data, e, d, x):
    """A round calibrated for x times its share (central: noise scale 2kr / (x eps_t))."""
    return mechanism_for(cfg, data, eps=x * e, delta=d, num_queries=1)


def _calibrated_share(m, e, d, cost):
    # the round's target is the eps its noise (central: its scale, rounded up; multi-message:
    # its DLap and flooding) is calibrated for: its event costs at most that; a plan below
    # the share gains nothing
    if not e < cost <= m.params.eps:
        return None
    return RoundShare(float(m.params.eps), float(d), None, True)


#: the (model, mechanism) pairs whose rounds are calibrated together (module docstring)
JOINT_MODELS = {
    ("shuffle", "rr"): JointModel(_shuffled_at, lambda e, target: EPS0_CAP / e, _shuffled_share),
    ("shuffle", "collision"): JointModel(_shuffled_at, lambda e, target: EPS0_CAP / e,
                                         _shuffled_share),
    ("central", "laplace"): JointModel(_eps_at, lambda e, target: target / e, _calibrated_share),
    ("shuffle", "multi"): JointModel(_eps_at, lambda e, target: target / e, _calibrated_share),
}
#: models whose joint plan is only measured (benchmarks.composed_rounds --plan), not run
MEASURED_MODELS: dict = {}


def composes_jointly(cfg) -> bool:
    """Whether the rounds are calibrated together: pld accountant, more than one round, a
    model of :data:`JOINT_MODELS`, and for the central model a delta > 0 (pure-DP rounds
    compose to exactly their sum). Elsewhere each round is calibrated for its share."""
    p = cfg.privacy
    if p.accountant != "pld" or int(cfg.rounds.count) <= 1:
        return False
    if (p.model, p.mechanism) not in JOINT_MODELS:
        return False
    return p.model != "central" or ledger_budget(cfg)[1] > 0


def ledger_budget(cfg) -> tuple[float, float]:
    """The (eps, delta) a job's ledger enforces: privacy.eps and delta, or the smaller
    privacy.budget_* (rknn_ray.job.rounds.job_ledger)."""
    p = cfg.privacy
    eps = p.eps if p.budget_eps is None else min(p.budget_eps, p.eps)
    delta = p.delta if p.budget_delta is None else min(p.budget_delta, p.delta)
    return float(eps), float(delta)


def round_shares(cfg, data) -> list[RoundShare]:
    """Each round's share: the basic split (``rounds.budget_split``), or with
    :func:`composes_jointly` the jointly calibrated plan (computed once per process)."""
    p = cfg.privacy
    budgets = round_budgets(p.eps, p.delta, int(cfg.rounds.count), cfg.rounds.budget_split)
    if not composes_jointly(cfg):
        return [RoundShare(e, d) for e, d in budgets]
    params = dataclasses.replace(mechanism_params(cfg, data), num_queries=1)
    key = (repr(params), p.model, p.mechanism, tuple(budgets), ledger_budget(cfg))
    if key not in _PLANS:
        _PLANS[key] = joint_shares(cfg, data, budgets, *ledger_budget(cfg))
    return list(_PLANS[key])


def planned_event(mechanism):
    """The round's event if every client's report is opened (``mechanism.event()``
    without its refusal check, which costs the event by the bound once more)."""
    n = int(mechanism.params.num_clients)
    return mechanism.round_event(n, n)


def joint_scale(cfg, data, budgets: list[tuple[float, float]], target_eps: float,
                target_delta: float, rtol: float = RTOL, model: JointModel | None = None):
    """(x, the rounds' mechanisms at x): the largest x (to ``rtol``) whose pld composition of
    the rounds at x times their share fits ``target_eps`` at ``target_delta``, searched from
    x = 1 (each round at its share: their sum fits; the ledger reports the smaller of the
    two). x = 1 where no larger x fits. ``model``: the scaling (default the config's, from
    :data:`JOINT_MODELS`; benchmarks pass another to measure a model not planned jointly)."""
    p = cfg.privacy
    model = model or {**MEASURED_MODELS, **JOINT_MODELS}[(p.model, p.mechanism)]
    memo: dict = {}

    def planned(x: float) -> list:
        """The rounds' mechanisms at x times their share."""
        if x not in memo:
            memo[x] = [model.at_scale(cfg, data, e, d, x) for e, d in budgets]
        return memo[x]

    scores: dict = {}

    def score(x: float) -> float:
        """log(composed eps / target): <= 0 where the T rounds fit. The PLD composition
        alone (multi-message cap failures included): the ledger reports it, or the basic
        sum where that is smaller."""
        if x not in scores:
            eps = Composition("pld").extend((planned_event(m), m.costing())
                                            for m in planned(x)).pld_eps(target_delta)
            scores[x] = (math.log(max(eps, 1e-300)) - math.log(target_eps)
                         if math.isfinite(eps) else math.inf)
        return scores[x]

    cap = min(model.cap(e, target_eps) for e, _ in budgets)
    if cap <= 1.0:
        return 1.0, planned(1.0)
    # x = 1 fits by the basic sum; up from x = 2 to a rejected x, each probe where the line
    # through the last two accepted (log x, score) crosses a little above zero (1.25x to 4x
    # further): the score is smooth, so this brackets the edge in two or three PLDs
    lo, hi, prev = 1.0, min(2.0, cap), None
    while score(hi) <= 0 and hi < cap:
        step = 2.0 * hi
        if prev is not None and score(hi) > score(prev):
            a, b = math.log(prev), math.log(hi)
            step = math.exp(b + (0.02 - score(hi)) * (b - a) / (score(hi) - score(prev)))
        prev = lo = hi
        hi = min(max(step, 1.25 * hi), 4.0 * hi, cap)
    x = hi if score(hi) <= 0 else guided_edge(score, lo, hi, tol=rtol, relative=True)
    return x, planned(x)


def joint_shares(cfg, data, budgets: list[tuple[float, float]], target_eps: float,
                 target_delta: float, rtol: float = RTOL) -> list[RoundShare]:
    """The rounds at :func:`joint_scale`'s x, each round's own target its planned event's
    cost; the basic split where the rounds gain nothing from being calibrated together
    (x within ``rtol`` of 1, or a round the model's ``share`` refuses)."""
    p = cfg.privacy
    model = JOINT_MODELS[(p.model, p.mechanism)]
    basic = [RoundShare(e, d) for e, d in budgets]
    x, mechs = joint_scale(cfg, data, budgets, target_eps, target_delta, rtol, model)
    if x <= 1.0 + rtol:
        return basic
    shares = []
    for m, (e, d) in zip(mechs, budgets):
        share = model.share(m, e, d, event_cost(planned_event(m), m.costing())[0])
        if share is None:
            return basic
        shares.append(share)
    return shares


def reservation_after(cfg, data, t: int) -> tuple[float, float] | None:
    """What a job's reservation in the budget store keeps once round ``t`` is committed, where
    the rounds are calibrated together (None elsewhere: the reservation less the release).

    The rounds' own eps add up to more than the job's eps there, so "the reservation less
    this round" would undercount the rounds still to come while they run: instead the
    reservation keeps the pld composition of the later planned rounds at their share of
    delta, an (eps, delta) that they satisfy together (the store composes it as such).
    Every model of :data:`JOINT_MODELS` alike: the later rounds' mechanisms are rebuilt from
    their shares, as the job builds them."""
    if not composes_jointly(cfg):
        return None
    later = round_shares(cfg, data)[t + 1:]
    if not later:
        return 0.0, 0.0
    mechs = [mechanism_for(cfg, data, eps=s.eps, delta=s.delta, num_queries=1, eps0=s.eps0)
             for s in later]
    eps, delta = Composition("pld").extend((planned_event(m), m.costing()) for m in mechs).result(
        sum(s.delta for s in later))
    return float(eps), float(delta)

"""Rounds calibrated together: a T-round single-message shuffle job under the PLD accountant.

With ``privacy.accountant: pld`` the ledger charges T shuffled rounds the composition of
their privacy loss distributions (rknn_ray.accounting.shuffle_pld), which at the job's
delta is well below the sum of the rounds' own eps. Splitting eps into T shares and
calibrating each round's local eps0 for its share therefore leaves budget unused. Here the
rounds are calibrated *jointly*: round t runs at eps0_t = x * eps_t (eps_t its
``rounds.budget_split`` share, so an even split gives every round the same eps0), with the
largest x whose composed cost of the T planned rounds' events, by the pld accountant at the
ledger's delta, stays within the job's eps. The events are the mechanisms' own (built at
that eps0, for the planned senders), so the plan is costed exactly as the ledger will cost
the rounds; the ledger still checks the composition before every round, and each round is
recorded at the cost of the event it actually released (the reports actually opened).

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

from rknn_ray.accounting.accountants import Composition, event_cost, event_pld
from rknn_ray.accounting.calibration import guided_edge
from rknn_ray.labeling.stage import round_budgets
from rknn_ray.mechanisms.stage import mechanism_for, mechanism_params

#: the single-message shuffle mechanisms (one eps0 per report; ShuffledLocalDpEvent)
JOINT_MECHANISMS = ("rr", "collision")
#: relative width of the final bracket on x (the composed eps lands just below the target)
RTOL = 2e-3
#: no round's eps0 above this (the bounds' tables and pairs are built for eps0 <= ~20)
EPS0_CAP = 16.0

_PLANS: dict = {}


@dataclass(frozen=True)
class RoundShare:
    """One round's part of the job's budget: its own target (eps, delta), and the local
    eps0 the plan chose for it (None: the mechanism calibrates eps0 for ``eps``)."""
    eps: float
    delta: float
    eps0: float | None = None


def composes_jointly(cfg) -> bool:
    """Whether the rounds are calibrated together: pld accountant, single-message shuffle,
    more than one round. Elsewhere each round is calibrated for its share of the budget."""
    p = cfg.privacy
    return (p.accountant == "pld" and p.model == "shuffle" and p.mechanism in JOINT_MECHANISMS
            and int(cfg.rounds.count) > 1)


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
    key = (repr(params), p.mechanism, tuple(budgets), ledger_budget(cfg))
    if key not in _PLANS:
        _PLANS[key] = joint_shares(cfg, data, budgets, *ledger_budget(cfg))
    return list(_PLANS[key])


def planned_event(mechanism):
    """The round's event if every client's report is opened (``mechanism.event()``
    without its refusal check, which costs the event by the bound once more)."""
    n = int(mechanism.params.num_clients)
    return mechanism.round_event(n, n)


def joint_shares(cfg, data, budgets: list[tuple[float, float]], target_eps: float,
                 target_delta: float, rtol: float = RTOL) -> list[RoundShare]:
    """The largest x (to ``rtol``) with the pld composition of rounds at eps0_t = x * eps_t
    within ``target_eps`` at ``target_delta`` (x >= 1: at x = 1 each round's eps0 is its
    share, so even the sum of their costs fits; the ledger reports the smaller of the two).
    The basic split where the rounds gain nothing from being calibrated together."""
    memo: dict = {}

    def planned(x: float) -> list:
        """The rounds' mechanisms at eps0_t = x * eps_t (their target: eps0 itself, never
        below the cost of their event)."""
        if x not in memo:
            memo[x] = [mechanism_for(cfg, data, eps=x * e, delta=d, num_queries=1, eps0=x * e)
                       for e, d in budgets]
        return memo[x]

    scores: dict = {}

    def score(x: float) -> float:
        """log(composed eps / target): <= 0 where the T rounds fit. The PLD composition
        alone: the ledger reports it, or the basic sum where that is smaller."""
        if x not in scores:
            composed = None
            for m in planned(x):
                pld = event_pld((planned_event(m), m.costing()))
                composed = pld if composed is None else composed.compose(pld)
            eps = float(composed.get_epsilon_for_delta(target_delta))
            scores[x] = (math.log(max(eps, 1e-300)) - math.log(target_eps)
                         if math.isfinite(eps) else math.inf)
        return scores[x]

    basic = [RoundShare(e, d) for e, d in budgets]
    cap = EPS0_CAP / max(e for e, _ in budgets)
    if cap <= 1.0:
        return basic
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
    shares = []
    for m, (e, d) in zip(planned(x), budgets):
        eps_t = event_cost(planned_event(m), m.costing())[0]
        # no amplification at this eps0, or less than the round's share: the basic split
        # (each round calibrated for its share) grants at least as much
        if not e <= eps_t < m.local_eps:
            return basic
        shares.append(RoundShare(float(eps_t), float(d), float(m.local_eps)))
    return shares


def reservation_after(cfg, data, t: int) -> tuple[float, float] | None:
    """What a job's reservation in the budget store keeps once round ``t`` is committed, where
    the rounds are calibrated together (None elsewhere: the reservation less the release).

    The rounds' own eps add up to more than the job's eps there, so "the reservation less
    this round" would undercount the rounds still to come while they run: instead the
    reservation keeps the pld composition of the later planned rounds at their share of
    delta, an (eps, delta) that they satisfy together (the store composes it as such)."""
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

"""Single-message shuffle model: a local randomizer at an amplified eps0.

Each client sends one report of a local randomizer (randomized response or the
Collision mechanism) run at ``eps0``; a shuffler hides who sent what, and the
anonymized multiset is (eps, delta)-DP at the *record* level (replace-one) for
``n`` distinct senders by privacy amplification by shuffling (paper 000,
"Single-message Shuffling"; the bound is chosen by ``options['bound']``, see
rknn_ray.accounting).

Who counts as cover (docs/threat-model.md, "Corrupt clients"). Amplification
(Feldman-McMillan-Talwar; Balle et al., "The Privacy Blanket") is a statement about
n reports each produced by the local randomizer; a report the adversary chose or
knows hides nobody (remove it from the multiset and what is left is the shuffle of
the honest reports). So n is the number of senders *assumed honest*:
``ceil(honest_fraction * authenticated senders)``, never more than the reports the
server actually opened (a garbage report that fails to open hides nobody; when fewer
open than that, more senders are visibly corrupt than assumed and n falls to
``ceil(honest_fraction * opened)``). ``privacy.honest_fraction`` defaults to 1.0
here: every opened report is assumed to come from its client's randomizer, the
model of the amplification theorems. Whatever the others do, an honest record keeps
its own eps0-LDP, so the cost of a round is never above (eps0, 0).

Calibration: ``eps0`` is the largest local eps for which the bound gives the
central target at ``ceil(honest_fraction * expected senders)``; a job whose rounds are
calibrated together (rknn_ray.mechanisms.composed_rounds) gives each round its eps0
(``MechanismParams.local_eps0``) and, as its target, that eps0's own cost. Because
amplification shrinks with n, the shuffler is told ``min_senders()``, the
smallest number of authenticated senders at which that eps0 still meets the
target, and refuses to release below it (nothing opened, nothing spent). After the
server has opened the reports, ``round_event(senders, opened)`` is the round's true
release, costed from the reports opened; a round that misses the target there is recorded at
that cost and refused for labelling (rknn_ray.job.session).
"""
from __future__ import annotations

import functools
import math
from dataclasses import replace

from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import MechanismParams, honest_count, honest_fraction_of
from rknn_ray.mechanisms.collision import CollisionMechanism, collision_l
from rknn_ray.mechanisms.randomized_response import RandomizedResponse
from rknn_ray.accounting.bound_choice import round_bound, upper_bound_names
from rknn_ray.accounting.calibration import monotone_edge
from rknn_ray.accounting.calibration_cache import cached_local_eps0


@functools.lru_cache(maxsize=128)
def _calibrated_eps0(bound, eps: float, n: int, delta: float,
                     guess: float | None = None) -> float:
    """The bound's largest eps0 for (eps, delta) at n, once per process: a job builds the
    same round's mechanism several times (auto s, the dropout check, the round itself), and
    a calibration is a dozen evaluations of the bound (``guess``: the eps0 of the form
    calibrated just before, where the search starts). Across processes and runs from the
    on-disk cache, each entry checked by one evaluation before use
    (rknn_ray.accounting.calibration_cache)."""
    return cached_local_eps0(bound, eps, n, delta, guess=guess, code=(__file__,))


class ShuffleSingleMixin:
    """Turns a local randomizer class into its single-message shuffle version."""

    model = "shuffle"

    def _init_shuffle(self, params: MechanismParams) -> None:
        if not 0 < params.delta < 1:
            raise ConfigError("privacy.delta", f"the shuffle model needs 0 < delta < 1, got "
                              f"{params.delta}", "set privacy.delta, e.g. 1e-6")
        self.bound_name = params.options.get("bound", "clones_numerical")
        if self.bound_name not in upper_bound_names():
            raise ConfigError("privacy.amplification_bound", f"{self.bound_name!r} is not an "
                              "upper bound", f"use one of {list(upper_bound_names())}")
        self.honest_fraction = honest_fraction_of(params, self.name)
        n = honest_count(self.honest_fraction, params.num_clients)     # the cover it plans for
        fixed = params.local_eps0
        self.planned_eps0 = fixed is not None
        if fixed is not None:                 # set by a rounds plan (composed_rounds.py)
            self._eps0 = float(fixed)
            self.randomizer_params = self._randomizer_params(params, self._eps0)
            self.bound = round_bound(self.bound_name, self.name, **self.randomizer_params)
            return
        try:
            # the generic form first; a randomizer-specific form of the bound (bounds.
            # round_bound) may depend on eps0 (Collision's l): recalibrate with the form
            # at the last eps0 until it stays put, then keep that form (and its l)
            self.randomizer_params = {}
            self.bound = round_bound(self.bound_name)
            self._eps0 = _calibrated_eps0(self.bound, params.eps, n, params.delta)
            generic = self.bound
            for _ in range(2):                # at most two calibrations with the specific form
                rp = self._randomizer_params(params, self._eps0)
                bound = round_bound(self.bound_name, self.name, **rp)
                if bound is generic or rp == self.randomizer_params:
                    break                     # no specific form, or eps0 is calibrated with it
                self.randomizer_params, self.bound = rp, bound
                self._eps0 = _calibrated_eps0(bound, params.eps, n, params.delta, self._eps0)
        except (ValueError, ConfigError) as exc:
            raise ConfigError("privacy.eps", f"no local eps0 reaches the central target "
                              f"eps={params.eps}, delta={params.delta} with n={n} senders "
                              f"assumed honest ({exc})", "raise privacy.eps, privacy.delta or "
                              "privacy.honest_fraction, or use more clients") from exc

    def _randomizer_params(self, params: MechanismParams, eps0: float) -> dict:
        """What a randomizer-specific bound needs of this randomizer at ``eps0`` (the event's
        ``collision_c`` / ``collision_l``, ``rr_kr`` / ``rr_d``); none for a generic eps0-LDP
        report."""
        return {}

    @property
    def local_eps(self) -> float:
        return self._eps0

    def central_eps(self, n: int) -> float:
        """Central eps the bound gives for this eps0 and n shuffled senders.

        Memoized per n: eps0, delta and the bound are fixed at calibration, and every round
        asks again (floor, describe, guarantee, cost: each a numerical bound evaluation).
        """
        if n < 2:
            return math.inf
        cache = self.__dict__.setdefault("_central_eps_memo", {})
        if int(n) not in cache:
            try:
                cache[int(n)] = float(self.bound.central_eps(self._eps0, int(n), self.params.delta))
            except (ValueError, ConfigError):
                cache[int(n)] = math.inf
        return cache[int(n)]

    def min_cover(self) -> int:
        """Smallest number of honest reports whose amplified eps meets the target."""
        if "_min_cover_memo" in self.__dict__:      # a function of the calibration alone
            return self._min_cover_memo
        target, hi = self.params.eps, honest_count(self.honest_fraction, self.params.num_clients)
        if self.central_eps(hi) > target * (1 + 1e-9):
            raise PrivacyBudgetError(f"eps0={self._eps0:.4g} misses the target at n={hi}")
        ok = lambda n: self.central_eps(n) <= target * (1 + 1e-9)  # noqa: E731
        # eps0 is calibrated to meet the target at hi, so the edge is a few senders below
        # it: gallop down to bracket it (a few evaluations of the bound), then bisect
        top, step, lo = hi, 1, 1
        while top - step > 1:
            if not ok(top - step):
                lo = top - step
                break
            top, step = top - step, 2 * step
        self._min_cover_memo = int(monotone_edge(ok, lo, top, want="smallest", integer=True))
        return self._min_cover_memo

    def min_senders(self) -> int:
        """Smallest number of authenticated senders whose assumed-honest share meets the target."""
        need, gamma = self.min_cover(), self.honest_fraction
        a = max(need, int((need - 1) / gamma))
        while honest_count(gamma, a) < need:
            a += 1
        return a

    def cover(self, senders: int, opened: int | None = None) -> int:
        """Reports the amplification counts: the senders assumed honest, at most those opened."""
        assumed = honest_count(self.honest_fraction, senders)
        if opened is None or int(opened) >= assumed:
            return assumed
        return honest_count(self.honest_fraction, opened)

    def costing(self):
        """The accountant's choice of amplification bound: the one eps0 was calibrated with."""
        from rknn_ray.accounting.accountants import Costing  # defers dp_accounting
        return Costing(bound=self.bound_name)

    def _cost(self, event) -> tuple[float, float]:
        """The accountant's (eps, delta) of ``event`` (never above the local eps0 alone)."""
        # defers dp_accounting and scipy: processes that only unpickle a mechanism never cost it
        from rknn_ray.accounting.accountants import event_cost
        return event_cost(event, self.costing())

    def guarantee_facts(self, event, n: int | None = None, opened: int | None = None) -> dict:
        senders = int(self.params.num_clients) if n is None else int(n)
        seen = "" if opened is None else f", {int(opened)} reports opened"
        return {**super().guarantee_facts(event, n, opened), "n": int(event.num_senders),
                "note": f"single message: {self.base_name} at local eps0={self._eps0:.4g}, "
                        f"amplified by shuffling the reports of {event.num_senders} senders "
                        f"assumed honest (honest fraction {self.honest_fraction:g} of {senders} "
                        f"authenticated senders{seen}; {self.bound_name} bound)"
                        + ("" if self._cost(event)[1] > 0 else
                           "; too few for amplification: the local eps0 alone")}

    def _event(self, senders: int, opened: int | None):
        from rknn_ray.accounting.events import ShuffledLocalDpEvent  # defers dp_accounting
        # local_mechanism: the randomizer's registry name, as in LocalRandomizerDpEvent;
        # num_senders: the reports the amplification counts (assumed honest, opened); the
        # bound is the accountant's choice (costing()), not part of what happened
        return ShuffledLocalDpEvent(self.name, float(self._eps0), self.cover(senders, opened),
                                    float(self.params.delta), float(self.honest_fraction),
                                    int(senders if opened is None else opened),
                                    **self._event_params())

    def _event_params(self) -> dict:
        """The randomizer's public parameters a randomizer-specific bound costs it by."""
        return {}

    def event(self, n: int | None = None):
        """The release for ``n`` authenticated senders (refused below the target)."""
        n = int(self.params.num_clients) if n is None else int(n)
        event = self._event(n, None)
        eps = self._cost(event)[0]
        if eps > self.params.eps * (1 + 1e-9):
            raise PrivacyBudgetError(
                f"only {n} distinct senders were shuffled ({event.num_senders} assumed honest); "
                f"eps0={self._eps0:.4g} then gives eps={eps:.4g} > target {self.params.eps}. "
                "Round refused, nothing released; wait for more clients or lower the target's "
                "demands")
        return event

    def round_event(self, senders: int, opened: int):
        """The round's true event (never refused; see module docstring)."""
        return self._event(int(senders), int(opened))

    def describe(self) -> dict:
        return {**super().describe(), "eps0": self._eps0, "bound": self.bound_name,
                "eps0_from": ("the rounds plan (calibrated together for their pld composition)"
                              if getattr(self, "planned_eps0", False) else "this round's target"),
                "min_senders": self.min_senders(), "honest_fraction": self.honest_fraction}


class ShuffleRR(ShuffleSingleMixin, RandomizedResponse):
    name, base_name = "rr", "randomized response"

    def __init__(self, params: MechanismParams):
        self._init_shuffle(params)            # eps0 first: the base calibrates from it
        RandomizedResponse.__init__(self, params)

    def _randomizer_params(self, params: MechanismParams, eps0: float) -> dict:
        # per-bit RR on d = s*|Y| cells with kr ones: tight's 'bitrr' form covers kr = 1
        # (round_bound falls back to the generic form for kr > 1)
        return {"rr_kr": int(params.k * params.r), "rr_d": int(params.num_cells)}

    def _event_params(self) -> dict:
        return self._randomizer_params(self.params, self._eps0)


class ShuffleCollision(ShuffleSingleMixin, CollisionMechanism):
    name, base_name = "collision", "Collision"

    def __init__(self, params: MechanismParams):
        self._init_shuffle(params)
        l = self.randomizer_params.get("collision_l")
        if l is not None and not params.options.get("collision_l"):
            # the l the bound was calibrated for (the variance-optimal l at an earlier eps0)
            params = replace(params, options={**params.options, "collision_l": int(l)})
        CollisionMechanism.__init__(self, params)

    def _randomizer_params(self, params: MechanismParams, eps0: float) -> dict:
        c = params.k * params.r
        return {"collision_c": int(c),
                "collision_l": int(params.options.get("collision_l") or collision_l(eps0, c))}

    def _event_params(self) -> dict:
        return {"collision_c": int(self.oracle.c), "collision_l": int(self.l)}


register("shuffle", "rr")(ShuffleRR)
register("shuffle", "collision")(ShuffleCollision)

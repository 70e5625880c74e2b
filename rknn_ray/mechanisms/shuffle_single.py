"""Single-message shuffle model: a local randomizer at an amplified eps0.

Each client sends one report of a local randomizer (randomized response or the
Collision mechanism) run at ``eps0``; a shuffler hides who sent what, and the
anonymized multiset is (eps, delta)-DP at the *record* level (replace-one) for
``n`` distinct senders by privacy amplification by shuffling (paper 000,
"Single-message Shuffling"; the bound is chosen by ``options['bound']``, see
rknn_ray.accounting).

Calibration: ``eps0`` is the largest local eps for which the bound gives the
central target at the *expected* number of senders. Because amplification
shrinks with n, the shuffler is told ``min_senders()``, the smallest n at which
that eps0 still meets the target, and refuses to release below it. The
guarantee reported after the round, ``guarantee_for(n)``, is recomputed from
the n actually shuffled.
"""
from __future__ import annotations

import math

from rknn_ray.errors import ConfigError, PrivacyBudgetError
from rknn_ray.mechanisms import register
from rknn_ray.mechanisms.base import Guarantee, MechanismParams
from rknn_ray.mechanisms.collision import CollisionMechanism
from rknn_ray.mechanisms.randomized_response import RandomizedResponse


class ShuffleSingleMixin:
    """Turns a local randomizer class into its single-message shuffle version."""

    model = "shuffle"

    def _init_shuffle(self, params: MechanismParams) -> None:
        from rknn_ray.accounting import BOUNDS, amplified_local_eps
        if not 0 < params.delta < 1:
            raise ConfigError("privacy.delta", f"the shuffle model needs 0 < delta < 1, got "
                              f"{params.delta}", "set privacy.delta, e.g. 1e-6")
        self.bound_name = params.options.get("bound", "clones_numerical")
        if self.bound_name not in BOUNDS or self.bound_name == "lower_bound":
            raise ConfigError("privacy.amplification_bound", f"{self.bound_name!r} is not an "
                              "upper bound", f"use one of {sorted(b for b in BOUNDS if b != 'lower_bound')}")
        self.bound = BOUNDS[self.bound_name]
        n = int(params.num_clients)
        try:
            self._eps0 = float(amplified_local_eps(params.eps, params.delta, n,
                                                   bound=self.bound_name))
        except (ValueError, ConfigError) as exc:
            raise ConfigError("privacy.eps", f"no local eps0 reaches the central target "
                              f"eps={params.eps}, delta={params.delta} with n={n} senders ({exc})",
                              "raise privacy.eps or privacy.delta, or use more clients") from exc

    @property
    def local_eps(self) -> float:
        return self._eps0

    def central_eps(self, n: int) -> float:
        """Central eps the bound gives for this eps0 and n shuffled senders."""
        if n < 2:
            return math.inf
        try:
            return float(self.bound.central_eps(self._eps0, int(n), self.params.delta))
        except (ValueError, ConfigError):
            return math.inf

    def min_senders(self) -> int:
        """Smallest n whose amplified eps still meets the target (binary search)."""
        target, hi = self.params.eps, int(self.params.num_clients)
        if self.central_eps(hi) > target * (1 + 1e-9):
            raise PrivacyBudgetError(f"eps0={self._eps0:.4g} misses the target at n={hi}")
        from rknn_ray.accounting.calibration import monotone_edge
        return int(monotone_edge(lambda n: self.central_eps(n) <= target * (1 + 1e-9), 1, hi,
                                 want="smallest", integer=True))

    def guarantee_for(self, n: int) -> Guarantee:
        """The guarantee from the n distinct senders actually shuffled."""
        eps = self.central_eps(n)
        if eps > self.params.eps * (1 + 1e-9):
            raise PrivacyBudgetError(
                f"only {n} distinct senders were shuffled; eps0={self._eps0:.4g} then gives "
                f"eps={eps:.4g} > target {self.params.eps}. Round refused, nothing released; "
                "wait for more clients or lower the target's demands")
        return Guarantee(eps, self.params.delta, "shuffle", self.name, unit="record", n=int(n),
                         note=f"single message: {self.base_name} at local eps0={self._eps0:.4g}, "
                              f"amplified by shuffling {n} senders ({self.bound_name} bound)")

    def guarantee(self, n: int | None = None) -> Guarantee:
        return self.guarantee_for(int(self.params.num_clients) if n is None else int(n))

    def event(self, n: int | None = None):
        from rknn_ray.accounting.events import ShuffledLocalDpEvent
        n = int(self.params.num_clients) if n is None else int(n)
        self.guarantee_for(n)                      # refuses below the target
        # local_mechanism: the randomizer's registry name, as in LocalRandomizerDpEvent
        return ShuffledLocalDpEvent(self.name, float(self._eps0), n,
                                    float(self.params.delta), self.bound_name)

    def describe(self) -> dict:
        return {**super().describe(), "eps0": self._eps0, "bound": self.bound_name,
                "min_senders": self.min_senders()}


class ShuffleRR(ShuffleSingleMixin, RandomizedResponse):
    name, base_name = "rr", "randomized response"

    def __init__(self, params: MechanismParams):
        self._init_shuffle(params)            # eps0 first: the base calibrates from it
        RandomizedResponse.__init__(self, params)


class ShuffleCollision(ShuffleSingleMixin, CollisionMechanism):
    name, base_name = "collision", "Collision"

    def __init__(self, params: MechanismParams):
        self._init_shuffle(params)
        CollisionMechanism.__init__(self, params)


register("shuffle", "rr")(ShuffleRR)
register("shuffle", "collision")(ShuffleCollision)

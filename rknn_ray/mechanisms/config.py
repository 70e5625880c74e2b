"""The run config's ``privacy`` and ``shuffle`` sections: every key declared once (the
``privacy.options`` keys in rknn_ray/mechanisms/options.py), and the rules that tie them
(delta per trust model, the mechanism per model, the options and Collision's domain).
rknn_ray/config.py composes them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from rknn_ray.accounting.units import MAX_BUDGET_EPS
from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import FrozenDict, check_number, key, owned, unknown_key
from rknn_ray.mechanisms import available
from rknn_ray.mechanisms.options import PRIVACY_OPTIONS, SHADOWED_OPTIONS


def _upper_bounds() -> tuple:
    from rknn_ray.accounting.bound_choice import upper_bound_names  # scipy: only when checked
    return upper_bound_names()


def _mechanisms_per_model() -> str:
    return "per `privacy.model`: " + "; ".join(
        f"{model}: " + " \\| ".join(f"`{m}`" for m in names) for model, names in available().items())


def _eps(value, path, spec):
    if isinstance(value, float) and math.isinf(value):
        raise ConfigError(path, "is infinite", "use a finite eps > 0 "
                          "(the report always includes the non-private reference)")
    value = check_number(value, path)
    if value < 1e-6:      # 0 and below included: one range in the message, the docs and here
        raise ConfigError(path, f"{value:g} is out of range (below 1e-06, its noise scale "
                          "2kr/eps would dwarf any count)", "choose privacy.eps in [1e-06, inf)")
    return spec.standard(value, path)


def _budget_eps(value, path, spec):
    value = spec.standard(value, path)
    if value is not None and value > MAX_BUDGET_EPS:
        raise ConfigError(path, f"{value:g} is above {MAX_BUDGET_EPS:g}: a budget that large "
                          "limits nothing (eps above ~10 already protects little), likely a typo",
                          f"set {path} to at most {MAX_BUDGET_EPS:g}, or null (the budget is "
                          "then this job's privacy.eps)")
    return value


@dataclass(frozen=True)
class PrivacyConfig:
    model: str = key("central", "trust model: who adds the noise", str,
                     choices=owned("rknn_ray.mechanisms", "available"))
    mechanism: str = key("laplace", "see the README's trust-model table", str,
                         accepts_text=_mechanisms_per_model)     # checked per model, below
    eps: float = key(1.0, "the job's total eps, record level, replace-one", float, low=1e-6,
                     check=_eps)
    delta: float = key(0.0, "the job's total delta (shuffle: below 1/n; local: 0; central: 0, "
                       "or > 0 with pld and rounds.count > 1)", float,
                       low=0, high=1, high_open=True)
    noise: str = key("discrete", "central: discrete (exact) or continuous (paper's)", str,
                     choices=owned("rknn_ray.mechanisms.central", "NOISE_KINDS"))
    multi_record: str = key("sample", "local/shuffle, clients with several records: sample one, "
                            "or each (every kept record its own report)", str,
                            choices=owned("rknn_ray.mechanisms.randomized_response",
                                           "MULTI_RECORD"))
    options: FrozenDict = key(None, "mechanism tuning (see below)", free_form=True,
                              factory=FrozenDict)
    budget_eps: float | None = key(None, "the records' eps budget across jobs (null: this job's "
                                   "eps; at most 100, as `rknn-ray budget set`)", float, low=0,
                                   low_open=True, nullable=True, check=_budget_eps,
                                   accepts_text=f"null or a number in (0, {MAX_BUDGET_EPS:g}]")
    budget_delta: float | None = key(None, "the records' delta budget across jobs, below 1/n "
                                     "(null: max(delta, 1/(10 n)))", float, low=0, high=1,
                                     high_open=True, nullable=True)
    accountant: str = key("basic", "composition: basic (sums) or pld (privacy-loss "
                          "distributions; T single-message shuffle rounds, or central rounds "
                          "at a delta > 0, are then calibrated for their composition)", str,
                          choices=owned("rknn_ray.accounting.ledger", "ACCOUNTANTS"))
    amplification_bound: str = key("tight", "shuffle, single message: the amplification "
                                   "bound (tight: its Collision form for Collision with c = 1, "
                                   "its generic eps0-LDP form otherwise)", str,
                                   choices=_upper_bounds)
    honest_fraction: float | None = key(None, "shuffle: share of senders assumed to follow the "
                                        "protocol (null: 0.5 for multi, 1.0 single message; "
                                        "docs/threat-model.md)", float, low=0, high=1,
                                        low_open=True, nullable=True)
    allow_partial_release: bool = key(False, "a client shard lost mid-round that cannot come "
                                      "back: false ends the job (exit 2, nothing released); "
                                      "true releases from the clients that reported, said in "
                                      "report.json and on the console", bool)


@dataclass(frozen=True)
class ShuffleConfig:
    min_senders: int | None = key(None, "sender floor above what the target needs", int, low=1,
                                  nullable=True)
    onion_layers: int = key(0, "N chained shufflers, each peeling its own layer", int, low=0,
                            high=8)
    dropout: float = key(0.0, "simulated fraction of clients that never send", float, low=0,
                         high=1, high_open=True)
    distributed_above: int | None = key(5_000_000, "above: a distributed sort", int, low=1,
                                        nullable=True)
    max_messages_per_record: int | None = key(64, "multi-message + queries.s auto: caps s so a "
                                              "client sends at most this many (expected) per "
                                              "record it may keep (data.max_records_per_client)",
                                              int, low=2, nullable=True)
    max_messages_per_client: int | None = key(None, "multi-message + queries.s auto: caps s so "
                                              "a client sends at most this many (expected) in "
                                              "all (null: no cap but the per-record one)", int,
                                              low=2, nullable=True)


def check_privacy_relations(cfg: dict) -> None:
    """delta per trust model and the mechanism per model (a merged, checked config dict)."""
    p = cfg["privacy"]
    if p["model"] == "shuffle" and p["delta"] <= 0:
        raise ConfigError("privacy.delta", "the shuffle model needs delta > 0 (amplification "
                          "gives (eps, delta) guarantees)", "set privacy.delta, e.g. 1e-6")
    # a central job of several rounds under the pld accountant spends a delta on their
    # composition (rknn_ray.mechanisms.composed_rounds); elsewhere a pure model never uses one
    composed = (p["model"] == "central" and p["accountant"] == "pld"
                and int(cfg["rounds"]["count"]) > 1)
    if p["model"] != "shuffle" and p["delta"] != 0 and not composed:
        hint = (" (or, for a central job of rounds.count > 1, privacy.accountant=pld: its "
                "rounds are then calibrated together for their composition at that delta)"
                if p["model"] == "central" else "")
        raise ConfigError("privacy.delta", f"delta = {p['delta']:g}, but every {p['model']} "
                          "mechanism is pure eps-DP: the delta would be reserved from the "
                          "dataset's budget and never used", "set privacy.delta=0 (the "
                          f"dataset's delta budget across jobs is privacy.budget_delta){hint}")
    names = available().get(p["model"], [])
    if p["mechanism"] not in names:
        raise ConfigError("privacy.mechanism", f"{p['mechanism']!r} is not a {p['model']} "
                          "mechanism", f"use one of {sorted(names)}")
    if p["multi_record"] == "each" and (p["model"] == "central" or p["mechanism"] == "multi"):
        raise ConfigError("privacy.multi_record", f"'each' is for the local randomizers (local "
                          f"model, single-message shuffle); {p['model']}/{p['mechanism']} "
                          "already counts every record a client keeps", "unset "
                          "privacy.multi_record (its default, sample, is not read there)")


def check_options(cfg: dict) -> None:
    """privacy.options' keys and values as rknn_ray/mechanisms/options.py declares them, and
    Collision's domain above k*r."""
    options = cfg["privacy"]["options"]
    for opt in options:
        path = f"privacy.options.{opt}"
        if opt in SHADOWED_OPTIONS:
            raise ConfigError(path, f"is set by {SHADOWED_OPTIONS[opt]}",
                              f"write {SHADOWED_OPTIONS[opt]}=<value> instead")
        if opt not in PRIVACY_OPTIONS:
            raise unknown_key(path, [f"privacy.options.{o}" for o in PRIVACY_OPTIONS],
                              f"known keys: {list(PRIVACY_OPTIONS)}")
        options[opt] = PRIVACY_OPTIONS[opt].standard(options[opt], path)
    c = (1 if cfg["rknn"]["k"] == "auto" else cfg["rknn"]["k"]) * cfg["rknn"]["r"]
    if options.get("collision_l", c + 1) <= c:
        raise ConfigError("privacy.options.collision_l", f"l = {options['collision_l']} must "
                          f"exceed k*r = {c} (the Collision mechanism's domain)",
                          f"set privacy.options.collision_l > {c}, or null for the variance-optimal l")

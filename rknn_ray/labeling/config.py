"""The run config's ``queries``, ``rknn``, ``labels`` and ``rounds`` sections: every key of
the labelling declared once, and the rules that tie them (k <= s, the rounds' budget split,
split queries leaving k per round). rknn_ray/config.py composes them.
"""
from __future__ import annotations

from dataclasses import dataclass

from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import check_number, key, owned
from rknn_ray.labeling.queries import ADAPTIVE_SELECTORS, NEXT_ROUND_SELECTORS
from rknn_ray.student.config import LABEL_TYPES


def _query_selections() -> tuple:
    return (*NEXT_ROUND_SELECTORS, *ADAPTIVE_SELECTORS)


@dataclass(frozen=True)
class QueriesConfig:
    s: int | str = key(100, "queries; auto: rknn_ray.labeling.autotune from n, eps and public data", int,
                       low=1, auto=True)
    restarts: int = key(3, "faiss k-means restarts", int, low=1)
    niter: int = key(25, "faiss k-means iterations", int, low=1)
    use_nearest_public: bool = key(False, "snap each centre to its nearest public sample", bool)


@dataclass(frozen=True)
class RknnConfig:
    k: int | str = key(1, "queries each record connects to; auto: with queries.s: auto", int,
                       low=1, auto=True)
    r: int = key(1, "label bits a record votes (r-hot); sensitivity is 2kr", int, low=1)
    connection: str = key("reverse_knn", "which k queries a record votes for: reverse_knn, or a "
                          "balanced rule priced on public data (still 2kr); auto: from public "
                          "degrees and the noise (docs/running.md)", str,
                          choices=owned("rknn_ray.labeling.connection", "CHOICES"))
    reweight: str = key("public", "what a balanced rule's prices balance: public (the public "
                        "samples) or released (from round 2 on, the public samples reweighted "
                        "by the counts released so far: post-processing, rounds.count >= 2)",
                        str, choices=("public", "released"))


@dataclass(frozen=True)
class LabelsConfig:
    type: str = key("hard", "hard (argmax) or soft (normalized counts) targets", str,
                    choices=LABEL_TYPES)
    train_on: str = key("public", "train on propagated public labels, or on the queries only",
                        str, choices=("public", "queries"))
    smooth: int | str = key(1, "public-graph neighbours for denoising (1: off); auto: "
                            "rknn_ray.labeling.denoise decides", int, low=1, auto=True)


@dataclass(frozen=True)
class RoundsConfig:
    count: int = key(1, "T labeling rounds in one job", int, low=1, high=100)
    budget_split: str | tuple[float, ...] = key(
        "even", "or T fractions of (eps, delta), sum <= 1 (pld + shuffle, or central at delta > 0: "
        "each round's eps0 / eps in these proportions, scaled to fill eps)",
        accepts_text="`even`, or a list of `rounds.count` fractions in (0, 1] summing to <= 1")
    query_selection: str = key("farthest", "farthest | uncertain (rknn_ray/labeling/adaptive.py)", str,
                               choices=_query_selections)
    uncertainty: str = key("margin", "uncertain: margin | entropy", str,
                           choices=owned("rknn_ray.labeling.adaptive", "UNCERTAINTY_RULES"))
    pool_factor: float = key(2.0, "uncertain: pick s among the pool_factor*s least certain",
                             float, low=1)
    split_queries: bool = key(False, "true: queries.s in total, divided over the rounds", bool)


def check_query_relations(cfg: dict) -> None:
    """k <= s, split queries leave at least k per round, and released reweighting has a
    balanced rule and an earlier round (a merged, checked config dict)."""
    rk = cfg["rknn"]
    if rk["reweight"] == "released" and (rk["connection"] == "reverse_knn"
                                         or cfg["rounds"]["count"] < 2):
        raise ConfigError("rknn.reweight", "released reweights a balanced rule's prices by the "
                          "counts of earlier rounds: it needs rknn.connection balanced_min, "
                          "balanced_harmonic or auto and rounds.count >= 2",
                          "set rknn.reweight=public, or a balanced rknn.connection and "
                          "rounds.count=2")
    s, k = cfg["queries"]["s"], cfg["rknn"]["k"]
    if "auto" in (s, k):
        return
    if k > s:
        raise ConfigError("rknn.k", f"k = {k} exceeds the number of queries s = {s}",
                          f"set rknn.k <= {s} or raise queries.s")
    count = cfg["rounds"]["count"]
    if cfg["rounds"]["split_queries"] is True and isinstance(count, int) and s // count < max(1, k):
        raise ConfigError("rounds.split_queries", f"s = {s} queries split over {count} rounds "
                          f"leaves {s // count} per round, fewer than k = {k}",
                          f"raise queries.s to >= {count * max(1, k)}, lower rounds.count, or set "
                          "rounds.split_queries=false")


def check_budget_split(split, count: int):
    """'even', or ``count`` positive fractions summing to at most 1 (numeric strings parsed)."""
    fix = f"use 'even' or a list of {count} fractions, e.g. {[round(1 / count, 3)] * count}"
    if split == "even":
        return split
    if not isinstance(split, (list, tuple)):
        raise ConfigError("rounds.budget_split", f"{split!r} is not 'even' or a list", fix)
    holder = list(split)
    for i in range(len(holder)):
        holder[i] = check_number(holder[i], f"rounds.budget_split[{i}]", float, 0, 1, low_open=True)
    if len(holder) != count or sum(holder) > 1 + 1e-12:
        raise ConfigError("rounds.budget_split", f"{list(split)!r} is not {count} positive "
                          "fractions summing to at most 1", fix)
    return holder

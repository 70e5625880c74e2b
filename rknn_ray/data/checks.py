"""The config's rules that need the data's sizes: queries.s and rounds.count against the
public set, data.clients against the records, rknn.r against the classes, delta below 1/n.

:func:`rknn_ray.data.prepared.prepare_data` (and a table's own ``prepare``) run them the
moment a size is known, before the private records are read where a public file says it;
the config's own validation runs :func:`check_queries_fit` where the config alone fixes the
public set's size. Here, in the data package, so that preparing data never imports the
config module (the config <-> data cycle).
"""
from __future__ import annotations

from rknn_ray.errors import ConfigError


def check_queries_fit(s, count: int, split_queries: bool, public_size: int) -> None:
    """Every round picks s public samples that are not yet queries: they must exist."""
    if s == "auto":
        s = 1
    if s > public_size:
        raise ConfigError("queries.s", f"s = {s} exceeds the {public_size} public samples",
                          f"set queries.s <= {public_size}")
    if split_queries:            # s in total over the rounds (round_query_counts)
        count = 1
    if s * count > public_size:
        raise ConfigError("rounds.count", f"{count} rounds of s = {s} new queries need "
                          f"{s * count} public samples (every round picks s public samples "
                          f"that are not yet queries), there are {public_size}",
                          f"lower rounds.count to <= {public_size // s} or queries.s to <= "
                          f"{max(1, public_size // count)}")


def check_public_size(cfg, public_size: int) -> None:
    """queries.s and rounds.count against a public set of ``public_size`` samples."""
    check_queries_fit(cfg.queries.s, cfg.rounds.count, cfg.rounds.split_queries, public_size)


def validate_with_data(cfg, public_size: int, num_private: int, num_classes: int,
                       partitioned: bool = True) -> None:
    """The checks that need the loaded data (s <= public size, clients <= records, r <= |Y|,
    delta < 1/n in the shuffle model). ``partitioned``: data.clients deals the records (not
    for tables, whose clients come from the data)."""
    check_public_size(cfg, public_size)
    if partitioned and cfg.data.partition != "one_per_client" and cfg.data.clients > num_private:
        raise ConfigError("data.clients", f"{cfg.data.clients} clients for only {num_private} "
                          "private records",
                          f"set data.clients <= {num_private} or data.partition=one_per_client")
    if cfg.rknn.r > num_classes:
        raise ConfigError("rknn.r", f"r = {cfg.rknn.r} labels per record exceeds the "
                          f"{num_classes} classes", f"set rknn.r <= {num_classes}")
    delta = cfg.privacy.delta
    if cfg.privacy.model == "shuffle" and delta >= 1.0 / max(1, num_private):
        raise ConfigError("privacy.delta", f"delta = {delta:g} is not below 1/n = "
                          f"{1.0 / max(1, num_private):.3g} for n = {num_private} private records: "
                          "an (eps, delta) mechanism may then expose a whole record outright with "
                          "probability delta", f"set privacy.delta below {0.1 / max(1, num_private):.1g} "
                          "(e.g. 1/(10 n))")
    budget_delta = cfg.privacy.budget_delta
    if budget_delta is not None and budget_delta >= 1.0 / max(1, num_private):
        raise ConfigError("privacy.budget_delta", f"{budget_delta:g} is not below 1/n = "
                          f"{1.0 / max(1, num_private):.3g} for n = {num_private} private records: "
                          "the delta summed over every job on the data must stay below 1/n",
                          f"set privacy.budget_delta below {1.0 / max(1, num_private):.3g}, e.g. "
                          f"1/(10 n) = {0.1 / max(1, num_private):.2g}")

"""``privacy.options``: the mechanism tuning keys, each declared once (range, doc, default).

The run config's validator (rknn_ray/mechanisms/config.py), the generated reference
(docs/configuration.md) and the mechanisms that read an option (:func:`option`) all take
what a key accepts and its default from here, so a range or a default cannot disagree
between them. A leaf module (keyspec only): validating a config imports no mechanism.
"""
from __future__ import annotations

from rknn_ray.keyspec import Spec

#: the DLap noise's share of the per-cell eps in the multi-message protocol (the rest pays
#: for flooding) when ``dlap_share`` is not set
DEFAULT_DLAP_SHARE = 0.85

#: privacy.options keys the mechanisms read, and what each accepts.
PRIVACY_OPTIONS = {
    "collision_l": Spec("Collision / separation: the output domain l, above k*r (unset: the "
                        "variance-optimal l)", int, low=2),
    "separation_split": Spec("separation: share f of eps for the query part (0.5, the paper's)",
                             float, low=0, high=1, low_open=True, high_open=True),
    "expected_dropout": Spec("shuffle multi: share of clients that may not send; the noise is "
                             "split over the rest", float, low=0, high=1, high_open=True),
    "dlap_share": Spec("shuffle multi: the DLap noise's share of the per-cell eps; the rest "
                       "pays for flooding: lower sends fewer messages, with more noise. Unset: "
                       "with queries.s auto under a message cap (shuffle.max_messages_per_*), the one of "
                       "0.85, 0.7, 0.55 that allows the most queries; else 0.85",
                       float, low=0, high=1, low_open=True, high_open=True)}

#: an option's value when the config leaves it out (collision_l: None, the mechanism's own l)
OPTION_DEFAULTS = {"collision_l": None, "separation_split": 0.5, "expected_dropout": 0.0,
                   "dlap_share": DEFAULT_DLAP_SHARE}

#: Options the config fills from a dedicated key (an options entry would override it).
SHADOWED_OPTIONS = {"noise": "privacy.noise", "multi_record": "privacy.multi_record",
                    "bound": "privacy.amplification_bound",
                    "honest_fraction": "privacy.honest_fraction"}


def option(options, name: str):
    """``options[name]`` checked against its declaration (a ConfigError naming
    ``privacy.options.<name>`` and its range), or its default when unset."""
    value = (options or {}).get(name)
    if value is None:
        return OPTION_DEFAULTS[name]
    return PRIVACY_OPTIONS[name].standard(value, f"privacy.options.{name}")

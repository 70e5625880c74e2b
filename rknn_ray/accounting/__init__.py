"""Privacy accounting: amplification bounds, calibration, events, accountants, ledgers.

* :mod:`.bounds` -- amplification upper bounds (FMT closed form, clones numerical,
  variation-ratio), a lower bound, inverses (``amplified_local_eps``).
* :mod:`.hockey` -- the exact, bounded-work hockey-stick computations behind them.
* :mod:`.multi_message` -- NB-share + flooding histogram protocol calibration.
* :mod:`.calibration` -- the one monotone search behind eps0, the sender floor and flooding.
* :mod:`.events` -- what a release is (dp_accounting-style frozen events, JSON round trip).
* :mod:`.accountants` -- what events cost, alone and together (``basic`` sums, ``pld``
  composes PLDs), under the accountant's choices (``Costing``): the only source of eps.
* :mod:`.budget_store` -- the one ledger (SQLite): persistent across jobs, or in memory.
* :mod:`.guarantee` -- ``Guarantee``: what a release promises, its eps the cost of its event
  (``guarantee_of(mechanism, n)``); :mod:`.units` -- the names it is stated in.
* :mod:`.ledger` -- ``PrivacyLedger``: a run's view over a store (a job's: its own rows of
  the persistent one), with the run's budget cap; composes each release once.
* :mod:`.source_identity` -- which records a job touches: per-record fingerprints of its pool.

The empirical audit runs mechanisms, so it lives above them (benchmarks/audit.py): nothing
here imports ``rknn_ray.mechanisms``.
"""
from __future__ import annotations

import importlib

# name -> submodule, loaded on first use: a process that only unpickles a mechanism (an
# opener, a client shard) imports rknn_ray.accounting.bounds, and with eager imports here
# it would pay for dp_accounting and scipy before its first report
_LAZY = {"BOUNDS": "bounds", "AmplificationBound": "bounds", "VariationRatioBound": "bounds",
         "amplified_local_eps": "bounds", "get_bound": "bounds",
         "variation_ratio_bound": "bounds", "PrivacyLedger": "ledger",
         "Guarantee": "guarantee", "guarantee_of": "guarantee",
         "atomic_write_json": "ledger", "MultiMessageCalibration": "multi_message",
         "calibrate_multi_message": "multi_message"}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

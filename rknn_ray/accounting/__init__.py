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
* :mod:`.ledger` -- ``PrivacyLedger``: a run's view over a store (a job's: its own rows of
  the persistent one), with the run's budget cap; composes each release once.
* :mod:`.source_identity` -- which records a job touches: per-record fingerprints of its pool.
* :mod:`.audit` -- empirical audit (Clopper-Pearson) and simulated labeling error.
"""
from rknn_ray.accounting.bounds import (BOUNDS, AmplificationBound, VariationRatioBound,
                                        amplified_local_eps, get_bound, variation_ratio_bound)
from rknn_ray.accounting.ledger import PrivacyLedger, atomic_write_json
from rknn_ray.accounting.multi_message import MultiMessageCalibration, calibrate_multi_message

__all__ = ["BOUNDS", "AmplificationBound", "VariationRatioBound", "amplified_local_eps",
           "get_bound", "variation_ratio_bound", "PrivacyLedger", "atomic_write_json",
           "MultiMessageCalibration", "calibrate_multi_message"]

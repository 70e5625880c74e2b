"""Privacy accounting: shuffle amplification bounds, multi-message calibration, ledger."""
from rknn_ray.accounting.bounds import (BOUNDS, AmplificationBound, VariationRatioBound,
                                        amplified_local_eps, get_bound, variation_ratio_bound)

__all__ = ["BOUNDS", "AmplificationBound", "VariationRatioBound", "amplified_local_eps",
           "get_bound", "variation_ratio_bound"]

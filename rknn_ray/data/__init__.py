"""Data layer: the dataset registry (``register_dataset``), readers of the real file formats, the paper's splits, client partitioners.

Images are float32 (N, C, H, W) in [0, 1]; labels int64. See ``readers`` for the
formats, ``splits`` for the split rules (and why), ``partition`` for the schemes.
"""
from rknn_ray.data.readers import Dataset, canonical_name, load_dataset, validate_features
from rknn_ray.data.registry import register_dataset
from rknn_ray.data.splits import RULES, Splits, make_splits
from rknn_ray.data.partition import (SCHEMES, client_offsets, label_skew, order_by_client,
                                     partition)
from rknn_ray.data.synthetic import gaussian_mixture
from rknn_ray.data import readers

__all__ = ["DEFAULT_ROOTS", "KNOWN", "register_dataset", "Dataset", "canonical_name", "load_dataset",
           "validate_features", "RULES", "Splits", "make_splits", "SCHEMES", "client_offsets",
           "label_skew", "order_by_client", "partition", "gaussian_mixture"]


def __getattr__(name: str):
    """``KNOWN`` / ``DEFAULT_ROOTS``: read from the registry when asked (rknn_ray.data.readers)."""
    if name in ("KNOWN", "DEFAULT_ROOTS", "ALIASES"):
        return getattr(readers, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Data layer: readers of the real file formats, the paper's splits, client partitioners.

Images are float32 (N, C, H, W) in [0, 1]; labels int64. See ``readers`` for the
formats, ``splits`` for the split rules (and why), ``partition`` for the schemes.
"""
from rknn_ray.data.readers import (DEFAULT_ROOTS, KNOWN, Dataset, canonical_name, load_dataset,
                                   validate_features)
from rknn_ray.data.splits import RULES, Splits, make_splits
from rknn_ray.data.partition import (SCHEMES, client_offsets, label_skew, order_by_client,
                                     partition)
from rknn_ray.data.synthetic import gaussian_mixture

__all__ = ["DEFAULT_ROOTS", "KNOWN", "Dataset", "canonical_name", "load_dataset",
           "validate_features", "RULES", "Splits", "make_splits", "SCHEMES", "client_offsets",
           "label_skew", "order_by_client", "partition", "gaussian_mixture"]

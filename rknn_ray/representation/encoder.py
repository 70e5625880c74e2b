"""The encoder interface: what every representation (rknn_ray.representation.represent, the contrastive
encoder in rknn_ray.representation.contrastive) implements. Its own module so that encoder
implementations and the registry that builds them do not import each other."""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Encoder(ABC):
    name = "abstract"
    #: each row's embedding is the same bits whatever other rows share the call (an
    #: element-by-element transform), so many holders' rows may be encoded in one call
    #: (holder.answer.inputs_many); a matrix product may round otherwise per row count
    row_wise = False

    @abstractmethod
    def fit(self, public_x: np.ndarray) -> "Encoder":
        """Fit on public inputs (N, ...)."""

    @abstractmethod
    def transform(self, x: np.ndarray) -> np.ndarray:
        """(N, D) float32 C-contiguous embeddings."""

    @property
    @abstractmethod
    def dim(self) -> int:
        """Embedding dimension D."""

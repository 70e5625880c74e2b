"""The encoder interface: what every representation (rknn_ray.representation.represent, the contrastive
encoder in rknn_ray.representation.contrastive) implements. Its own module so that encoder
implementations and the registry that builds them do not import each other."""
from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class Encoder(ABC):
    name = "abstract"

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

"""Encoders: map raw inputs to the representation space where k-NN is taken.

An encoder is fitted on *public* data only (it is public), then shipped to the
client shards, which embed their private records locally. ``raw`` flattens;
``pca`` projects onto the top principal components of the public data (faiss
PCAMatrix, optionally whitened); ``hog`` computes histograms of oriented gradients
(rknn_ray.representation.hog: scikit-image's descriptor, batched), optionally reduced by PCA fitted
on the public HOG features;
``simclr`` is a contrastive encoder learned from the public images
(rknn_ray.representation.contrastive). Other encoders join by implementing ``Encoder``.
"""
from __future__ import annotations

import numpy as np

from rknn_ray.representation.encoder import Encoder
from rknn_ray.errors import ConfigError
from rknn_ray.representation.hog import hog_features


def _flat(x: np.ndarray) -> np.ndarray:
    # an explicit width: reshape(0, -1) fails for the 0 rows of an absent evaluation set
    return np.ascontiguousarray(x.reshape(x.shape[0], int(np.prod(x.shape[1:]))), dtype=np.float32)


class RawEncoder(Encoder):
    """Flattened inputs, unchanged."""
    name = "raw"
    row_wise = True         # a reshape and a cast to float32

    def __init__(self):
        self._dim = None

    def fit(self, public_x):
        self._dim = int(np.prod(public_x.shape[1:]))
        return self

    def transform(self, x):
        return _flat(x)

    @property
    def dim(self):
        return self._dim


class PCAEncoder(Encoder):
    """Top ``dim`` principal components of the public data (faiss PCAMatrix)."""
    name = "pca"

    def __init__(self, dim: int = 50, whiten: bool = False):
        self._dim, self.whiten = int(dim), bool(whiten)
        self.matrix = None

    def fit(self, public_x):
        import faiss    # here, not at the top: the config reads ENCODERS without faiss
        flat = _flat(public_x)
        if self._dim > min(flat.shape):
            raise ConfigError("represent.dim", f"{self._dim} exceeds the public data's rank "
                              f"bound min(N, D) = {min(flat.shape)}",
                              f"set represent.dim <= {min(flat.shape)}")
        self.matrix = faiss.PCAMatrix(flat.shape[1], self._dim, -0.5 if self.whiten else 0.0)
        self.matrix.train(flat)
        return self

    def transform(self, x):
        if self.matrix is None:
            raise RuntimeError("PCAEncoder.transform before fit")
        if x.shape[0] == 0:
            return np.zeros((0, self._dim), np.float32)
        return np.ascontiguousarray(self.matrix.apply(_flat(x)))

    @property
    def dim(self):
        return self._dim

    # faiss objects do not pickle; ship the fitted matrix as arrays (to Ray actors).
    def __getstate__(self):
        import faiss  # defers faiss
        state = self.__dict__.copy()
        if self.matrix is not None:
            state["matrix"] = (self.matrix.d_in, self.matrix.d_out,
                               faiss.vector_to_array(self.matrix.A),
                               faiss.vector_to_array(self.matrix.b))
        return state

    def __setstate__(self, state):
        packed = state.pop("matrix")
        self.__dict__.update(state)
        self.matrix = None
        if packed is not None:
            import faiss  # defers faiss
            d_in, d_out, a, b = packed
            m = faiss.LinearTransform(d_in, d_out, True)
            faiss.copy_array_to_vector(a, m.A)
            faiss.copy_array_to_vector(b, m.b)
            m.is_trained = True
            self.matrix = m


class HOGEncoder(Encoder):
    """Histograms of oriented gradients (rknn_ray.representation.hog: scikit-image's descriptor, batched)
    of each image's channel mean, cells of ``cell`` pixels (default: side // 7, so 4 px for 28x28, 2 px for 8x8), 2x2-cell blocks,
    L2-Hys normalized; optionally projected to ``dim`` components by PCA on the public HOG
    features (``dim`` <= 0 keeps all)."""
    name = "hog"

    def __init__(self, dim: int = 0, orientations: int = 9, cell: int | None = None):
        self.out_dim, self.orientations, self.cell = int(dim), int(orientations), cell
        self.pca = None
        self._dim = None

    def _cell(self, side: int) -> int:
        return int(self.cell) if self.cell else max(2, side // 7)

    def _hog(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 4:
            x = x.mean(axis=1)
        if x.ndim != 3:
            raise ConfigError("represent.encoder", f"hog needs images, got shape {x.shape}",
                              "use represent.encoder=pca for flat features")
        if x.shape[0] == 0:
            return np.zeros((0, self._dim or 0), np.float32)
        return hog_features(x, orientations=self.orientations, cell=self._cell(max(x.shape[1:])),
                            block=2)

    def fit(self, public_x):
        feats = self._hog(public_x)
        self._dim = feats.shape[1]
        if 0 < self.out_dim < self._dim:
            self.pca = PCAEncoder(self.out_dim).fit(feats)
            self._dim = self.out_dim
        return self

    def transform(self, x):
        if np.asarray(x).shape[0] == 0:
            return np.zeros((0, self.dim), np.float32)
        feats = self._hog(x)
        return feats if self.pca is None else self.pca.transform(feats)

    @property
    def dim(self):
        return self._dim


def _contrastive(**kwargs) -> Encoder:
    from rknn_ray.representation.contrastive import ContrastiveEncoder  # defers torch
    return ContrastiveEncoder(**kwargs)


ENCODERS = {"raw": RawEncoder, "pca": PCAEncoder, "hog": HOGEncoder, "simclr": _contrastive}


def make_encoder(name: str, **kwargs) -> Encoder:
    if name not in ENCODERS:
        raise ConfigError("represent.encoder", f"unknown encoder {name!r}",
                          f"use one of {sorted(ENCODERS)}")
    return ENCODERS[name]() if name == "raw" else ENCODERS[name](**kwargs)

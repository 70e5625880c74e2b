"""The representation stage read from a run config: the unfitted encoder ``represent.*``
describes, and the encoder's entry in a run's label info."""
from __future__ import annotations

from rknn_ray.representation.represent import Encoder, make_encoder


def encoder_from_config(cfg, progress=None) -> Encoder:
    """An unfitted encoder as ``cfg.represent`` describes it."""
    r = cfg.represent
    if r.encoder == "pca":
        return make_encoder("pca", dim=r.dim, whiten=r.whiten)
    if r.encoder == "hog":
        return make_encoder("hog", dim=r.dim)
    if r.encoder == "simclr":
        return make_encoder("simclr", dim=r.dim, epochs=r.epochs, batch_size=r.batch_size,
                            flip=r.flip, backbone=r.backbone, seed=cfg.run.seed, trainer=r.trainer,
                            cache_dir=r.cache_dir, use_gpu=cfg.student.use_gpu, progress=progress)
    return make_encoder(r.encoder)


def encoder_info(cfg) -> dict:
    """The encoder's entry in a run's label info (report.json)."""
    return {"encoder": cfg.represent.encoder, "dim": cfg.represent.dim}

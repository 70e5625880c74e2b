"""The run config's ``represent`` section: every ``represent.*`` key declared once."""
from __future__ import annotations

from dataclasses import dataclass

from rknn_ray.keyspec import key, owned, path_or_null


@dataclass(frozen=True)
class RepresentConfig:
    encoder: str = key("pca", "fitted on public data only", str,
                       choices=owned("rknn_ray.representation.represent", "ENCODERS"))
    dim: int = key(32, "output dimension (PCA components)", int, low=1)
    whiten: bool = key(False, "PCA whitening", bool)
    # the learned encoder (simclr, rknn_ray.representation.contrastive): trained on public data only, cached
    epochs: int = key(15, "simclr training epochs (public data only)", int, low=1)
    batch_size: int = key(256, "simclr batch size", int, low=2)
    flip: bool = key(True, "left-right mirror augmentation (false for digits)", bool)
    backbone: str = key("auto", "simclr backbone (resnet: 32x32, GPU)", str,
                        choices=("auto", "cnn", "resnet"))
    trainer: str = key("ray", "simclr (and the semi student): ray (one-worker Ray Train) | local",
                       str, choices=("ray", "local"))
    cache_dir: str | None = key(None, "null: $RKNN_RAY_CACHE/encoders or "
                                "~/.cache/rknn-ray/encoders", str, nullable=True,
                                accepts_text="a folder path, or null",
                                check=path_or_null("set a folder path or null"))

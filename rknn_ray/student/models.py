"""Student models: small CNNs for 8x8 / 28x28 / 32x32 images and an MLP for flat features.

The student only has to fit labelled public data of modest size, so the nets are
deliberately small (fast on CPU, enough to reach the accuracy the labels allow).
Every CNN ends in an adaptive pooling layer, so any image size near the nominal one
also works; ``arch="auto"`` picks by input shape.
"""
from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from rknn_ray.errors import ConfigError
from rknn_ray.student.config import ARCHS


def _conv_block(c_in: int, c_out: int, n_convs: int, pool: bool) -> list[nn.Module]:
    layers: list[nn.Module] = []
    for i in range(n_convs):
        layers += [nn.Conv2d(c_in if i == 0 else c_out, c_out, 3, padding=1), nn.ReLU(inplace=True)]
    if pool:
        layers.append(nn.MaxPool2d(2))
    return layers


class SmallCNN(nn.Module):
    """Conv blocks -> adaptive average pool to 4x4 -> one hidden dense layer -> logits."""

    def __init__(self, in_channels: int, num_classes: int, blocks: list[tuple[int, int, bool]],
                 hidden: int, dropout: float = 0.25):
        super().__init__()
        layers: list[nn.Module] = []
        c = in_channels
        for c_out, n_convs, pool in blocks:
            layers += _conv_block(c, c_out, n_convs, pool)
            c = c_out
        self.features = nn.Sequential(*layers, nn.AdaptiveAvgPool2d((4, 4)))
        self.head = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(c * 16, hidden), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """Two hidden layers for flat feature vectors (PCA / HOG / synthetic features)."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 256, dropout: float = 0.2):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(inplace=True), nn.Dropout(dropout),
            nn.Linear(hidden, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def resolve_arch(image_shape: tuple, arch: str = "auto") -> str:
    """The concrete architecture name for an input shape (``auto`` picks by size)."""
    shape = tuple(int(s) for s in image_shape)
    if arch not in ARCHS:
        raise ConfigError("student.arch", f"unknown architecture {arch!r}", f"use one of {ARCHS}")
    if len(shape) == 1:
        if arch not in ("auto", "mlp"):
            raise ConfigError("student.arch", f"{arch!r} needs (C, H, W) images, got flat shape {shape}",
                              "use arch 'mlp' (or 'auto') for feature vectors")
        return "mlp"
    if len(shape) != 3 or shape[0] not in (1, 3) or min(shape[1:]) < 4:
        raise ConfigError("student.image_shape", f"unsupported input shape {shape}",
                          "pass (D,) feature vectors or (C, H, W) images with C in {1, 3}, H, W >= 4")
    if arch == "mlp":
        return "mlp"
    if arch != "auto":
        return arch
    side = max(shape[1:])
    return "cnn8" if side <= 12 else ("cnn28" if side <= 30 else "cnn32")


def build_model(image_shape: tuple, num_classes: int, arch: str = "auto") -> nn.Module:
    """A fresh student for inputs of ``image_shape`` ((D,) or (C, H, W)) and ``num_classes`` outputs."""
    if int(num_classes) < 2:
        raise ConfigError("num_classes", f"need at least 2 classes, got {num_classes}",
                          "pass the dataset's number of classes")
    name = resolve_arch(image_shape, arch)
    shape = tuple(int(s) for s in image_shape)
    k = int(num_classes)
    if name == "mlp":
        return MLP(int(torch.tensor(shape).prod()), k)
    c = shape[0]
    if name == "cnn8":     # 8x8 -> 4x4
        return SmallCNN(c, k, [(32, 1, False), (64, 1, True)], hidden=128)
    if name == "cnn28":    # 28 -> 14 -> 7 (-> adaptive 4x4)
        return SmallCNN(c, k, [(32, 1, True), (64, 1, True)], hidden=128)
    # cnn32: 32 -> 16 -> 8 -> 4
    return SmallCNN(c, k, [(32, 2, True), (64, 2, True), (128, 1, True)], hidden=256)


def hard_label_loss(logits: torch.Tensor, labels: torch.Tensor,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy against integer labels; ``weight`` (N,) gives a weighted mean (0 = ignore)."""
    per_row = F.cross_entropy(logits, labels, reduction="none")
    return _weighted_mean(per_row, weight)


def soft_label_loss(logits: torch.Tensor, targets: torch.Tensor,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """Cross-entropy against label distributions (rows of ``targets`` sum to 1)."""
    per_row = -(targets * F.log_softmax(logits, dim=1)).sum(dim=1)
    return _weighted_mean(per_row, weight)


def _weighted_mean(per_row: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    if weight is None:
        return per_row.mean()
    # clamp keeps an all-zero-weight batch at loss 0 (zero gradient) instead of NaN
    return (per_row * weight).sum() / weight.sum().clamp_min(1e-12)

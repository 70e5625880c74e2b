"""Image augmentations written in torch (torchvision is not a dependency), batched.

Every function takes a (B, C, H, W) float batch and a ``torch.Generator`` and draws
one independent transformation per image, so a whole batch is augmented in a few
tensor operations. They serve the contrastive encoder (two views of each public
image) and the semi-supervised student (weak and strong views).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _uniform(n: int, low: float, high: float, gen: torch.Generator) -> torch.Tensor:
    return low + (high - low) * torch.rand(n, generator=gen)


def random_resized_crop(x: torch.Tensor, gen: torch.Generator, scale=(0.55, 1.0),
                        max_shift: float = 0.2, flip: bool = False) -> torch.Tensor:
    """Zoom into a random square of relative side ``scale``, shifted by up to ``max_shift``
    (fraction of the image), optionally mirrored left-right with probability 1/2.
    One affine grid per image (bilinear, zero padding)."""
    b = x.shape[0]
    s = _uniform(b, *scale, gen)
    tx = _uniform(b, -max_shift, max_shift, gen)
    ty = _uniform(b, -max_shift, max_shift, gen)
    sx = s.clone()
    if flip:
        sx = torch.where(torch.rand(b, generator=gen) < 0.5, -sx, sx)
    theta = torch.zeros(b, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = sx, tx
    theta[:, 1, 1], theta[:, 1, 2] = s, ty
    grid = F.affine_grid(theta.to(x.device, x.dtype), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def color_jitter(x: torch.Tensor, gen: torch.Generator, strength: float = 0.4) -> torch.Tensor:
    """Random brightness (multiplicative) and contrast (around each image's mean)."""
    b = x.shape[0]
    shape = (b,) + (1,) * (x.ndim - 1)
    bright = _uniform(b, 1 - strength, 1 + strength, gen).view(shape).to(x.device, x.dtype)
    contrast = _uniform(b, 1 - strength, 1 + strength, gen).view(shape).to(x.device, x.dtype)
    mean = x.mean(dim=tuple(range(1, x.ndim)), keepdim=True)
    return ((x - mean) * contrast + mean) * bright


def gaussian_noise(x: torch.Tensor, gen: torch.Generator, sigma: float = 0.05) -> torch.Tensor:
    return x + sigma * torch.randn(x.shape, generator=gen).to(x.device, x.dtype)


def random_erase(x: torch.Tensor, gen: torch.Generator, p: float = 0.5,
                 area=(0.05, 0.2)) -> torch.Tensor:
    """With probability ``p`` per image, zero a random rectangle of ``area`` of the image."""
    b, _, h, w = x.shape
    a = _uniform(b, *area, gen)
    ratio = torch.exp(_uniform(b, -0.8, 0.8, gen))
    eh = (torch.sqrt(a * ratio) * h).clamp(1, h).long()
    ew = (torch.sqrt(a / ratio) * w).clamp(1, w).long()
    y0 = (torch.rand(b, generator=gen) * (h - eh + 1)).long()
    x0 = (torch.rand(b, generator=gen) * (w - ew + 1)).long()
    rows = torch.arange(h)[None, :]
    cols = torch.arange(w)[None, :]
    in_r = (rows >= y0[:, None]) & (rows < (y0 + eh)[:, None])          # (B, H)
    in_c = (cols >= x0[:, None]) & (cols < (x0 + ew)[:, None])          # (B, W)
    box = in_r[:, :, None] & in_c[:, None, :]
    box &= (torch.rand(b, generator=gen) < p)[:, None, None]
    return x.masked_fill(box[:, None].to(x.device), 0.0)


def weak_view(x: torch.Tensor, gen: torch.Generator, flip: bool) -> torch.Tensor:
    """Small shift (and flip where valid): FixMatch's weak augmentation."""
    return random_resized_crop(x, gen, scale=(0.9, 1.0), max_shift=0.12, flip=flip)


def strong_view(x: torch.Tensor, gen: torch.Generator, flip: bool) -> torch.Tensor:
    """Crop + shift + flip + contrast/brightness + noise + erasing: a SimCLR view, and
    FixMatch's strong augmentation."""
    out = random_resized_crop(x, gen, scale=(0.55, 1.0), max_shift=0.2, flip=flip)
    out = color_jitter(out, gen)
    out = gaussian_noise(out, gen)
    return random_erase(out, gen)

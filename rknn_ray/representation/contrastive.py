"""A self-supervised contrastive encoder (SimCLR-style), trained on PUBLIC data only.

The server owns unlabelled public data; this module learns a representation from
it alone (two augmented views of each image must be each other's nearest
neighbour among 2B views: the NT-Xent loss) and hands the clients the trained
backbone, which they use to embed their private records. No private record and
no label ever enters ``fit``.

Backbones: a small CNN for 8x8 and 28x28 inputs (trains on a laptop CPU in
minutes) and a ResNet-18-style network for 32x32 (meant for GPU machines).
:func:`train_contrastive_loop` is one :mod:`rknn_ray.training` loop: it runs in a
one-worker Ray Train ``TorchTrainer`` (``trainer="ray"``; Ray must be running) or in this
process (``trainer="local"``: tests, or no Ray wanted).

The trained encoder is cached under ``cache_dir`` (default
``$RKNN_RAY_CACHE/encoders`` or ``~/.cache/rknn-ray/encoders``) by a digest of its
config and of the public data's bytes, so a second run on the same public data
loads it instead of training again; ``save(folder)`` copies it into the run folder.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rknn_ray.representation.augment import strong_view
from rknn_ray.errors import ConfigError
from rknn_ray.representation.encoder import Encoder
from rknn_ray.training import one_cycle, run_loop
from rknn_ray.runio import save_torch

ENCODER_FILE = "encoder.pt"
BACKBONES = ("auto", "cnn", "resnet")
FORMAT_VERSION = 1          # bump when training changes in a way the digest does not see


# ----------------------------------------------------------------------------- backbones

def _cbr(c_in: int, c_out: int, stride: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]


class SmallConvNet(nn.Module):
    """3 conv blocks, global average pool: ``dim`` features. 28x28 pools twice, 8x8 never."""

    def __init__(self, in_channels: int, side: int, dim: int = 64, width: int = 16):
        super().__init__()
        pool = side > 12
        layers = _cbr(in_channels, width) + ([nn.MaxPool2d(2)] if pool else [])
        layers += _cbr(width, 2 * width) + ([nn.MaxPool2d(2)] if pool else [])
        layers += _cbr(2 * width, 4 * width) + _cbr(4 * width, dim)
        self.body = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.dim = dim

    def forward(self, x):
        return self.body(x)


class _Basic(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.a = nn.Sequential(*_cbr(c_in, c_out, stride))
        self.b = nn.Sequential(nn.Conv2d(c_out, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out))
        self.skip = nn.Identity() if stride == 1 and c_in == c_out else nn.Sequential(
            nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x):
        return F.relu(self.b(self.a(x)) + self.skip(x))


class ResNet18Small(nn.Module):
    """ResNet-18 layout for 32x32 inputs (3x3 stem, no max-pool), ``dim`` = 512 features."""

    def __init__(self, in_channels: int, dim: int = 512):
        super().__init__()
        widths, layers, c = [64, 128, 256, 512], [], 64
        for i, w in enumerate(widths):
            layers += [_Basic(c, w, 1 if i == 0 else 2), _Basic(w, w, 1)]
            c = w
        head = [] if dim == c else [nn.Linear(c, dim)]
        self.body = nn.Sequential(*_cbr(in_channels, 64), *layers, nn.AdaptiveAvgPool2d(1),
                                  nn.Flatten(), *head)
        self.dim = dim

    def forward(self, x):
        return self.body(x)


def build_backbone(image_shape: tuple, dim: int, backbone: str = "auto", width: int = 16) -> nn.Module:
    shape = tuple(int(s) for s in image_shape)
    if len(shape) != 3:
        raise ConfigError("represent.encoder", f"the contrastive encoder needs (C, H, W) images, "
                          f"got shape {shape}", "use represent.encoder=pca for flat features")
    if backbone not in BACKBONES:
        raise ConfigError("represent.backbone", f"unknown backbone {backbone!r}", f"use one of {BACKBONES}")
    side = max(shape[1:])
    if backbone == "resnet" or (backbone == "auto" and side >= 32):
        return ResNet18Small(shape[0], dim)
    return SmallConvNet(shape[0], side, dim, width)


class SimCLRNet(nn.Module):
    """Backbone + 2-layer projection head (the head is dropped after training)."""

    def __init__(self, image_shape: tuple, dim: int, backbone: str = "auto", proj_dim: int = 64):
        super().__init__()
        self.backbone = build_backbone(image_shape, dim, backbone)
        self.head = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(inplace=True), nn.Linear(dim, proj_dim))

    def forward(self, x):
        return self.head(self.backbone(x))


def nt_xent(z1: torch.Tensor, z2: torch.Tensor, temperature: float) -> torch.Tensor:
    """SimCLR's normalized-temperature cross-entropy: view i's positive is its other view,
    the 2B - 2 other views of the batch are the negatives."""
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    b = z1.shape[0]
    sim = z @ z.t() / temperature
    sim.fill_diagonal_(float("-inf"))
    target = torch.cat([torch.arange(b, 2 * b), torch.arange(0, b)]).to(z.device)
    return F.cross_entropy(sim, target)


# ----------------------------------------------------------------------------- training

@dataclass
class ContrastiveConfig:
    dim: int = 128
    epochs: int = 15
    batch_size: int = 256
    lr: float = 2e-3
    temperature: float = 0.2
    flip: bool = True            # left-right mirror as an augmentation (off for digits)
    backbone: str = "auto"
    seed: int = 0


def train_contrastive_loop(x: np.ndarray, cfg: dict, device="cpu", on_epoch=None) -> dict:
    """The SimCLR loop on public images ``x`` (N, C, H, W); returns the backbone's
    ``state_dict`` (CPU) and the per-epoch ``history``."""
    torch.manual_seed(int(cfg["seed"]))
    net = SimCLRNet(x.shape[1:], int(cfg["dim"]), cfg["backbone"]).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=float(cfg["lr"]), weight_decay=1e-6)
    epochs = int(cfg["epochs"])
    xs = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    n = xs.shape[0]
    bs = max(2, min(int(cfg["batch_size"]), n))
    steps = max(1, n // bs)                    # drop the last partial batch (NT-Xent wants full ones)
    sched = one_cycle(opt, float(cfg["lr"]), epochs * steps, pct_start=0.15)
    gen = torch.Generator().manual_seed(int(cfg["seed"]) + 17)
    history = []
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(n, generator=gen)
        total = 0.0
        for i in range(steps):
            xb = xs[order[i * bs:(i + 1) * bs]]
            v1 = strong_view(xb, gen, bool(cfg["flip"])).to(device)
            v2 = strong_view(xb, gen, bool(cfg["flip"])).to(device)
            loss = nt_xent(net(v1), net(v2), float(cfg["temperature"]))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total += float(loss.detach())
        row = {"epoch": epoch + 1, "loss": total / steps}
        history.append(row)
        if on_epoch is not None:
            on_epoch(row)
    state = {k: v.detach().cpu() for k, v in net.backbone.state_dict().items()}
    return {"state_dict": state, "history": history}


# ----------------------------------------------------------------------------- the encoder

def default_cache_dir() -> str:
    root = os.environ.get("RKNN_RAY_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rknn-ray")
    return os.path.join(root, "encoders")


def encoder_digest(config: ContrastiveConfig, public_x: np.ndarray) -> str:
    """sha256 of the training config, the format version and the public data (shape, dtype, bytes)."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": FORMAT_VERSION, **asdict(config)}, sort_keys=True).encode())
    arr = np.ascontiguousarray(public_x)
    h.update(f"{arr.shape}|{arr.dtype}".encode())
    h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


class ContrastiveEncoder(Encoder):
    """SimCLR backbone trained on the public data; embeddings are L2-normalized backbone outputs."""
    name = "simclr"

    def __init__(self, dim: int = 128, epochs: int = 15, batch_size: int = 256, lr: float = 2e-3,
                 temperature: float = 0.2, flip: bool = True, backbone: str = "auto", seed: int = 0,
                 trainer: str = "ray", cache_dir: str | None = None, use_gpu: bool | None = None,
                 progress=None):
        if trainer not in ("ray", "local"):
            raise ConfigError("represent.trainer", f"unknown trainer {trainer!r}", "use 'ray' or 'local'")
        self.config = ContrastiveConfig(int(dim), int(epochs), int(batch_size), float(lr),
                                        float(temperature), bool(flip), backbone, int(seed))
        self.trainer, self.use_gpu, self.progress = trainer, use_gpu, progress
        self.cache_dir = default_cache_dir() if cache_dir is None else cache_dir
        self.image_shape = None
        self.state_dict = None
        self.history: list = []
        self.digest = None
        self.cache_hit = False
        self.train_seconds = 0.0
        self._net = None

    @property
    def dim(self):
        return self.config.dim

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    def fit(self, public_x: np.ndarray) -> "ContrastiveEncoder":
        """Train on ``public_x`` (public, unlabelled) or load the cached result for these bytes."""
        x = np.ascontiguousarray(public_x, dtype=np.float32)
        self.image_shape = tuple(int(s) for s in x.shape[1:])
        self.digest = encoder_digest(self.config, x)
        path = os.path.join(self.cache_dir, f"{self.digest[:32]}.pt") if self.cache_dir else None
        if path and os.path.isfile(path):
            self._load(path)
            self.cache_hit = True
            self._say(f"contrastive encoder: cache hit {path}")
            return self
        cfg = asdict(self.config)
        t0 = time.perf_counter()
        self._say(f"contrastive encoder: training {self.config.epochs} epochs on {len(x)} public "
                  f"images ({self.trainer})")
        run = run_loop(train_contrastive_loop, x, cfg, trainer=self.trainer, name="encoder",
                       use_gpu=self.use_gpu, trainer_key="represent.trainer",
                       on_epoch=None if self.progress is None else
                       lambda r: self._say(f"  encoder epoch {r['epoch']} loss {r['loss']:.4f}"))
        self.state_dict, self.history = run.payload["state_dict"], run.payload["history"]
        self.train_seconds = time.perf_counter() - t0
        self._net = None
        if path:
            os.makedirs(self.cache_dir, exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
            torch.save(self._payload(), tmp)
            os.replace(tmp, path)              # atomic: a concurrent run never reads half a file
        return self

    def _payload(self) -> dict:
        return {"state_dict": self.state_dict, "history": self.history, "digest": self.digest,
                "image_shape": list(self.image_shape), "config": asdict(self.config),
                "train_seconds": self.train_seconds}

    def _load(self, path: str) -> None:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        self.state_dict, self.history = payload["state_dict"], payload["history"]
        self.image_shape = tuple(payload["image_shape"])
        self.train_seconds = float(payload.get("train_seconds", 0.0))
        self._net = None

    def save(self, folder: str) -> str:
        """Write the trained encoder into ``folder`` (the run folder) as encoder.pt."""
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, ENCODER_FILE)
        save_torch(path, self._payload())          # never a truncated encoder.pt
        return path

    def backbone(self) -> nn.Module:
        """The trained backbone (eval mode, CPU): e.g. to initialize a student."""
        if self.state_dict is None:
            raise RuntimeError("ContrastiveEncoder used before fit")
        if self._net is None:
            net = build_backbone(self.image_shape, self.config.dim, self.config.backbone)
            net.load_state_dict(self.state_dict)
            self._net = net.eval()
        return self._net

    @torch.no_grad()
    def transform(self, x: np.ndarray, batch_size: int = 1024) -> np.ndarray:
        net = self.backbone()
        xs = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
        if xs.shape[0] == 0:
            return np.zeros((0, self.dim), np.float32)
        out = [F.normalize(net(xs[i:i + batch_size]), dim=1) for i in range(0, xs.shape[0], batch_size)]
        return np.ascontiguousarray(torch.cat(out).numpy(), dtype=np.float32)

    def describe(self) -> dict:
        return {"encoder": self.name, "digest": self.digest, "cache_hit": self.cache_hit,
                "train_seconds": round(self.train_seconds, 2), "trainer": self.trainer,
                "final_loss": self.history[-1]["loss"] if self.history else None, **asdict(self.config)}

    def __getstate__(self):           # ship weights, not the progress callback or a built net
        state = self.__dict__.copy()
        state["progress"] = None
        state["_net"] = None
        return state

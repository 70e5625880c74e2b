"""A semi-supervised student on the whole public set (FixMatch-like), optionally
initialized from the contrastive encoder's backbone.

Every public sample carries a label derived from the released counts and a
confidence weight in [0, 1] (``label_confidence``: how likely the top class beats
the runner-up given the mechanism's noise, times how much the votes agree). Each
step takes a batch of public samples and minimizes

    sum_i w_i * CE(f(weak(x_i)), y_i) / B                        (weighted labels)
  + lambda_u * sum_i 1[max p_i >= tau] * CE(f(strong(x_i)), argmax p_i) / B
                                                                 (consistency)

with p_i = softmax(f(weak(x_i))) held fixed: confident predictions of the model
become targets for strongly augmented views (FixMatch), so the student also learns
from public samples whose released labels are weak. Targets may be ``hard``
(argmax labels, weighted), ``soft`` (distributions) or ``weighted`` (hard labels,
weights from the confidence). Only public inputs and the released labels are used.

:func:`semi_loop` is one :mod:`rknn_ray.training` loop: it runs in a one-worker Ray Train
``TorchTrainer`` (``trainer="ray"``) or in this process (``trainer="local"``).
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rknn_ray.representation.augment import strong_view, weak_view
from rknn_ray.student.config import SemiConfig       # declared torch-free, with every student key
from rknn_ray.training import one_cycle, run_loop
from rknn_ray.representation.contrastive import build_backbone
from rknn_ray.runio import save_torch

CHECKPOINT_FILE = "student.pt"


@dataclass
class SemiResult:
    test_accuracy: float
    epochs: int
    history: list = field(default_factory=list)
    checkpoint_path: str | None = None
    seconds: float = 0.0
    device: str = "cpu"
    num_workers: int = 1
    train_seconds: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def label_confidence(smoothed: np.ndarray, noise_std: float) -> np.ndarray:
    """(N,) in [0, 1]: P(top class beats the runner-up under Gaussian noise of ``noise_std``)
    times the top class's share of the positive votes. From released counts only."""
    c = np.asarray(smoothed, dtype=np.float64)
    srt = np.sort(c, axis=1)
    gap = srt[:, -1] - srt[:, -2]
    if noise_std > 0:
        beat = 0.5 * (1 + np.vectorize(math.erf)(gap / (2.0 * noise_std)))
    else:
        beat = (gap > 0).astype(np.float64) + 0.5 * (gap == 0)
    pos = np.clip(c, 0, None)
    share = np.where(pos.sum(1) > 0, pos.max(1) / np.maximum(pos.sum(1), 1e-12), 0.0)
    return (beat * np.sqrt(share)).astype(np.float32)


class BackboneClassifier(nn.Module):
    def __init__(self, backbone: nn.Module, dim: int, num_classes: int, dropout: float = 0.2):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Sequential(nn.Dropout(dropout), nn.Linear(dim, num_classes))

    def forward(self, x):
        return self.head(self.backbone(x))


def build_semi_model(image_shape, num_classes: int, encoder_meta: dict | None) -> nn.Module:
    """Backbone of the contrastive encoder's architecture (its weights if given) + linear head."""
    dim = int(encoder_meta["dim"]) if encoder_meta else 64
    backbone = build_backbone(image_shape, dim, encoder_meta.get("backbone", "auto") if encoder_meta else "auto")
    if encoder_meta and encoder_meta.get("state_dict") is not None:
        backbone.load_state_dict(encoder_meta["state_dict"])
    return BackboneClassifier(backbone, dim, num_classes)


def semi_loop(data: dict, cfg: dict, device="cpu", on_epoch=None) -> dict:
    """The semi student's loop (in-process or in a Ray Train worker); returns what student.pt
    holds (with the per-epoch ``history``)."""
    x = torch.as_tensor(data["x"])
    y = torch.as_tensor(data["targets"])
    w = torch.as_tensor(data["weight"], dtype=torch.float32)
    num_classes = int(data["num_classes"])
    torch.manual_seed(int(cfg["seed"]))
    model = build_semi_model(tuple(x.shape[1:]), num_classes, data.get("encoder")).to(device)
    pretrained = data.get("encoder") is not None and data["encoder"].get("state_dict") is not None
    scale = float(cfg["encoder_lr_scale"]) if pretrained else 1.0
    opt = torch.optim.AdamW([{"params": model.backbone.parameters(), "lr": cfg["lr"] * scale},
                             {"params": model.head.parameters(), "lr": cfg["lr"]}],
                            weight_decay=float(cfg["weight_decay"]))
    n = x.shape[0]
    bs = max(2, min(int(cfg["batch_size"]), n))
    steps = max(1, math.ceil(n / bs))
    epochs = int(cfg["epochs"])
    sched = one_cycle(opt, [cfg["lr"] * scale, cfg["lr"]], epochs * steps, pct_start=0.1)
    gen = torch.Generator().manual_seed(int(cfg["seed"]) + 29)
    flip, tau, lam = bool(cfg["flip"]), float(cfg["threshold"]), float(cfg["lambda_u"])
    soft = y.ndim == 2
    history = []
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(n, generator=gen)
        tot = torch.zeros(4, dtype=torch.float64)
        for i in range(steps):
            idx = order[i * bs:(i + 1) * bs]
            xb = x[idx]
            weak = weak_view(xb, gen, flip).to(device)
            strong = strong_view(xb, gen, flip).to(device)
            logits = model(torch.cat([weak, strong]))
            lw, ls = logits[:len(idx)], logits[len(idx):]
            yb, wb = y[idx].to(device), w[idx].to(device)
            if soft:
                per = -(yb * F.log_softmax(lw, 1)).sum(1)
            else:
                per = F.cross_entropy(lw, yb, reduction="none")
            sup = (per * wb).sum() / len(idx)
            with torch.no_grad():
                prob = F.softmax(lw.detach(), 1)
                conf, pseudo = prob.max(1)
                mask = (conf >= tau).float()
            unsup = (F.cross_entropy(ls, pseudo, reduction="none") * mask).sum() / len(idx)
            loss = sup + lam * unsup
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            tot += torch.tensor([float(sup.detach()), float(unsup.detach()), float(mask.mean()), 1.0],
                                dtype=torch.float64)
        row = {"epoch": epoch + 1, "train_loss": float((tot[0] + lam * tot[1]) / tot[3]),
               "sup_loss": float(tot[0] / tot[3]),
               "unsup_loss": float(tot[1] / tot[3]), "mask_rate": float(tot[2] / tot[3])}
        history.append(row)
        if on_epoch is not None:
            on_epoch(row)
    model = model.cpu().eval()
    meta = data.get("encoder") or {}
    return {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "history": history, "image_shape": list(x.shape[1:]), "num_classes": num_classes,
            "encoder_dim": int(meta.get("dim", 64)), "backbone": meta.get("backbone", "auto"),
            "device": str(device)}


def load_semi_student(path: str) -> nn.Module:
    if os.path.isdir(path):
        path = os.path.join(path, CHECKPOINT_FILE)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model = build_semi_model(tuple(payload["image_shape"]), int(payload["num_classes"]),
                             {"dim": payload["encoder_dim"], "backbone": payload["backbone"]})
    model.load_state_dict(payload["state_dict"])
    return model.eval()


@torch.no_grad()
def _accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, batch_size: int = 1024) -> float:
    xs = torch.as_tensor(np.ascontiguousarray(x, dtype=np.float32))
    if len(y) == 0:
        return float("nan")
    pred = torch.cat([model(xs[i:i + batch_size]).argmax(1) for i in range(0, len(xs), batch_size)])
    return float((pred.numpy() == np.asarray(y)).mean())


def train_semi_student(public_x: np.ndarray, targets: np.ndarray, weight: np.ndarray,
                       test_x: np.ndarray, test_y: np.ndarray, num_classes: int,
                       config: SemiConfig | None = None, encoder=None,
                       checkpoint_dir: str | None = None, progress=None) -> SemiResult:
    """Train on all public samples (labels + weights from the release); evaluate on ``test``.

    ``encoder``: a fitted rknn_ray.representation.contrastive.ContrastiveEncoder whose backbone
    initializes the student (else a fresh backbone of the same shape). ``targets``:
    (N,) int labels, or (N, |Y|) distributions for ``target="soft"``.
    """
    config = (config or SemiConfig()).validate()
    t0 = time.perf_counter()
    x = np.ascontiguousarray(public_x, dtype=np.float32)
    t = np.asarray(targets)
    if config.target == "soft":
        if t.ndim == 1:
            t = np.eye(num_classes, dtype=np.float32)[t]
        t = np.ascontiguousarray(t, dtype=np.float32)
    else:
        t = (t.argmax(1) if t.ndim == 2 else t).astype(np.int64)
    w = np.ones(len(x), np.float32) if weight is None or config.target == "hard" \
        else np.asarray(weight, dtype=np.float32)
    enc_meta = None
    if encoder is not None:
        enc_meta = {"dim": encoder.config.dim, "backbone": encoder.config.backbone,
                    "state_dict": encoder.state_dict}
    data = {"x": x, "targets": t, "weight": w, "num_classes": int(num_classes), "encoder": enc_meta}
    run = run_loop(semi_loop, data, asdict(config), trainer=config.trainer, name="semi student",
                   use_gpu=config.use_gpu, on_epoch=progress, trainer_key="represent.trainer")
    payload = run.payload
    train_seconds = time.perf_counter() - t0
    path = None
    if checkpoint_dir:
        os.makedirs(checkpoint_dir, exist_ok=True)
        path = os.path.join(checkpoint_dir, CHECKPOINT_FILE)
        save_torch(path, dict(payload))              # never a truncated student.pt
        model = load_semi_student(path)
    else:
        model = build_semi_model(tuple(payload["image_shape"]), num_classes,
                                 {"dim": payload["encoder_dim"], "backbone": payload["backbone"]})
        model.load_state_dict(payload["state_dict"])
        model.eval()
    acc = _accuracy(model, test_x, test_y)
    return SemiResult(acc, len(payload["history"]), payload["history"], path,
                      time.perf_counter() - t0, run.device, run.num_workers, train_seconds)

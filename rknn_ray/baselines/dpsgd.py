"""Noisy-SGD head: DP-SGD (Abadi et al. 2016) on a 1-2 layer head over the public-fitted
representation.

The encoder is fitted on public data only (free); a head (linear, or one hidden
ReLU layer) is trained on the private records' embeddings with Poisson-sampled
batches (rate q = batch/m), per-example gradients (``torch.func.vmap(grad)``)
clipped to L2 norm ``clip``, Gaussian noise N(0, (sigma clip)^2) added to their
sum, divided by the expected batch size. The head itself is the released model:
its accuracy on the evaluation split is the row's accuracy; ``label_accuracy`` is
how well it labels the public set.

Guarantee: record-level (eps, delta), add/remove-one record (the neighbour relation
of Poisson-subsampled Gaussian accounting). ``steps`` compositions of
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``, accounted with
``dp_accounting``'s RDP accountant (default) or its PLD accountant; sigma is
calibrated to the target eps at delta.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from rknn_ray.baselines.common import (privacy_generator, NEIGHBOUR_ADD_REMOVE, BaselineRow, BaselineSetup,
                                       Costing, baseline_row, calibrate_decreasing, event_cost,
                                       new_ledger, record)
from rknn_ray.baselines.events import dpsgd_event
from rknn_ray.baselines.private_knn import raw_upload_bytes

ACCOUNTANTS = ("rdp", "pld")


def dpsgd_epsilon(q: float, sigma: float, steps: int, delta: float, accountant: str = "rdp") -> float:
    """eps at ``delta``: the accountant's cost of the steps' event (``accountant``: rdp/pld)."""
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"accountant must be one of {ACCOUNTANTS}")
    return event_cost(dpsgd_event(q, sigma, steps), Costing(delta=delta, method=accountant))[0]


def calibrate_noise_multiplier(target_eps: float, q: float, steps: int, delta: float,
                               accountant: str = "rdp") -> float:
    return calibrate_decreasing(lambda s: dpsgd_epsilon(q, s, steps, delta, accountant),
                                target_eps, lo=0.3, hi=500.0, iters=30 if accountant == "pld" else 45)


def make_head(dim: int, num_classes: int, hidden: int = 0) -> torch.nn.Module:
    if hidden:
        return torch.nn.Sequential(torch.nn.Linear(dim, hidden), torch.nn.ReLU(),
                                   torch.nn.Linear(hidden, num_classes))
    return torch.nn.Linear(dim, num_classes)


def clipped_grad_sum(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, clip: float):
    """Sum over the batch of per-example gradients, each clipped to L2 norm ``clip``."""
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, yi.unsqueeze(0))

    per = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    norms = torch.sqrt(sum((g.reshape(g.shape[0], -1) ** 2).sum(1) for g in per.values()))
    scale = (clip / (norms + 1e-12)).clamp(max=1.0)
    return {k: (g * scale.view(-1, *([1] * (g.dim() - 1)))).sum(0) for k, g in per.items()}


def train_dpsgd(x: np.ndarray, y: np.ndarray, num_classes: int, sigma: float, q: float,
                steps: int, clip: float = 1.0, lr: float = 0.5, hidden: int = 0,
                seed: int = 0, noise_rng: np.random.Generator | None = None) -> torch.nn.Module:
    """DP-SGD: Poisson-subsampled batches and Gaussian noise both from ``noise_rng`` (the
    privacy randomness; a seeded one only for tests), model init seeded from ``seed``."""
    gen = noise_rng if noise_rng is not None else np.random.default_rng(seed)
    torch.manual_seed(seed)
    X = torch.as_tensor(x, dtype=torch.float32)
    Y = torch.as_tensor(y, dtype=torch.int64)
    model = make_head(X.shape[1], num_classes, hidden)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    expected = max(1.0, q * len(X))
    for _ in range(int(steps)):
        idx = np.flatnonzero(gen.random(len(X)) < q)
        sums = clipped_grad_sum(model, X[idx], Y[idx], clip) if idx.size else \
            {k: torch.zeros_like(v) for k, v in model.named_parameters()}
        opt.zero_grad()
        for k, p in model.named_parameters():
            noise = torch.from_numpy(gen.normal(0.0, sigma * clip, size=tuple(p.shape))
                                     .astype(np.float32))
            p.grad = (sums[k] + noise) / expected
        opt.step()
    return model


def run_dpsgd(setup: BaselineSetup, target_eps: float, delta: float = 1e-5, epochs: int = 15,
              batch_size: int = 64, clip: float = 1.0, lr: float = 0.5, hidden: int = 0,
              accountant: str = "rdp", seed: int | None = None, ledger=None) -> BaselineRow:
    """DP-SGD head at ``target_eps`` (sigma calibrated with the chosen accountant)."""
    t0 = time.perf_counter()
    seed = setup.cfg.run.seed if seed is None else seed
    sp = setup.splits
    m = len(sp.private_y)
    q = min(1.0, batch_size / m)
    steps = int(math.ceil(epochs / q))
    sigma = calibrate_noise_multiplier(target_eps, q, steps, delta, accountant)
    ledger = ledger or new_ledger()
    record(ledger, dpsgd_event(q, sigma, steps), Costing(delta=delta, method=accountant), "central",
           "dpsgd_head", "record", NEIGHBOUR_ADD_REMOVE,
           f"{steps} steps, q={q:.4g}, sigma={sigma:.4g}, clip={clip}, {accountant}", clip=clip)
    # feature scale from PUBLIC statistics only (free): centre and scale the embeddings
    mu = setup.public_emb.mean(0)
    sd = setup.public_emb.std(0).mean() + 1e-8
    norm = lambda a: ((a - mu) / sd).astype(np.float32)   # noqa: E731
    model = train_dpsgd(norm(setup.private_emb), sp.private_y, setup.num_classes, sigma, q, steps,
                        clip, lr, hidden, seed, noise_rng=privacy_generator(setup, 0, seed))
    with torch.no_grad():
        acc = float((model(torch.as_tensor(norm(setup.eval_emb))).argmax(1).numpy()
                     == sp.eval_y).mean())
        lab = float((model(torch.as_tensor(norm(setup.public_emb))).argmax(1).numpy()
                     == sp.public_y).mean())
    return baseline_row(
        setup, ledger, "dpsgd_head", target_eps, t0, unit="record",
        neighbour=NEIGHBOUR_ADD_REMOVE, accuracy=acc, label_accuracy=lab, rounds=steps,
        bytes_per_client=raw_upload_bytes(setup),
        details={"sigma": sigma, "q": q, "steps": steps, "clip": clip, "hidden": hidden,
                 "accountant": accountant, "epochs": epochs})

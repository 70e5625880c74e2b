"""Does the student's GPU path give the CPU path's results? (run where a GPU is present)

    python -m benchmarks.gpu_parity [--epochs 15] [--json]

Trains the real student (rknn_ray.student.train_student_local: its loop run by
rknn_ray.training's in-process runner, the loop every Ray Train worker runs) on sklearn's
digits with the same seed, data order and labels on the CPU and on CUDA, and compares:
first-epoch loss, final test accuracy, and the largest difference of the first forward
pass; the SimCLR encoder's loop and the semi-supervised student's loop (the same runner,
``use_gpu``) by their first-epoch losses and the semi student's test accuracy.
cuDNN kernels are not bit-identical to CPU ones, so the comparison is by tolerance, not
equality. Needs only torch, numpy and scikit-learn (no Ray, no faiss), so it runs on a bare
GPU image.
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from rknn_ray.student.config import SemiConfig


def run(epochs: int = 15) -> dict:
    import torch  # defers torch
    from sklearn.datasets import load_digits  # defers sklearn

    from rknn_ray.student.models import build_model  # defers torch
    from rknn_ray.representation.contrastive import ContrastiveEncoder
    from rknn_ray.student.semi import train_semi_student
    from rknn_ray.student.train import StudentConfig, train_student_local

    d = load_digits()
    x = (d.data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(y))
    tr, te = order[:1200], order[1200:]
    out = {"cuda": torch.cuda.is_available(), "torch": torch.__version__, "epochs": epochs}
    if not out["cuda"]:
        out["note"] = "no CUDA device: nothing to compare"
        return out
    out["device_name"] = torch.cuda.get_device_name(0)
    torch.manual_seed(0)
    model = build_model((1, 8, 8), 10, "auto").eval()
    with torch.no_grad():
        cpu_logits = model(torch.from_numpy(x[te])).numpy()
        gpu_logits = model.cuda()(torch.from_numpy(x[te]).cuda()).cpu().numpy()
    out["forward_max_abs_diff"] = float(np.abs(cpu_logits - gpu_logits).max())
    results = {}
    for dev in ("cpu", "cuda"):
        cfg = StudentConfig(epochs=epochs, batch_size=32, lr=2e-3, num_workers=1,
                            use_gpu=dev == "cuda", label_type="hard", seed=0)
        res = train_student_local(x[tr], y[tr], x[te], y[te], (1, 8, 8), 10, cfg)
        results[dev] = {"test_accuracy": res.test_accuracy, "device": res.device,
                        "first_epoch_loss": res.history[0]["train_loss"],
                        "final_loss": res.history[-1]["train_loss"],
                        "train_seconds": res.train_seconds}
        # cache_dir "": no encoder cache, so the CUDA run trains instead of loading the CPU one
        enc = ContrastiveEncoder(dim=32, epochs=2, batch_size=128, flip=False, trainer="local",
                                 cache_dir="", use_gpu=dev == "cuda").fit(x[tr])
        assert not enc.cache_hit
        results[dev]["encoder_first_loss"] = enc.history[0]["loss"]
        semi = train_semi_student(x[tr], y[tr], None, x[te], y[te], 10,
                                  SemiConfig(epochs=max(2, epochs // 3), trainer="local", seed=0,
                                             use_gpu=dev == "cuda", flip=False), encoder=enc)
        results[dev].update(semi_accuracy=semi.test_accuracy, semi_device=semi.device,
                            semi_first_loss=semi.history[0]["train_loss"])
    out["runs"] = results
    out["accuracy_gap"] = abs(results["cpu"]["test_accuracy"] - results["cuda"]["test_accuracy"])
    out["first_epoch_loss_gap"] = abs(results["cpu"]["first_epoch_loss"]
                                      - results["cuda"]["first_epoch_loss"])
    out["encoder_first_loss_gap"] = abs(results["cpu"]["encoder_first_loss"]
                                        - results["cuda"]["encoder_first_loss"])
    out["semi_accuracy_gap"] = abs(results["cpu"]["semi_accuracy"] - results["cuda"]["semi_accuracy"])
    out["semi_first_loss_gap"] = abs(results["cpu"]["semi_first_loss"]
                                     - results["cuda"]["semi_first_loss"])
    out["parity"] = bool(out["forward_max_abs_diff"] < 1e-4 and out["accuracy_gap"] <= 0.02
                         and out["first_epoch_loss_gap"] < 0.02
                         and out["encoder_first_loss_gap"] < 0.1
                         and out["semi_accuracy_gap"] <= 0.03 and out["semi_first_loss_gap"] < 0.1)
    return out



def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    res = run(args.epochs)
    print(json.dumps(res, indent=None if args.json else 2))
    return 0 if res.get("parity", True) else 1


if __name__ == "__main__":
    sys.exit(main())

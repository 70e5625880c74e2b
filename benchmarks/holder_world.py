"""Holders as their own OS processes against a shuffler service (tests and trials).

Builds on benchmarks/shuffler_world.py: a published encoder (predictor.json and
encoder.npz, a ``raw`` encoder over a three-column table), a single-message shuffle
specification whose claimed eps is what the project's accountant computes, one folder per
holder (its key and secret from ``holder keygen``, its own data file and ledger), the
holders' keys in the shuffler's registry. Each holder runs ``rknn-ray holder join`` under
:data:`HOLDER_SHIM`, which makes ``ray``, ``server``, ``shuffler``, ``actors`` and ``torch``
unimportable in its process and logs every attempt.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from benchmarks.shuffler_world import RUN_CLI, ROOT, World, block_finder, make_world
from holder.accountant import mechanism_of, own_cost
from holder.identity import keygen, load
from sealing.round_spec import EncoderFile

HOLDER_BLOCKED = ("ray", "server", "shuffler", "actors", "torch")
HOLDER_SHIM = block_finder(HOLDER_BLOCKED, "holder") + RUN_CLI
COLUMNS = ("x0", "x1", "x2")
CLASSES = ("no", "yes")


def publish_encoder(folder: Path) -> list[Path]:
    """predictor.json and encoder.npz of a raw encoder over :data:`COLUMNS` (pickle-free)."""
    folder.mkdir(parents=True, exist_ok=True)
    featurizer = {"columns": {"names": list(COLUMNS), "list_column": False, "categorical": []},
                  "shape": None, "mean": [0.0] * 3, "std": [1.0] * 3, "categories": {},
                  "scale": 1.0}
    spec = {"format": 1, "dataset": "holder-trial", "classes": list(CLASSES), "input_shape": [3],
            "student_input": "features", "encoder": {"name": "raw", "dim": 3},
            "encoder_file": "encoder.pkl",
            "table": {"featurizer": featurizer, "id": None, "label": "label"}, "method": "mlp"}
    (folder / "predictor.json").write_text(json.dumps(spec, sort_keys=True))
    with open(folder / "encoder.npz", "wb") as fh:
        np.savez(fh)
    return [folder / "predictor.json", folder / "encoder.npz"]


def encoder_files(paths: list[Path]) -> tuple[EncoderFile, ...]:
    return tuple(EncoderFile(p.name, hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_size)
                 for p in paths)


def shuffle_spec_changes(world_spec, files: list[Path], eps0: float, floor: int,
                         claimed_eps: float | None = None, round_: int = 0) -> dict:
    """Fields of a collision single-message shuffle specification at ``eps0`` whose claimed eps
    is the accountant's (rounded up) unless ``claimed_eps`` says otherwise."""
    queries = np.array([[-1, -1, -1], [1, 1, 1], [-1, 1, 0], [1, -1, 0]], np.float32)
    changes = dict(mechanism="collision", mechanism_params={"num_classes": 2,
                                                            "bound": "clones_numerical"},
                   eps0=float(eps0), min_senders=int(floor), k=2, queries=queries,
                   encoder=encoder_files(files), round=int(round_), eps=100.0)
    mech = mechanism_of(world_spec.replace(**changes), check_length=False)
    draft = world_spec.replace(**changes, payload_len=mech.message_size)
    changes["payload_len"] = mech.message_size
    own = own_cost(draft, mech).eps
    changes["eps"] = float(claimed_eps) if claimed_eps is not None else float(np.ceil(own * 1e4) / 1e4)
    return changes


def holder_rows(seed: int, n: int = 5) -> str:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    lines = ["x0,x1,x2,label"] + [f"{a:.4f},{b:.4f},{c:.4f},{CLASSES[int(a + b > 0)]}"
                                  for a, b, c in x]
    return "\n".join(lines) + "\n"


def make_holder_world(folder: str | Path, holders: int = 2, eps0: float = 1.0, floor: int = 2,
                      claimed_eps: float | None = None, closes_in: float = 600,
                      opens_in: float = -60,
                      round_: int = 0, reuse: list[Path] = ()) -> tuple[World, list[Path]]:
    """A world whose specification the holder program answers, and each holder's folder
    (``holders/holder<i>/``: ``key/``, ``data.csv``, ``ledger.db``, the layout ``holder
    join-many --holders-dir`` reads), registered with the shuffler; ``reuse``: holder
    folders of an earlier world that answer this one too (registered here as well)."""
    folder = Path(folder)
    files = publish_encoder(folder / "published")
    probe = make_world(folder / "probe", holders=1)
    changes = shuffle_spec_changes(probe.spec, files, eps0, floor, claimed_eps, round_)
    world = make_world(folder / "world", holders=1, registered=1, closes_in=closes_in,
                       opens_in=opens_in,
                       floor=floor, allowance=1, payload_len=changes["payload_len"],
                       spec_changes=changes, files=files)
    dirs = list(reuse)
    with open(world.holders_file, "a") as reg:
        for d in dirs:
            reg.write(load(d / "key").key_id + "\n")
        for i in range(holders - len(dirs)):
            d = folder / "holders" / f"holder{i}"
            reg.write(keygen(d / "key").key_id + "\n")
            (d / "data.csv").write_text(holder_rows(i))
            dirs.append(d)
    return world, dirs


def join_args(world: World, url: str, holder_dir: Path, *extra: str) -> list[str]:
    return ["holder", "join", url, "--cafile", str(world.certs.ca), "--key",
            str(holder_dir / "key"), "--data", str(holder_dir / "data.csv"), "--ledger",
            str(holder_dir / "ledger.db"), "--operator-key", str(world.operator_file), *extra]


def run_holder(world: World, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """``rknn-ray ARGS`` as its own process under :data:`HOLDER_SHIM`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "RKNN_BLOCK_LOG": str(world.folder / "holder-blocked.log")}
    return subprocess.run([sys.executable, "-c", HOLDER_SHIM, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def holder_blocked_attempts(world: World) -> list[str]:
    path = world.folder / "holder-blocked.log"
    return path.read_text().split() if path.exists() else []

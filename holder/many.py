"""Many holders in one process (trials and load tests): each still its own key, secret,
data file and ledger, exactly as ``holder join`` would run it; only the verified
specification, the checked encoder and the HTTPS connection are shared.

A holders folder has one subfolder per holder: ``key/`` (from ``holder keygen``), its data
(``data.csv`` or ``data.parquet``) and ``ledger.db``.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from holder.accountant import SpecRefused
from holder.identity import load
from holder.join import answer_round, published
from holder.ledger import Policy
from sealing.upload_client import Connection
from sealing.upload_wire import SUCCESS


@dataclass
class ManyJoined:
    holders: int = 0
    codes: Counter = field(default_factory=Counter)
    charged: int = 0
    retried: int = 0
    refused: list = field(default_factory=list)      # "holder: one line", one per refusal


def holder_folders(folder: str | os.PathLike) -> list[Path]:
    """The holder subfolders of ``folder`` (each with key/holder.key), sorted by name."""
    folder = Path(folder)
    found = sorted(p for p in folder.iterdir() if (p / "key" / "holder.key").is_file()) \
        if folder.is_dir() else []
    if not found:
        raise ValueError(f"--holders-dir: {folder} has no holder subfolder (each needs key/ from "
                         "'rknn-ray holder keygen', data.csv or data.parquet, and ledger.db)")
    return found


def _data_file(d: Path) -> Path:
    parquet = d / "data.parquet"
    return parquet if parquet.is_file() else d / "data.csv"


def join_many(url: str, cafile, folder, operator_key: bytes, policy: Policy,
              label: str | None = None, assume_collusion: bool = False,
              wait_s: float = 0.0) -> ManyJoined:
    """Every holder in ``folder`` answers the service's round; a refusal is one holder's."""
    folders = holder_folders(folder)
    spec, encoder = published(url, cafile, operator_key, wait_s)
    out = ManyJoined(holders=len(folders))
    conn = Connection(url, cafile)
    try:
        for d in folders:
            try:
                done = answer_round(url, cafile, spec, encoder, load(d / "key"), d / "key",
                                    str(_data_file(d)), str(d / "ledger.db"), policy, label,
                                    assume_collusion, conn)
            except (SpecRefused, ValueError) as exc:
                out.refused.append(f"{d.name}: {str(exc).strip().splitlines()[0]}")
                continue
            out.codes.update(done.codes)
            out.charged += done.charged
            out.retried += not done.charged
            if not all(c in SUCCESS for c in done.codes):
                out.refused.append(f"{d.name}: the service answered {sorted(set(done.codes))}")
    finally:
        conn.close()
    return out

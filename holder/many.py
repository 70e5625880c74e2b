"""Many holders in one process (trials and load tests): each still its own key, secret,
data file and ledger, exactly as ``holder join`` would run it; the verified specification,
the checked encoder, the queries' search and the HTTPS connection are shared, and each
holder's messages are the bytes it would make alone.

A holders folder has one subfolder per holder: ``key/`` (from ``holder keygen``), its data
(``data.csv`` or ``data.parquet``) and ``ledger.db``.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from holder import answer
from holder.accountant import SpecRefused
from holder.identity import load
from holder.join import prepare, published
from holder.ledger import Policy
from rknn_ray.errors import RknnError
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
    """Every holder in ``folder`` answers the service's round; a refusal is one holder's.
    The holders' messages are made together (holder.answer.payloads_many: each the bytes
    that holder makes alone), then each holder charges its own ledger, keeps and uploads."""
    folders = holder_folders(folder)
    spec, encoder = published(url, cafile, operator_key, wait_s)
    out = ManyJoined(holders=len(folders))
    turns = {}
    for d in folders:
        try:
            turns[d] = prepare(spec, encoder, load(d / "key"), d / "key", str(_data_file(d)),
                               str(d / "ledger.db"), policy, label, assume_collusion)
        except (SpecRefused, ValueError, RknnError) as exc:   # its ledger too: its refusal
            _refused(out, d, exc)
    fresh = [d for d, t in turns.items() if t.reports is None]
    together = dict(zip(fresh, _together(spec, [turns[d] for d in fresh])))
    conn = Connection(url, cafile)
    try:
        for d, turn in turns.items():
            try:
                if turn.reports is None:
                    msgs = together.get(d)
                    if msgs is None:           # answered alone: its own refusal, its own line
                        msgs = answer.payloads(spec, turn.mech, turn.identity, encoder, None,
                                               turn.labels, turn.inputs)
                    turn.sealed(answer.seal(spec, turn.identity, msgs))
                done = turn.send(url, cafile, conn)
            except SpecRefused as exc:
                _refused(out, d, turn.book.refuse(spec, str(exc)))
                continue
            except ValueError as exc:
                _refused(out, d, exc)
                continue
            out.codes.update(done.codes)
            out.charged += done.charged
            out.retried += not done.charged
            if not all(c in SUCCESS for c in done.codes):
                out.refused.append(f"{d.name}: the service answered {sorted(set(done.codes))}")
    finally:
        conn.close()
    return out


def _together(spec, turns: list) -> list:
    """Each holder's messages, made together; [] when any refuses (each then answers
    alone, so a refusal stays that holder's)."""
    if not turns:
        return []
    sizes = [len(t.labels) for t in turns]
    try:
        msgs = answer.payloads_many(spec, turns[0].mech, [t.identity for t in turns],
                                    np.concatenate([np.asarray(t.inputs).reshape(n, -1)
                                                    for t, n in zip(turns, sizes)]),
                                    np.concatenate([t.labels for t in turns]),
                                    np.concatenate([[0], np.cumsum(sizes)]))
    except (SpecRefused, ValueError):
        return []
    return msgs


def _refused(out: ManyJoined, d: Path, exc: Exception) -> None:
    out.refused.append(f"{d.name}: {str(exc).strip().splitlines()[0]}")

"""The released counts, saved the moment they are released: ``release.npz`` in the run folder.

Written atomically after every round (counts, that round's queries, its guarantee and
event, its counts of messages and rejects), so a job that fails after a release --
in labeling, in the student, on an interrupt -- can be finished from the saved release
with ``--resume RUN`` instead of spending budget on a new private round.
"""
from __future__ import annotations

import json
import os

import numpy as np

from rknn_ray.accounting.events import costed_from_dict, event_to_dict
from rknn_ray.mechanisms.base import Guarantee
from rknn_ray.labeling.queries import QuerySet
from rknn_ray.runio import RELEASE_FILE, atomic_path


def save_release(out_dir: str, job_id: str, dataset: str, rounds: list, query_sets: list,
                 selections: list | None = None) -> str:
    """All rounds released so far (overwrites the previous file, atomically); ``selections``:
    how each round's queries were chosen (public facts, for report.json's ``selection``)."""
    arrays = {}
    meta = {"job_id": job_id, "dataset": dataset, "rounds": [],
            "selections": list(selections or [])[:len(rounds)]}
    for t, (r, q) in enumerate(zip(rounds, query_sets)):
        arrays[f"counts_{t}"] = np.asarray(r.counts, np.float64)
        arrays[f"query_features_{t}"] = np.asarray(q.features, np.float32)
        arrays[f"query_public_index_{t}"] = np.asarray(q.public_index, np.int64)
        meta["rounds"].append({"guarantee": r.guarantee.to_dict(), "event": event_to_dict(r.event),
                               "mechanism": r.mechanism, "messages": r.messages,
                               "received": r.received, "clients": r.clients,
                               "rejected": r.rejected, "timings": r.timings,
                               "shuffler": r.shuffler,
                               "authenticated_senders": r.authenticated_senders,
                               "missing": r.missing, "keys_made_ahead": r.keys_made_ahead})
    arrays["meta"] = np.array(json.dumps(meta, default=float))
    path = os.path.join(out_dir, RELEASE_FILE)
    with atomic_path(path) as tmp:             # fsync'd before it is renamed into place
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    return path


def load_release(run_dir: str, public_emb: np.ndarray):
    """(job_id, dataset identity, rounds as RoundResult, their QuerySets) from a run folder."""
    from rknn_ray.job.session import RoundResult
    from rknn_ray.labeling.queries import nearest
    path = os.path.join(run_dir, RELEASE_FILE)
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        rounds, query_sets = [], []
        for t, m in enumerate(meta["rounds"]):
            feats = z[f"query_features_{t}"]
            _, assign = nearest(feats, public_emb, 1)
            query_sets.append(QuerySet(feats, z[f"query_public_index_{t}"],
                                       assign[:, 0].astype(np.int64), float("nan")))
            # a release saved before the bound was the accountant's choice: the event's bound
            event, legacy = costed_from_dict(m["event"])
            guarantee = Guarantee(**{"accounting": legacy or None, **m["guarantee"]})
            rounds.append(RoundResult(z[f"counts_{t}"], guarantee, event, m["mechanism"], m["messages"],
                                      m["received"], m["clients"], m["rejected"], m["timings"],
                                      m["shuffler"], m.get("authenticated_senders"),
                                      m.get("missing"), None, m.get("keys_made_ahead")))
    return meta["job_id"], meta["dataset"], rounds, query_sets


def load_selections(run_dir: str) -> list:
    """How each released round's queries were chosen (``[]`` for a release saved before
    this was recorded)."""
    with np.load(os.path.join(run_dir, RELEASE_FILE), allow_pickle=False) as z:
        return json.loads(str(z["meta"])).get("selections", [])

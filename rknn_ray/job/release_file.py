"""The released counts, saved the moment they are released: ``release.npz`` in the run folder.

Written atomically after every round (counts, that round's queries, its guarantee and
event, its counts of messages and rejects), so a job that fails after a release --
in labeling, in the student, on an interrupt -- can be finished from the saved release
with ``--resume RUN`` instead of spending budget on a new private round.

The file carries a tag (keyed BLAKE2b under the job's ledger's release key, kept in a file
of its own beside the ledger: :meth:`~rknn_ray.accounting.budget_store.BudgetStore.side_key`)
over every array in it:
counts, queries and meta. ``--resume`` checks it before anything else
(:func:`check_release`): an edited file, or one saved under another ledger, is refused,
since labels and a student built from changed counts would carry a guarantee they do not
have. A file saved before releases were tagged is refused too (a stripped tag must not
pass as an old file); docs/running.md says what to do with one.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os

import numpy as np

from rknn_ray.accounting.events import event_to_dict
from rknn_ray.errors import DataError, first_line
from rknn_ray.accounting.guarantee import Guarantee
from rknn_ray.labeling.queries import QuerySet, nearest
from rknn_ray.runio import RELEASE_FILE, atomic_path
from rknn_ray.job.session import RoundResult


#: the array that holds the file's tag; the purpose its key is derived for
TAG, TAG_PURPOSE = "tag", "release.npz"


def release_tag_key(store) -> bytes:
    """The key release.npz is tagged with: the job's ledger's release key (a BudgetStore's
    :meth:`~rknn_ray.accounting.budget_store.BudgetStore.side_key`), which read access to the
    ledger file does not give."""
    return store.side_key(TAG_PURPOSE)


def release_tag(key: bytes, arrays) -> str:
    """Keyed BLAKE2b over every array but the tag: its name, dtype, shape and bytes."""
    h = hashlib.blake2b(key=key, digest_size=32, person=b"rknn-release")
    for name in sorted(n for n in arrays if n != TAG):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode() + b"\0")
        h.update(a.tobytes())
    return "blake2b-" + h.hexdigest()


def save_release(out_dir: str, job_id: str, dataset: str, rounds: list, query_sets: list,
                 selections: list | None = None, *, key: bytes) -> str:
    """All rounds released so far (overwrites the previous file, atomically), tagged under
    ``key`` (:func:`release_tag_key`); ``selections``: how each round's queries were chosen
    (public facts, for report.json's ``selection``)."""
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
                               "missing": r.missing, "keys_made_ahead": r.keys_made_ahead,
                               "partial": r.partial})
    arrays["meta"] = np.array(json.dumps(meta, default=float))
    arrays[TAG] = np.array(release_tag(key, arrays))
    path = os.path.join(out_dir, RELEASE_FILE)
    with atomic_path(path) as tmp:             # fsync'd before it is renamed into place
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    return path


class ReleaseRefused(DataError):
    """A saved release.npz that cannot be finished as it is (unreadable, untagged, edited or
    another ledger's): its budget stays spent, and ``--resume`` will not help (failure.py says
    so instead of pointing there)."""


def check_release(run_dir: str, key: bytes) -> None:
    """Refuse (DataError, one line) a release.npz whose tag is missing or does not match
    its contents under ``key``: nothing is changed or deleted."""
    path = os.path.join(run_dir, RELEASE_FILE)
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same refusal
        # numpy's own words for a file that is no archive suggest loading it with pickle
        why = "not an .npz archive of arrays" if "pickle" in str(exc) else \
            f"{type(exc).__name__}: {first_line(exc, 120)}"
        raise ReleaseRefused(f"{path} cannot be read ({why}). Fix: restore the file from a "
                             "backup; its budget stays spent") from None
    if TAG not in arrays:
        raise ReleaseRefused(f"{path} carries no authentication tag (saved before release files "
                        "were tagged, or the tag was removed), so its counts cannot be checked. "
                        "Fix: finish it with the rknn-ray version that saved it, or start a new "
                        "run (its budget stays spent)")
    if not hmac.compare_digest(str(arrays[TAG]), release_tag(key, arrays)):
        raise ReleaseRefused(f"{path} fails its authentication tag: it was changed after it was "
                        "saved, or saved under another ledger. Fix: resume with the ledger the "
                        "job ran with (--ledger) and the file as the job saved it; an edited "
                        "release cannot be finished (its budget stays spent)")


def load_release(run_dir: str, public_emb: np.ndarray):
    """(job_id, dataset identity, rounds as RoundResult, their QuerySets) from a run folder."""
    path = os.path.join(run_dir, RELEASE_FILE)
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        rounds, query_sets = [], []
        for t, m in enumerate(meta["rounds"]):
            feats = z[f"query_features_{t}"]
            _, assign = nearest(feats, public_emb, 1)
            query_sets.append(QuerySet(feats, z[f"query_public_index_{t}"],
                                       assign[:, 0].astype(np.int64), float("nan")))
            # the guarantee's eps is recomputed from the round's event (what is saved beside
            # it is a cache); a release saved before the bound was the accountant's choice
            # carries it in the event
            guarantee = Guarantee.from_dict({**m["guarantee"], "event": m["event"]})
            event = guarantee.event
            rounds.append(RoundResult(z[f"counts_{t}"], guarantee, event, m["mechanism"], m["messages"],
                                      m["received"], m["clients"], m["rejected"], m["timings"],
                                      m["shuffler"], m.get("authenticated_senders"),
                                      m.get("missing"), None, m.get("keys_made_ahead"),
                                      m.get("partial")))
    return meta["job_id"], meta["dataset"], rounds, query_sets


def load_selections(run_dir: str) -> list:
    """How each released round's queries were chosen (``[]`` for a release saved before
    this was recorded)."""
    with np.load(os.path.join(run_dir, RELEASE_FILE), allow_pickle=False) as z:
        return json.loads(str(z["meta"])).get("selections", [])

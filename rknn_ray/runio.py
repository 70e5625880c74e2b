"""The run folder: atomic writes and the 'does not clobber another run' rule.

Every file is written to a temporary name in the same folder, flushed to disk (fsync)
and moved into place with ``os.replace`` (atomic on POSIX), so a crash or a full disk
never leaves a half-written report.json, release.npz or student.pt; a full disk is
reported as :class:`~rknn_ray.errors.OutOfSpaceError` naming the file.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tempfile

import numpy as np

from rknn_ray.errors import NO_SPACE, ConfigError, OutOfSpaceError

#: the process umask, read once (os.umask can only be read by setting it)
_UMASK = os.umask(0o022)
os.umask(_UMASK)

RUN_MARKER = "report.json"
INCOMPLETE_MARKER = "incomplete.json"
#: What a run writes: cleared by --overwrite so no file of the old run sits beside the new config.
RUN_FILES = ("report.json", "ledger.json", "labels.parquet", "release.npz", "summary.png",
             "student.pt", "history.json", "config.yaml", INCOMPLETE_MARKER, "report.html",
             "predictor.json", "encoder.npz")
RELEASE_FILE = "release.npz"
#: Ray Train's storage folders (student-<id>/) that a run may leave behind
TRAIN_STORAGE_PREFIX = "student-"


def write_private(path, data: bytes) -> None:
    """``data`` at ``path``, owner-only (0600) from its first byte, durable and atomic (a temp
    file in the same folder, fsynced, renamed over): key files, a holder's sealed reports."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(folder)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yield a temp path next to ``path``; on success move it onto ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=os.path.basename(path), dir=folder)
        os.close(fd)
        yield tmp
        _fsync_file(tmp)          # durable before it is visible under its name
        # mkstemp makes the file 0600; the finished file gets the mode a plain open() would
        # give it (0666 less the umask). Non-private diagnostics are guarded by their folder.
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
        _fsync_dir(folder)
    except OSError as exc:
        if exc.errno in NO_SPACE and not isinstance(exc, OutOfSpaceError):
            raise OutOfSpaceError(path, exc.strerror or "No space left on device") from None
        raise
    finally:
        if tmp and os.path.exists(tmp):
            os.unlink(tmp)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    """The rename itself survives a power cut only once the folder is synced (POSIX)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass                      # some file systems cannot sync a folder; the data is synced
    finally:
        os.close(fd)


def copy_file(src: str, path: str) -> None:
    """Copy ``src`` onto ``path`` atomically (a checkpoint is never left half-copied)."""
    with atomic_path(path) as tmp:
        shutil.copyfile(src, tmp)


def save_torch(path: str, obj) -> None:
    """``torch.save(obj)`` onto ``path`` atomically. Serialized in memory first and written
    with Python's own file calls: torch's C++ writer reports a full disk as a bare
    RuntimeError (``inline_container.cc``), this way it is an OSError naming the file
    (:class:`~rknn_ray.errors.OutOfSpaceError`) and no partial file is left."""

    import torch  # defers torch
    buf = io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        fh.write(buf.getbuffer())


def _jsonable(obj):
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (np.floating,)):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def write_json(path: str, data) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, default=_jsonable, allow_nan=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp, open(tmp, "w") as fh:
        fh.write(text)


def write_parquet(path: str, table) -> None:
    import pyarrow.parquet as pq  # defers pyarrow
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def unfinished_release(path: str) -> bool:
    """Whether the run folder holds a release.npz that no report.json finished: its budget is
    spent and only ``--resume`` can finish it. Only a report of that same release (its job
    id) finishes it: a malformed, foreign or half-edited report.json never hides a release,
    and an unreadable release counts as unfinished (it is never deleted by accident)."""
    release = os.path.join(path, RELEASE_FILE)
    if not os.path.isfile(release):
        return False
    try:
        with np.load(release, allow_pickle=False) as z:
            saved = json.loads(str(z["meta"]))["job_id"]
        with open(os.path.join(path, RUN_MARKER)) as fh:
            report = json.load(fh)
    except Exception:  # noqa: BLE001 - anything unreadable: the release is not known finished
        return True
    return not (isinstance(report, dict) and isinstance(saved, str)
                and report.get("job_id") == saved)


def prepare_run_dir(path: str, overwrite: bool = False, discard_release: bool = False,
                    replace_at_start: bool = False) -> str:
    """Create the run folder; refuse one that holds another run unless ``overwrite``.

    A folder whose release.npz was never finished holds budget already spent: it is
    pointed to ``--resume``, and ``overwrite`` deletes it only with ``discard_release``.
    ``replace_at_start``: the old run's files stay until the new job starts work (it calls
    :func:`clear_old_run` once its budget is reserved), so a job refused before that (its
    budget, its config, its ledger) leaves the old run as it was.
    """
    path = os.path.abspath(path)
    if os.path.isfile(path):
        raise ConfigError("--out", f"{path} is a file", "pass a folder path for the run")
    unresumed = unfinished_release(path)
    complete = not unresumed and os.path.exists(os.path.join(path, RUN_MARKER))
    if unresumed and not (overwrite and discard_release):
        raise ConfigError("--out", f"{path} holds a saved release (release.npz) that was never "
                          "finished: its privacy budget is already spent",
                          f"finish it with: python -m jobs.distill --resume {path}  (or, to delete "
                          "that release for good, --overwrite --discard-release)")
    if os.path.isdir(path) and os.listdir(path):
        if complete and not overwrite:
            raise ConfigError("--out", f"{path} already holds a run (report.json)",
                              "choose a new --out folder, or pass --overwrite to replace it")
        if not complete and not overwrite:
            raise ConfigError("--out", f"{path} exists and is not empty",
                              "choose a new or empty --out folder, or pass --overwrite")
    if overwrite and os.path.isdir(path) and not replace_at_start:
        clear_old_run(path)
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, ".write-test")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError("--out", f"cannot write the run folder {path} ({exc.strerror or exc})",
                          "choose a folder you can write to") from None
    return path


def clear_old_run(path: str) -> None:
    """Delete an earlier run's files from the folder (what ``--overwrite`` replaces)."""
    for name in RUN_FILES:
        if os.path.isfile(os.path.join(path, name)):
            os.unlink(os.path.join(path, name))
    shutil.rmtree(os.path.join(path, "diagnostics"), ignore_errors=True)
    remove_train_storage(path)


def remove_train_storage(path: str) -> None:
    """Ray Train's own storage folders (``student-<id>/``): the run keeps student.pt and
    history.json, so these copies only pile up."""
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if name.startswith(TRAIN_STORAGE_PREFIX) and os.path.isdir(full):
            shutil.rmtree(full, ignore_errors=True)


def mark_incomplete(path: str, reason: str, **facts) -> None:
    """Say in the run folder that this run did not finish, and why (report.json is never written)."""
    write_json(os.path.join(path, INCOMPLETE_MARKER),
               {"status": "incomplete", "reason": reason, **facts})

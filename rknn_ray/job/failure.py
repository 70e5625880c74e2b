"""A failed job, said once: one console line, and incomplete.json in its run folder.

incomplete.json tells the person what happened and what to do next, and that depends on
what was already paid for: a saved release is finished with ``--resume``; a release that
could not be saved, a round refused for too little cover, or a round that failed once its
reports may have reached the server stays counted in the ledger (rknn_ray.job.rounds settles
it); anything else released nothing.
"""
from __future__ import annotations

import json
import os
import re

from rknn_ray.errors import NO_SPACE, RknnError, first_line, refusal_line
from rknn_ray.job.release_file import ReleaseRefused
from rknn_ray.job.rounds import ReleaseNotSaved
from rknn_ray.job.session import CoverShortfall
from rknn_ray.runio import INCOMPLETE_MARKER, RELEASE_FILE, mark_incomplete

#: the prefix of a failure that is not one of ours (a bug): the CLI re-raises those
UNEXPECTED = "the job failed"


def failure_line(exc: BaseException) -> str:
    """A failure as one line: an error raised in a Ray actor as itself, not Ray's wrapping;
    a full disk as what to free."""
    cause = getattr(exc, "cause", None)
    if cause is not None and type(exc).__module__.startswith("ray"):
        exc = cause
    if isinstance(exc, RknnError):
        return refusal_line(exc)
    died = _party_died(exc)
    if died:
        return died
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        where = f" writing {exc.filename}" if exc.filename else ""
        return f"out of disk space{where} ({exc.strerror}). Fix: free space and re-run"
    if "database or disk is full" in str(exc):
        return f"out of disk space ({exc}). Fix: free space on the ledger's file system"
    return f"{UNEXPECTED}: {type(exc).__name__}: {first_line(exc)}"


def _party_died(exc: BaseException) -> str | None:
    """A party's process that died under the job (Ray's ActorDiedError: a kill, the OOM
    killer, a lost node) in one line naming it: the machine's doing, not a bug, so no
    traceback. Shards have their own words (rknn_ray.job.session.ShardLost)."""
    if type(exc).__name__ != "ActorDiedError" or not type(exc).__module__.startswith("ray"):
        return None
    text = str(exc)
    name, pid = re.search(r"class_name: (\S+)", text), re.search(r"\bpid: (\d+)", text)
    who = (name.group(1).rsplit(".", 1)[-1] if name else "a party's actor") \
        + (f", pid {pid.group(1)}" if pid else "")
    return (f"a party's process died under the job ({who}): it was killed, ran out of memory "
            "or lost its node. Fix: find what ended it (dmesg shows the OOM killer) and re-run")


def stage_words(progress) -> str | None:
    """The stage a failure left, in words ("round_0" is the first private round)."""
    stage = progress and (progress.failed_in or progress.current)
    if stage and stage.startswith("round_"):
        return f"private round {int(stage.split('_')[1]) + 1}"
    if stage == "ray_start":
        return "Ray's start"
    return stage or None


def record_incomplete(out: str, message: str, exc: BaseException) -> str:
    """Write incomplete.json (what happened, whether a release is saved, the next step);
    returns the rest of the console line. A full disk here costs one clause, not a traceback."""
    released = os.path.exists(os.path.join(out, RELEASE_FILE))
    lost = isinstance(exc, ReleaseNotSaved)
    if released and isinstance(exc, ReleaseRefused):    # --resume cannot finish this file
        next_step, said = ("its release.npz cannot be finished as it is (its budget stays "
                           "spent): restore the file the job saved (a backup) and resume, or "
                           "start a new run",
                           f"run folder {out} is marked incomplete; its release cannot be "
                           "finished as it is")
    elif released and not lost:
        next_step, said = (f"python -m jobs.distill --resume {out}",
                           f"run folder {out} is marked incomplete; its release is saved: finish "
                           f"it with --resume {out}")
    elif lost:
        next_step, said = ("free disk space; the lost release stays counted in the ledger",
                           f"run folder {out} is marked incomplete; the release was NOT saved "
                           "(its eps is counted in the ledger)")
    elif isinstance(exc, CoverShortfall):      # the server saw the reports: spent, but no counts out
        next_step, said = ("no counts were released and the round's eps stays counted in the "
                           "ledger; re-run as the reason says",
                           f"run folder {out} is marked incomplete; no counts were released (the "
                           "round was refused for labelling; its eps is counted in the ledger)")
    elif getattr(exc, "budget_kept", False):   # its clients may have randomized: spent
        next_step, said = ("no counts were saved and the round's eps stays counted in the "
                           "ledger; fix the cause and re-run",
                           f"run folder {out} is marked incomplete; no counts were saved (the "
                           "round's clients may have randomized: its eps is counted in the ledger)")
    else:
        next_step, said = ("nothing was released; fix the cause and re-run",
                           f"run folder {out} is marked incomplete; nothing was released")
    try:
        mark_incomplete(out, message, release_saved=released and not lost,
                        released_and_lost=lost, next_step=next_step, **_earlier_reasons(out))
    except OSError as werr:
        return said.replace(" is marked incomplete", "") + \
            f" (incomplete.json could not be written: {werr.strerror or werr})"
    return said + f" ({INCOMPLETE_MARKER})"


def _earlier_reasons(out: str) -> dict:
    """A failed --resume keeps the first failures' reasons (the last five) beside its own."""
    try:
        with open(os.path.join(out, INCOMPLETE_MARKER)) as fh:
            old = json.load(fh)
    except (OSError, ValueError):
        return {}
    if isinstance(old, dict) and old.get("reason"):
        return {"earlier_reasons": [*old.get("earlier_reasons", []), old["reason"]][-5:]}
    return {}

"""Ray Train's console noise, kept off the driver's and the workers' consoles.

Cosmetic only: each filter targets one known-harmless message (Ray 2.60's Train V2, and an
abseil mutex trace a worker may print) and, if a future Ray moves what it hooks, does nothing
(the message simply shows again).
"""
from __future__ import annotations

import logging
import re
from typing import Callable

_STATE_API_NOISE = "State API may be temporarily unavailable"
# abseil's mutex event trace ("[mutex.cc : 452] RAW: Lock blocking 0x...   @ 0x..."): three
# lines a Ray worker printed once in this project's CI runs (the README demo, 2026-11-26).
# Printed by abseil inside a third-party library (reported for other torch programs too),
# not by this job, and harmless
_ABSEIL_MUTEX_TRACE = re.compile(r"\[mutex\.cc : \d+\] RAW: (Lock blocking|Lock returning|Unlock) 0x")


def _noise(line: str) -> bool:
    return _STATE_API_NOISE in line or _ABSEIL_MUTEX_TRACE.search(line) is not None


class _DropStateApiNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return _STATE_API_NOISE not in record.getMessage()


def quiet_train_logs() -> None:
    """Hide Train V2's harmless 'State API may be temporarily unavailable' warnings.

    With the dashboard off, Train's detached ``PlacementGroupCleaner`` actor (logger
    ``ray.train.v2._internal.execution.controller.placement_group_cleaner``) polls the
    State API every second and warns each time. Those lines reach the driver through
    Ray's log forwarding, so the filter goes in two places: on that logger in this
    process (which is what a ``worker_process_setup_hook`` calling this does in every
    worker), and on the forwarded worker output this driver prints.
    """
    logger = logging.getLogger("ray.train.v2._internal.execution.controller.placement_group_cleaner")
    if not any(isinstance(f, _DropStateApiNoise) for f in logger.filters):
        logger.addFilter(_DropStateApiNoise())
    _filter_forwarded_worker_logs()


def _filter_forwarded_worker_logs() -> None:
    """Drop the noise lines (Train's State API warnings, abseil's mutex trace) from the worker
    output the driver prints (cosmetic; Ray-internal API).

    Ray hands each batch of forwarded worker lines to the handlers of
    ``ray._private.ray_logging.global_worker_stdstream_dispatcher``; we wrap them once.
    If a future Ray moves that object, nothing breaks: the warnings simply show again.
    """
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
        with dispatcher._lock:
            wrapped = []
            for name, handler in dispatcher.handlers:
                if not getattr(handler, "_rknn_quiet", False):
                    handler = _without_noise(handler)
                wrapped.append((name, handler))
            dispatcher.handlers = wrapped
    except Exception:  # noqa: BLE001 - purely cosmetic
        logging.getLogger(__name__).debug("could not filter forwarded Ray worker logs", exc_info=True)


def _without_noise(handler: Callable[[dict], None]) -> Callable[[dict], None]:
    cleaner = CleanerTracebackFilter()      # the same cleaner's known traceback (see there)

    def emit(data: dict) -> None:
        lines = data.get("lines")
        if lines and data.get("actor_name") == "PlacementGroupCleaner":
            lines = cleaner(data)
            if not lines:
                return
            data = {**data, "lines": lines}
        if lines and any(_noise(line) for line in lines):
            lines = [line for line in lines if not _noise(line)]
            if not lines:
                return
            data = {**data, "lines": lines}
        handler(data)
    emit._rknn_quiet = True  # type: ignore[attr-defined]
    return emit


class _BelowWarningFrom(logging.Filter):
    def __init__(self, name: str):
        super().__init__()
        self.logger_name = name

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name != self.logger_name or record.levelno >= logging.WARNING


class _OwnErrorTraceback(logging.Filter):
    """Train's "Error in training function" traceback of an error of ours (rknn_ray.errors,
    e.g. a full disk at the checkpoint): the driver says it in one line with its fix."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if not text.startswith("Error in training function"):
            return True
        lines = [line for line in text.splitlines() if line.strip()]
        return not lines[-1].startswith("rknn_ray.errors.")


def quiet_worker_console() -> None:
    """In a Train worker: keep Train's INFO lines that escape ``LoggingConfig`` off the console.

    Ray 2.60's ``ray/train/v2/_internal/execution/context.py`` names its logger by file
    path (``getLogger(__file__)``), so ``LoggingConfig(log_level="WARNING")`` does not
    reach its "Reporting training result ..." lines: they propagate to the root logger.
    The filter goes on the root's console handlers only, so Train's log files in Ray's
    log folder still get them. Warnings and errors still show, except the traceback of an
    error of ours, which the driver says in one line.
    """
    try:
        import ray.train.v2._internal.execution.context as train_context
        name = train_context.logger.name
    except Exception:  # noqa: BLE001 - another Ray: nothing to do
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
                and not any(isinstance(f, _BelowWarningFrom) for f in handler.filters):
            handler.addFilter(_BelowWarningFrom(name))
    try:
        import ray.train.v2._internal.util as train_util
        errors = train_util.logger
    except Exception:  # noqa: BLE001 - another Ray: its traceback simply shows
        return
    if not any(isinstance(f, _OwnErrorTraceback) for f in errors.filters):
        errors.addFilter(_OwnErrorTraceback())


CLEANER = "PlacementGroupCleaner"
CLEANER_NO_ADDRESS = "Found multiple active Ray instances"


class CleanerTracebackFilter:
    """Forwarded-log filter (driver side) for one known-harmless traceback of Train V2.

    With several local Ray instances on one host, Train's ``PlacementGroupCleaner`` actor
    cannot pick the State API address and its monitor thread dies with a traceback ending
    in ``ConnectionError: Found multiple active Ray instances``. With the dashboard off it
    cannot reach the State API either way (the same reason its 'State API may be
    temporarily unavailable' warnings are dropped), so locally nothing is lost. The
    traceback arrives split over several batches: lines from ``Exception in thread`` up
    to the exception line are held back, dropped if that line is the known one, and
    passed on otherwise. Every other line passes at once.
    """

    def __init__(self):
        self.held: dict = {}          # pid -> lines held back

    def __call__(self, data: dict) -> list[str]:
        lines = list(data.get("lines") or [])
        if data.get("actor_name") != CLEANER:
            return lines
        pid, out = data.get("pid"), []
        for line in lines:
            held = self.held.get(pid)
            if held is None:
                if line.startswith("Exception in thread"):
                    self.held[pid] = [line]
                else:
                    out.append(line)
                continue
            held.append(line)
            body = line.strip()
            if line[:1].isspace() or body.startswith(("Traceback", "File ")) or not body:
                continue
            del self.held[pid]                    # the exception line: decide
            if CLEANER_NO_ADDRESS not in line:
                out.extend(held)
        return out

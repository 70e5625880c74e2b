"""Ray Train's console noise, kept off the driver's and the workers' consoles.

Cosmetic only: each filter targets one known-harmless message (Ray 2.60's Train V2: its
State API warnings and two tracebacks, see :class:`KnownTracebackFilter`; and an abseil
mutex trace a worker may print) and, if a future Ray moves what it hooks, does nothing
(the message simply shows again).
"""
from __future__ import annotations

import contextlib

import logging
import re
from typing import Callable

_STATE_API_NOISE = "State API may be temporarily unavailable"
# abseil's mutex event trace ("[mutex.cc : 452] RAW: Lock blocking 0x...   @ 0x..."): three
# lines a Ray worker has printed in this project's CI runs (the README demo).
# Printed by abseil inside a third-party library (reported for other torch programs too),
# not by this job, and harmless
_ABSEIL_MUTEX_TRACE = re.compile(r"\[mutex\.cc : \d+\] RAW: (Lock blocking|Lock returning|Unlock) 0x")



#: wraps every forwarded worker line the console prints; the job layer, which owns the bars,
#: installs its own (rknn_ray.job.progress.console_write) through :func:`set_console_guard`
_console_guard = contextlib.nullcontext


def set_console_guard(guard) -> None:
    """``guard()``: a context manager around each forwarded line (clears and redraws bars)."""
    global _console_guard
    _console_guard = guard


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
        # Ray's private API: a Ray that moved it fails only this call
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
    known = {f.actor: f for f in (cleaner_traceback_filter(), controller_timeout_filter())}

    def emit(data: dict) -> None:
        lines = data.get("lines")
        known_traceback = known.get(data.get("actor_name"))
        if lines and known_traceback is not None:
            lines = known_traceback(data)
            if not lines:
                return
            data = {**data, "lines": lines}
        if lines and any(_noise(line) for line in lines):
            lines = [line for line in lines if not _noise(line)]
            if not lines:
                return
            data = {**data, "lines": lines}
        with _console_guard():          # above the job's bars, not inside one's line
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
        import ray.train.v2._internal.execution.context as train_context  # defers ray
        name = train_context.logger.name
    except Exception:  # noqa: BLE001 - another Ray: nothing to do
        return
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler) \
                and not any(isinstance(f, _BelowWarningFrom) for f in handler.filters):
            handler.addFilter(_BelowWarningFrom(name))
    try:
        import ray.train.v2._internal.util as train_util  # defers ray
        errors = train_util.logger
    except Exception:  # noqa: BLE001 - another Ray: its traceback simply shows
        return
    if not any(isinstance(f, _OwnErrorTraceback) for f in errors.filters):
        errors.addFilter(_OwnErrorTraceback())


CLEANER = "PlacementGroupCleaner"
CLEANER_NO_ADDRESS = "Found multiple active Ray instances"
CONTROLLER = "TrainController"
# Train's controller asks Ray's autoscaling coordinator for its workers' resources with a
# 5 s ray.get timeout, logs a warning with the whole traceback when that expires (an
# overloaded CPU: seen during the shuffle job on a shared 2-core machine), and carries on;
# Ray's own message says it is safe to ignore when transient
RESOURCE_REQUEST = ("Failed to send resource request", "Failed to cancel resource request")
GET_TIMEOUT = "GetTimeoutError"


class KnownTracebackFilter:
    """Forwarded-log filter (driver side) for one actor's known-harmless tracebacks.

    A traceback arrives split over several batches: from a line that ``starts`` it, lines
    are held back up to the exception line, then dropped if that line is ``harmless``,
    passed on whole otherwise (a real error stays visible). Every other line of the actor,
    and every line of other actors, passes at once.
    """

    def __init__(self, actor: str, starts: Callable[[str], bool], harmless: Callable[[str], bool]):
        self.actor, self.starts, self.harmless = actor, starts, harmless
        self.held: dict = {}          # pid -> lines held back

    def __call__(self, data: dict) -> list[str]:
        lines = list(data.get("lines") or [])
        if data.get("actor_name") != self.actor:
            return lines
        pid, out = data.get("pid"), []
        for line in lines:
            held = self.held.get(pid)
            if held is None:
                if self.starts(line):
                    self.held[pid] = [line]
                else:
                    out.append(line)
                continue
            held.append(line)
            body = line.strip()
            if line[:1].isspace() or body.startswith(("Traceback", "File ")) or not body:
                continue
            del self.held[pid]                    # the exception line: decide
            if not self.harmless(line):
                out.extend(held)
        return out


def cleaner_traceback_filter() -> KnownTracebackFilter:
    """Train V2's ``PlacementGroupCleaner`` with several local Ray instances on one host: it
    cannot pick the State API address and its monitor thread dies with a traceback ending in
    ``ConnectionError: Found multiple active Ray instances``. With the dashboard off it cannot
    reach the State API either way (the same reason its 'State API may be temporarily
    unavailable' warnings are dropped), so locally nothing is lost."""
    return KnownTracebackFilter(CLEANER, lambda line: line.startswith("Exception in thread"),
                                lambda line: CLEANER_NO_ADDRESS in line)


def controller_timeout_filter() -> KnownTracebackFilter:
    """Train's ``TrainController`` warning that its resource request to Ray's autoscaling
    coordinator timed out (``GetTimeoutError`` under CPU load), with its traceback: the
    controller carries on and the job is unaffected. Another exception there still shows."""
    return KnownTracebackFilter(CONTROLLER, lambda line: any(m in line for m in RESOURCE_REQUEST),
                                lambda line: GET_TIMEOUT in line)

"""SIGINT and SIGTERM end a job the way any failure does: with a record, not a dump.

``install()`` makes both signals raise :class:`JobInterrupted` in the driver's main
thread (a ``KeyboardInterrupt``, so every ``except``/``finally`` on the way runs: the
ledger keeps a reservation that may have been spent, the run folder gets
``incomplete.json``, Ray is shut down). ``ray.init`` installs its own SIGTERM handler
(``sys.exit``), so the job calls ``install()`` again once Ray is up; Ray Train's SIGINT
handler never appears because the student's ``fit()`` runs off the main thread
(:func:`rknn_ray.training.ray_train.fit_off_main_thread`). Exit codes follow the shell:
128 + the signal number (130 for SIGINT, 143 for SIGTERM). An interrupt Python drops
(raised inside a weakref callback or ``__del__``) is raised again at the next safe point
(:mod:`rknn_ray.interrupts`).
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from rknn_ray import interrupts
# the exception a signal raises; the received/lost state lives beside it (layer 1), where the
# training code can check for an interrupt Python dropped
from rknn_ray.interrupts import JobInterrupted  # noqa: F401 - the CLIs' name for it

HANDLED = (signal.SIGINT, signal.SIGTERM)


def _raise(signum, _frame):
    interrupts.note_received(signum)
    ignore_further()        # the first signal ends the job; a second must not cut its record short
    raise JobInterrupted(signum)


def install() -> bool:
    """Route SIGINT and SIGTERM to :class:`JobInterrupted` (main thread only; else a no-op),
    and keep one that Python drops as unraisable (:mod:`rknn_ray.interrupts`)."""
    global _previous_hook
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in HANDLED:
        signal.signal(sig, _raise)
    if sys.unraisablehook is not _unraisable:
        _previous_hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    return True


_previous_hook = sys.__unraisablehook__


def _unraisable(unraisable) -> None:
    """An interrupt raised inside a weakref callback or ``__del__`` is kept for
    :func:`rknn_ray.interrupts.raise_pending`, not printed; anything else goes on as before."""
    if not interrupts.note_lost(unraisable.exc_value):
        _previous_hook(unraisable)


@contextlib.contextmanager
def handled():
    """:func:`install` for the duration of a block; the previous handlers come back after."""
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in HANDLED} if main else {}
    hook = sys.unraisablehook
    interrupts.reset()
    install()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if main:
            sys.unraisablehook = hook
        interrupts.reset()


def ignore_further() -> None:
    """While the job writes its record after a signal (ledger, incomplete.json, Ray's
    shutdown), a second Ctrl-C is ignored; ``kill -9`` still ends it at once."""
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


def as_interrupt(exc: BaseException) -> JobInterrupted | None:
    """The interrupt behind ``exc``: itself; a bare KeyboardInterrupt (the signal our handler
    saw, which Ray's ``ray.get`` re-raises bare; else SIGINT); an interrupt in its chain of
    causes (Python wraps one raised inside ``__set_name__`` in a RuntimeError, as a class
    body run by an import can be); or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, JobInterrupted):
            return exc
        if isinstance(exc, KeyboardInterrupt):   # ours, re-raised bare by Ray, or a plain Ctrl-C
            received = interrupts.received
            return JobInterrupted(received if received is not None else signal.SIGINT)
        exc = exc.__cause__ or exc.__context__
    return None


def reader_gone() -> int:
    """A command's reader closed the pipe (``rknn-ray budget | head``): stop writing, quietly,
    and exit as a shell tool killed by SIGPIPE does (141). stdout is pointed at /dev/null so
    Python's own flush at exit does not raise the same error again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):      # no real stdout (a test's capture): nothing to flush
        pass
    return 128 + signal.SIGPIPE

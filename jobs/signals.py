"""SIGINT and SIGTERM end a job the way any failure does: with a record, not a dump.

``install()`` makes both signals raise :class:`JobInterrupted` in the driver's main
thread (a ``KeyboardInterrupt``, so every ``except``/``finally`` on the way runs: the
ledger keeps a reservation that may have been spent, the run folder gets
``incomplete.json``, Ray is shut down). ``ray.init`` installs its own SIGTERM handler
(``sys.exit``), so the job calls ``install()`` again once Ray is up; Ray Train's SIGINT
handler never appears because the student's ``fit()`` runs off the main thread
(:func:`rknn_ray.training.ray_train.fit_off_main_thread`). Exit codes follow the shell:
128 + the signal number (130 for SIGINT, 143 for SIGTERM).
"""
from __future__ import annotations

import contextlib
import signal
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM)


class JobInterrupted(KeyboardInterrupt):
    """The driver received SIGINT or SIGTERM."""

    def __init__(self, signum: int = signal.SIGINT):
        self.signum = int(signum)
        super().__init__(self.name)

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __reduce__(self):
        return (type(self), (self.signum,))


#: the signal this process received, if any: Ray's blocking calls (``ray.get``) turn the
#: exception our handler raises into a bare ``KeyboardInterrupt``, whatever the signal was
received: int | None = None


def _raise(signum, _frame):
    global received
    received = int(signum)
    ignore_further()        # the first signal ends the job; a second must not cut its record short
    raise JobInterrupted(signum)


def install() -> bool:
    """Route SIGINT and SIGTERM to :class:`JobInterrupted` (main thread only; else a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in HANDLED:
        signal.signal(sig, _raise)
    return True


@contextlib.contextmanager
def handled():
    """:func:`install` for the duration of a block; the previous handlers come back after."""
    main = threading.current_thread() is threading.main_thread()
    before = {sig: signal.getsignal(sig) for sig in HANDLED} if main else {}
    install()
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def ignore_further() -> None:
    """While the job writes its record after a signal (ledger, incomplete.json, Ray's
    shutdown), a second Ctrl-C is ignored; ``kill -9`` still ends it at once."""
    if threading.current_thread() is threading.main_thread():
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_IGN)


def as_interrupt(exc: BaseException) -> JobInterrupted | None:
    """The interrupt behind ``exc``: itself; a bare KeyboardInterrupt (the signal our handler
    saw, which Ray's ``ray.get`` re-raises bare; else SIGINT); or None."""
    if isinstance(exc, JobInterrupted):
        return exc
    if isinstance(exc, KeyboardInterrupt):   # ours, re-raised bare by Ray, or a plain Ctrl-C
        return JobInterrupted(received if received is not None else signal.SIGINT)
    return None

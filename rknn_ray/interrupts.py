"""The interrupt a job received, and the one Python lost on the way.

A signal handler's exception is raised at whatever bytecode the main thread runs. When
that is a weakref callback or a ``__del__`` (both run at arbitrary points), Python prints
"Exception ignored" and drops it: the job would run on to the end after a Ctrl-C (seen
here: a SIGINT during the student's start-up finished the job with exit 0). So
:func:`note_lost` (installed as ``sys.unraisablehook`` by ``jobs.signals``) keeps such an
interrupt, and :func:`raise_pending` raises it again at the next safe point: a stage's
start or end, a progress bar's step, the student's fit wait. This module is the library's
half (layer 1, so the training code can check it); ``jobs.signals`` installs the handlers.
"""
from __future__ import annotations

import signal
import threading


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
#: an interrupt whose exception Python dropped (see the module doc); raised again once
_lost: int | None = None


def note_received(signum: int) -> None:
    global received
    received = int(signum)


def note_lost(exc: BaseException) -> bool:
    """Keep an interrupt Python could not raise (an unraisable exception); True if it was one."""
    global _lost
    if not isinstance(exc, KeyboardInterrupt):
        return False
    _lost = exc.signum if isinstance(exc, JobInterrupted) else (received or signal.SIGINT)
    return True


def raise_pending() -> None:
    """Raise, once, an interrupt Python dropped; a no-op otherwise (call at safe points only,
    never from cleanup code: an interrupt that propagates normally is not raised twice)."""
    global _lost
    if _lost is not None and threading.current_thread() is threading.main_thread():
        signum, _lost = _lost, None
        raise JobInterrupted(signum)


def reset() -> None:
    """Forget any received or lost interrupt (a new job in the same process)."""
    global received, _lost
    received = _lost = None

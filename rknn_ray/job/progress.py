"""Progress for long jobs: stage lines, live bars, stage timings (stderr; stdout stays clean).

Three modes, chosen once per job (:meth:`Progress.for_console`):

- ``bars``: a terminal. Each long stage gets a ``tqdm`` bar (clients sealed, messages
  shuffled, reports opened, student epochs with the latest loss and accuracy) sized to
  the terminal's width; ordinary lines are written above the bars, wrapped to that width.
  Every redraw clears the rest of its line, so a bar that closes or moves leaves no
  fragment of a longer line drawn there before, and Ray's forwarded worker lines are
  printed above the bars too (:func:`console_write`).
- ``lines``: ``--quiet``, or stderr is not a terminal (a log file, CI, ``ray job
  submit``). No bars: a plain line when a bar starts, then at most one every
  ``interval`` seconds, and one when it ends.
- ``log``: a library user's job (:meth:`Progress.for_library`, what ``run(cfg)`` uses
  unless handed a Progress): the same lines as ``lines``, as INFO records of the
  ``rknn_ray.job`` logger (the standard :mod:`logging` module; the ``rknn_ray`` logger has
  a NullHandler, so nothing shows until the application configures logging).
- ``off``: ``run.progress: false``. Nothing is printed; timings are still kept.

Bars are updated from driver threads that see the actors' work as it happens (the
shards' streaming generators, the Server's count of opened reports, Ray Train's
per-epoch reports relayed by :mod:`rknn_ray.training.live`); :meth:`Bar.update` and
:meth:`Bar.set` are thread-safe.
"""
from __future__ import annotations

import io
import logging
import os
import sys
import textwrap
import threading
import time
import weakref
from contextlib import contextmanager

from tqdm import tqdm

from rknn_ray import interrupts

__all__ = ["LOGGER", "MODES", "Bar", "EpochBar", "NullBar", "PolledBar", "Progress", "bar_for",
           "console_write"]

MODES = ("bars", "lines", "log", "off")
#: where a library user's job says what it does (``log`` mode)
LOGGER = logging.getLogger("rknn_ray.job")
logging.getLogger("rknn_ray").addHandler(logging.NullHandler())   # a library's convention
#: erase from the cursor to the end of the line (ANSI; every terminal tqdm draws on has it)
CLEAR_LINE = "\x1b[K"
#: the Progress objects that draw bars now (console_write hides their bars for other output)
_DRAWING: "weakref.WeakSet[Progress]" = weakref.WeakSet()


class Progress:
    def __init__(self, enabled: bool = True, stream=None, mode: str | None = None,
                 interval: float = 5.0, clock=time.perf_counter):
        self.stream = stream or sys.stderr
        if mode is None:
            mode = "off" if not enabled else ("bars" if _is_tty(self.stream) else "lines")
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}: use one of {MODES}")
        self.mode = mode
        self.enabled = mode != "off"
        self.interval = float(interval)
        self._clock = clock
        self.t0 = clock()
        self.timings: dict[str, float] = {}
        self._untimed = 0.0                  # seconds spent in untimed() spans, never reported
        self._span_start: float | None = None
        self._open: list[str] = []           # stages running now (outermost first)
        #: stage -> names of the untimed spans it contained (names only, never durations)
        self.untimed_spans: dict[str, list[str]] = {}
        self.current: str | None = None     # the stage running now
        self.failed_in: str | None = None   # the stage a failure left (an interrupt names it)
        self._bars: list[Bar] = []
        self._lock = threading.RLock()
        #: what tqdm draws on (bars mode): the stream, each redraw clearing its whole line
        self.bar_stream = _ClearingStream(self.stream) if mode == "bars" else self.stream

    @classmethod
    def for_console(cls, enabled: bool = True, quiet: bool = False, stream=None) -> "Progress":
        """Bars on a terminal; plain periodic lines with ``quiet`` or without a terminal."""
        if not enabled:
            return cls(False, stream)
        return cls(True, stream, mode="lines" if quiet else None)

    @classmethod
    def for_library(cls, enabled: bool = True) -> "Progress":
        """Lines as records of the ``rknn_ray.job`` logger (``run.progress: false``: none)."""
        return cls(enabled, mode="log" if enabled else "off")

    def elapsed(self) -> float:
        """Seconds since the start, untimed spans left out (the console's clock stands still
        during one)."""
        now, since = self._clock(), self._span_start
        return now - self.t0 - self._untimed - (now - since if since is not None else 0.0)

    @contextmanager
    def untimed(self, name: str):
        """A span that no stage timing and no console timestamp includes: the release,
        whose exact noise sampler runs longer the larger the noise it draws."""
        start = self._span_start = self._clock()
        try:
            yield
        finally:
            self._untimed += self._clock() - start
            self._span_start = None
            for stage in self._open:
                self.untimed_spans.setdefault(stage, []).append(name)

    def say(self, msg: str) -> None:
        if not self.enabled:
            return
        if self.mode == "log":
            LOGGER.info(msg.strip(), extra={"elapsed_s": round(self.elapsed(), 1)})
            return
        line = f"[{self.elapsed():7.1f}s] {msg}"
        if self.mode == "bars":
            line = _fit(line, _term_width(self.stream))
        with self._lock:
            if any(b._tqdm is not None for b in self._bars):
                tqdm.write(line, file=self.bar_stream)
            else:
                print(line, file=self.stream, flush=True)

    @contextmanager
    def stage(self, name: str, what: str | None = None):
        # the stage is current before its first line: an interrupt that lands while the line
        # is written (a reader that signals on seeing it) still names this stage
        interrupts.raise_pending()          # a stage's bounds are safe points (rknn_ray.interrupts)
        start, skipped = self._clock(), self._untimed
        self._open.append(name)
        outer, self.current = self.current, name
        try:
            self.say(f"{what or name} ...")
            yield
        except BaseException:
            self.failed_in = self.failed_in or name      # the innermost stage a failure left
            raise
        finally:
            self._open.remove(name)
            self.current = outer
        interrupts.raise_pending()
        took = self._clock() - start - (self._untimed - skipped)
        self.timings[name] = self.timings.get(name, 0.0) + took
        self.say(f"{what or name} done in {took:.1f}s")

    def bar(self, desc: str, total: int | None = None, unit: str = "it",
            bar_format: str | None = None) -> "Bar":
        """A live bar (or periodic lines); close it, or use it as a context manager."""
        bar = Bar(self, desc, total, unit, bar_format)
        with self._lock:
            self._bars.append(bar)
            if bar._tqdm is not None:
                _DRAWING.add(self)
        return bar

    def epochs(self, total: int) -> "EpochBar":
        """A bar over the student's epochs; ``__call__(row)`` takes one epoch's metrics."""
        return EpochBar(self.bar("student epochs", total, "epoch", bar_format=EPOCH_BAR))

    def _closed(self, bar: "Bar") -> None:
        with self._lock:
            if bar in self._bars:
                self._bars.remove(bar)
            if not any(b._tqdm is not None for b in self._bars):
                _DRAWING.discard(self)


@contextmanager
def console_write():
    """Around output that another party writes to the console (Ray's forwarded worker
    lines, rknn_ray.training.logs): open bars are cleared first and drawn again below it,
    so the output neither lands in a bar's line nor leaves a bar's fragment."""
    drawing = [p for p in list(_DRAWING) if p._bars]
    if not drawing:
        yield
        return
    with drawing[0]._lock, tqdm.external_write_mode(file=drawing[0].bar_stream):
        yield


class _ClearingStream:
    """The stream tqdm draws on, each carriage return followed by clear-to-end-of-line:
    tqdm pads a redraw only to its own bar's last width, so a bar drawn (or moved) onto a
    line that held a longer one kept that line's tail (``reports/s]gs/s]``)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str):
        return self._stream.write(text.replace("\r", "\r" + CLEAR_LINE))

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _fit(line: str, width: int) -> str:
    """A console line wrapped at words to the terminal's ``width`` (0: unknown, as is), its
    continuation lines indented under the text after the timestamp."""
    if width <= 0 or len(line) < width:
        return line
    indent = " " * (line.index("] ") + 2 if line.startswith("[") and "] " in line else 0)
    return textwrap.fill(line, width=max(width - 1, len(indent) + 20), subsequent_indent=indent,
                         break_on_hyphens=False)


#: the student's bar: no rate (seconds per epoch says nothing the elapsed time does not) and
#: the latest metrics after the times, so an 80-column terminal still shows the bar
EPOCH_BAR = "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
#: the bar's short names for the epoch rows' metrics (lines mode keeps the full names)
SHORT_METRICS = {"train_loss": "loss", "train_accuracy": "acc"}


class Bar:
    """One stage's counter: a tqdm bar in ``bars`` mode, periodic lines in ``lines`` mode."""

    def __init__(self, progress: Progress, desc: str, total: int | None, unit: str,
                 bar_format: str | None = None):
        self.progress, self.desc, self.total, self.unit = progress, desc, total, unit
        self.n = 0
        self.postfix = ""
        self.closed = False
        self._lock = threading.Lock()
        self._last_line = None
        self._said = None
        self._tqdm = None
        if progress.mode == "bars":
            width = _term_width(progress.stream)      # 0: a terminal that reports no size
            self._tqdm = tqdm(total=total, desc=f"  {desc}", unit=f" {unit}",
                              file=progress.bar_stream, leave=True, dynamic_ncols=width > 0,
                              ncols=None if width > 0 else 100, mininterval=0.2,
                              bar_format=bar_format,
                              unit_scale=total is not None and total >= 10_000)

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.set(self.n + int(n))

    def set(self, n: int, postfix: str | None = None) -> None:
        """Move the counter to ``n`` (absolute: suits values polled from an actor)."""
        with self._lock:
            if self.closed:
                return
            n = int(n) if self.total is None else min(int(n), int(self.total))
            step, self.n = n - self.n, n
            if postfix is not None:
                self.postfix = postfix
            if self._tqdm is not None:
                if postfix is not None:
                    self._tqdm.set_postfix_str(postfix, refresh=False)
                if step > 0:
                    self._tqdm.update(step)
                elif postfix is not None:
                    self._tqdm.refresh()
                return
            if self._said is None and self.n == 0 and not self.postfix:
                return          # a counter that has not moved yet says nothing (a polled one
                                # printed "reports opened: 0" while the clients still sealed)
            now = time.perf_counter()
            if self.progress.enabled and (self._last_line is None
                                          or now - self._last_line >= self.progress.interval):
                self._last_line = now
                self._said = self._line()
                self.progress.say(self._said)

    def _line(self) -> str:
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        return f"  {self.desc}: {count} {self.unit}{pct}" + (f", {self.postfix}" if self.postfix else "")

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._tqdm is not None:
                self._tqdm.close()
        if self._tqdm is None and self.progress.enabled and self._line() != self._said:
            self.progress.say(self._line())     # the final count, unless just printed
        self.progress._closed(self)


class EpochBar:
    """Feeds per-epoch metric rows (``{"epoch", "train_loss", "train_accuracy"}``) to a bar."""

    def __init__(self, bar: Bar):
        self.bar = bar
        self.rows: list[dict] = []
        self.times: list[float] = []      # seconds since the job started, per row received

    def __call__(self, row: dict) -> None:
        self.rows.append(dict(row))
        self.times.append(self.bar.progress.elapsed())
        names = SHORT_METRICS if getattr(self.bar, "_tqdm", None) is not None else {}
        extra = ", ".join(f"{names.get(k, k)} {v:.4g}" if isinstance(v, float)
                          else f"{names.get(k, k)} {v}" for k, v in row.items() if k != "epoch")
        self.bar.set(int(row.get("epoch", len(self.rows))), postfix=extra)

    def __enter__(self) -> "EpochBar":
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()


def _term_width(stream) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):
        return 0


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class NullBar:
    """What :func:`bar_for` gives when there is no Progress at all."""

    n = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def update(self, n: int = 1) -> None:
        pass

    def set(self, n: int, postfix: str | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def bar_for(progress: Progress | None, desc: str, total: int | None = None, unit: str = "it"):
    """``progress.bar(...)``, or a bar that does nothing when ``progress`` is None."""
    return progress.bar(desc, total, unit) if progress is not None else NullBar()


class PolledBar:
    """Sets ``bar`` from ``poll()`` (e.g. a count an actor keeps) every ``interval`` s.

    The thread stops at :meth:`close`, which sets the final value when given. A poll
    that fails is skipped: progress never fails a job.
    """

    def __init__(self, bar, poll, interval: float = 0.5):
        self.bar, self.poll, self.interval = bar, poll, float(interval)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rknn-progress-poll", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                value = self.poll()
            except Exception:  # noqa: BLE001 - cosmetic
                continue
            if self._stop.is_set():
                return
            self.bar.set(value)

    def close(self, final: int | None = None) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        if final is not None:
            self.bar.set(final)
        self.bar.close()

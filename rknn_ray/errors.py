"""Errors a person can act on: each names the problem and the fix.

Every error here pickles to itself (``__reduce__``): one raised inside a Ray actor must
reach the driver as the same error with the same one-line message, not as Ray's
``UnserializableException`` wrapped in pages of tracebacks.
"""
import errno
import os


class RknnError(Exception):
    """Base class for errors raised deliberately by rknn-ray."""


class ConfigError(RknnError, ValueError):
    """An invalid configuration value; raised before any expensive work starts."""

    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"config '{key}': {problem}. Fix: {fix}")

    def __reduce__(self):
        return (type(self), (self.key, self.problem, self.fix))


class DataError(RknnError, ValueError):
    """Input data that cannot be used (missing files, NaN features, bad labels)."""


class PrivacyBudgetError(RknnError):
    """A release was refused because it would break the privacy target or budget."""


class ReportError(RknnError):
    """A sealed report that could not be opened or decoded (counted, never fatal)."""

    def __init__(self, kind: str, detail: str = ""):
        self.kind, self.detail = kind, detail
        super().__init__(f"{kind}: {detail}" if detail else kind)

    def __reduce__(self):
        return (type(self), (self.kind, self.detail))


#: errno values that mean "the disk (or the quota) is full"
NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class OutOfSpaceError(RknnError, OSError):
    """A file could not be written because the disk (or quota) is full; names the file."""

    def __init__(self, path: str, strerror: str = "No space left on device"):
        self.path = path
        RknnError.__init__(self, f"out of disk space writing {path} ({strerror}). Fix: free space "
                                 f"on that file system (df -h {os.path.dirname(path) or '.'}) or "
                                 "choose another --out")

    def __reduce__(self):
        return (type(self), (self.path,))

    def __str__(self):
        return self.args[0]


class LedgerError(RknnError):
    """The privacy ledger cannot be used as it is (not a ledger, damaged, locked); the
    file is left untouched: its recorded spend must never be silently forgotten."""


def refusal_line(exc: RknnError) -> str:
    """One of ours as the console says it: its message's first line (its class if empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (at most ``limit`` characters; "" if none):
    what a console line, a ledger note or a failed cell's row quotes."""
    text = str(exc).strip()
    return text.splitlines()[0][:limit] if text else ""


#: the most characters of a value an error message quotes (a 1,000,000-character label was
#: printed whole)
QUOTE_LIMIT = 60


def quoted(value, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` cut to about ``limit`` characters (what a message quotes of a value it
    did not choose: a label, a column name, a path), marked where it was cut."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text):,} characters)"

"""Errors a person can act on: each names the problem and the fix."""


class RknnError(Exception):
    """Base class for errors raised deliberately by rknn-ray."""


class ConfigError(RknnError, ValueError):
    """An invalid configuration value; raised before any expensive work starts."""

    def __init__(self, key: str, problem: str, fix: str):
        self.key, self.problem, self.fix = key, problem, fix
        super().__init__(f"config '{key}': {problem}. Fix: {fix}")


class DataError(RknnError, ValueError):
    """Input data that cannot be used (missing files, NaN features, bad labels)."""


class PrivacyBudgetError(RknnError):
    """A release was refused because it would break the privacy target or budget."""


class ReportError(RknnError):
    """A sealed report that could not be opened or decoded (counted, never fatal)."""

    def __init__(self, kind: str, detail: str = ""):
        self.kind = kind
        super().__init__(f"{kind}: {detail}" if detail else kind)


class LedgerError(RknnError):
    """The privacy ledger cannot be used as it is (not a ledger, damaged, locked); the
    file is left untouched: its recorded spend must never be silently forgotten."""

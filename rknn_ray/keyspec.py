"""A config key, declared once: its default, doc, type, range or choices ride on the dataclass
field as ``field(metadata={"spec": Spec(...)})``, written with :func:`key`.

Everything that needs to know what a key accepts reads it from there: the run config's
validator (rknn_ray/config.py, composing the sections of rknn_ray/<package>/config.py), the
student's own configs (rknn_ray/student/config.py) and the generated reference
(jobs/config_reference.py -> docs/configuration.md). Rules that tie several keys together
(k <= s, dirichlet needs a record bound, ...) are not a key's; they stay explicit checks
beside the sections they tie.

A leaf module (errors only): any section may use it, and checking a value imports nothing
heavy. Choices a module owns are given as a function returning them, called when checked
(:func:`owned`). The helpers every section shares (:class:`FrozenDict`, :func:`owned`,
:func:`path_or_null`, :func:`unknown_key`) live here too.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import math
from dataclasses import dataclass
from typing import Callable

from rknn_ray.errors import ConfigError


@dataclass(frozen=True)
class Spec:
    """What one key accepts. ``check(value, path, spec)`` replaces the standard check for
    rules a type and range cannot say (it may call ``spec.standard``) and returns the value."""

    doc: str
    kind: type | None = None          # int | float | bool | str; None: only ``check`` (or a relation)
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    null: str = ""                     # what null means (docs; the fix of a nullable true/false)
    auto: bool = False                 # also takes "auto" (rknn_ray.labeling.autotune / denoise decide)
    choices: tuple | Callable[[], tuple] | None = None
    check: Callable | None = None
    accepts_text: str | Callable[[], str] = ""   # the reference's "accepts" for a check-only key
    free_form: bool = False            # a mapping merged key by key (checked by its own rules)

    def allowed(self) -> tuple:
        return tuple(self.choices() if callable(self.choices) else self.choices)

    def validate(self, value, path: str):
        """The checked, normalized value (numeric strings parsed, whole numbers as int)."""
        if self.auto and value == "auto":
            return value
        if self.check is not None:
            return self.check(value, path, self)
        return self.standard(value, path)

    def standard(self, value, path: str):
        if self.choices is not None:
            allowed = self.allowed()
            if not isinstance(value, str) or value not in allowed:
                raise ConfigError(path, f"{value!r} is not supported", f"use one of {list(allowed)}")
            return value
        if self.kind is bool:
            if value is None and self.nullable or isinstance(value, bool):
                return value
            if self.nullable:
                raise ConfigError(path, f"{value!r} is not true, false or null",
                                  f"set {path}: null ({self.null}), true or false")
            raise ConfigError(path, f"{value!r} is not true or false", f"set {path}: true or false")
        if self.kind in (int, float):
            return check_number(value, path, self.kind, self.low, self.high, self.low_open,
                                self.high_open, self.nullable)
        return value

    def accepts(self) -> str:
        """The reference's "accepts" column (markdown)."""
        if self.accepts_text:
            text = self.accepts_text() if callable(self.accepts_text) else self.accepts_text
        elif self.choices is not None:
            text = " \\| ".join(f"`{v}`" for v in self.allowed())
        elif self.kind is bool:
            text = "`true` \\| `false`" + (f" \\| `null` ({self.null})" if self.nullable else "")
        elif self.kind in (int, float):
            text = interval(self.kind, self.low, self.high, self.low_open, self.high_open)
            text += ", or null" if self.nullable else ""
        elif self.free_form:
            text = "mapping (see below)"
        else:
            text = "text"
        return text + (", or `auto`" if self.auto else "")


def key(default, doc: str, kind: type | None = None, **spec) -> dataclasses.Field:
    """A dataclass field declaring one key: ``epochs: int = key(30, "training epochs", int, low=1)``.
    A dict default becomes a read-only default factory (``factory=`` names its type)."""
    factory = spec.pop("factory", None)
    meta = {"spec": Spec(doc, kind, **spec)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def spec_of(f: dataclasses.Field) -> Spec:
    """The field's :class:`Spec`; a field declared without :func:`key` is a programming error."""
    try:
        return f.metadata["spec"]
    except KeyError:
        raise TypeError(f"field {f.name!r} is not declared with rknn_ray.keyspec.key()") from None


def redefault(cls, name: str, default) -> dataclasses.Field:
    """The key ``cls.name`` (same type, range and doc) with another default, for a subclass
    whose code path is tuned differently (the semi-supervised loop)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return dataclasses.field(default=default, metadata=f.metadata)


def checked(obj, prefix: str):
    """A copy of the dataclass ``obj`` with every field checked against its spec and
    normalized; errors name ``prefix.<field>``."""
    values = {f.name: spec_of(f).validate(getattr(obj, f.name), f"{prefix}.{f.name}")
              for f in dataclasses.fields(obj)}
    return dataclasses.replace(obj, **values)


def interval(kind, low, high, low_open=False, high_open=False) -> str:
    lo = "-inf" if low is None else f"{low}"
    hi = "inf" if high is None else f"{high}"
    return (f"{'integer' if kind is int else 'number'} in {'(' if low_open or low is None else '['}"
            f"{lo}, {hi}{')' if high_open or high is None else ']'}")


def check_number(v, path: str, kind=float, low=None, high=None, low_open=False, high_open=False,
                 allow_none=False):
    """``v`` as a number of ``kind`` in the range (numeric strings parsed: YAML 1.1 reads
    '1e-6' as a string), or a ConfigError naming ``path`` and the fix."""
    if v is None and allow_none:
        return v
    if isinstance(v, str):
        try:
            v = float(v.strip())
        except ValueError:
            pass
    whole = "whole " if kind is int else ""
    fix = f"set {path} to a finite {whole}number" + (" or null" if allow_none else "")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(path, f"expected {'an integer' if kind is int else 'a number'}, got {v!r}", fix)
    if not math.isfinite(v):
        raise ConfigError(path, f"{v} is not finite", fix)
    if kind is int:
        if v != int(v):
            raise ConfigError(path, f"expected an integer, got {v!r}", fix)
        v = int(v)
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "(-inf" if low is None else f"{'(' if low_open else '['}{low}"
        hi = "inf)" if high is None else f"{high}{')' if high_open else ']'}"
        raise ConfigError(path, f"{v} is out of range", f"choose {path} in {lo}, {hi}")
    return v


# ---------------------------------------------------------------------- shared by the sections

class FrozenDict(dict):
    """A read-only dict: the free-form sections of a frozen :class:`Config`."""

    def _refuse(self, *_args, **_kwargs):
        raise TypeError("a Config is read-only; derive a changed copy with "
                        "cfg.with_overrides(['privacy.options.<key>=<value>'])")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):        # pickle / deepcopy / Ray rebuild it without __setitem__
        return (FrozenDict, (dict(self),))

    def __hash__(self):
        return hash(frozenset(self.items()))


def owned(module: str, name: str):
    """Choices the module that acts on them owns, imported only when a value is checked."""
    def names() -> tuple:
        value = getattr(importlib.import_module(module), name)
        return tuple(value() if callable(value) else value)
    return names


def path_or_null(fix: str):
    """A ``check``: a path (text) or null; else the problem and ``fix``."""
    def check(value, path, spec):
        if value is not None and not isinstance(value, str):
            raise ConfigError(path, f"{value!r} is not a path", fix)
        return value
    return check


def unknown_key(path: str, known: list[str], fallback: str) -> ConfigError:
    """An unknown key, with the closest known one as the fix (else ``fallback``)."""
    near = difflib.get_close_matches(path, known, n=1)
    return ConfigError(path, "unknown key", f"did you mean '{near[0]}'?" if near else fallback)

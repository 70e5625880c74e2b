"""A cross-process, on-disk cache of a bound's local eps0 (``AmplificationBound.local_eps0``).

A calibration is a dozen or more evaluations of a numerical amplification bound, and every
process that builds the same single-message shuffle mechanism (a job, its Ray workers, each
test process) would compute the same number again. :func:`cached_local_eps0` keeps the
answers on disk, one small JSON file per key.

Soundness rests on the check, not on the cache. A cached eps0 is used only after one
evaluation of the bound confirms ``central_eps(eps0, n, delta) <= target_eps`` -- the very
test ``local_eps0`` applies to the eps0 it returns -- and that eps0 lies in the bound's
range. A verified value is therefore exactly as safe as a fresh calibration; a stale,
corrupted or tampered entry at worst could only offer a smaller eps0 (less utility), never
a larger one. An entry that fails the check (or does not parse) is ignored, the eps0 is
calibrated afresh and written over it, and one line on stderr names the file.

Key: the bound (its class and every attribute: mechanism, k, l, method, ...), the target
eps, n, delta, the search's rtol and start (``guess``), and a fingerprint of the code that
computes the answer (the sources of this package, the caller's module files, and the
numpy / scipy / Python versions), so an edit never reuses an old answer and a cached eps0
is the one a fresh calibration gives.

Where (:func:`cache_dir`): ``$RKNN_RAY_CACHE_DIR`` (the folder itself; ``off``, ``none``,
``0`` or ``false`` disables the cache), else ``$RKNN_RAY_CACHE/calibration`` (the project's
cache root, beside the encoders), else ``$XDG_CACHE_HOME/rknn-ray/calibration``, else
``~/.cache/rknn-ray/calibration``. Files are written to a temporary name and moved into
place (:func:`rknn_ray.runio.write_json`), so concurrent writers (Ray workers) never leave
half a file; an unwritable or unreadable folder means no cache, silently.

What is read (issue 49): the folder must be owned by this user and writable by nobody else
(else the whole cache is ignored, with one line naming the folder and the ``chmod``); an
entry is read only when it is a regular file (not a FIFO, a device or a symbolic link) owned
by this user and at most :data:`MAX_ENTRY_BYTES` long (else ignored, one line, and replaced).
A folder this code makes is made owner-only. The check above limits what an entry can do;
this keeps another local user from choosing which check-passing eps0 (a smaller one: less
utility) a job gets.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import stat
import sys
from pathlib import Path

import numpy as np

from rknn_ray.runio import write_json

ENV = "RKNN_RAY_CACHE_DIR"
OFF = ("off", "none", "0", "false", "no")
#: bump when the entry format changes
FORMAT = 1
_PACKAGE = Path(__file__).resolve().parent
_warned: set[str] = set()
#: the largest entry read (an entry is ~1 KB; a symlink to /dev/zero allocated until MemoryError)
MAX_ENTRY_BYTES = 64 * 1024


def cache_dir() -> Path | None:
    """The folder the calibrations live in, or None when the cache is off."""
    explicit = os.environ.get(ENV, "").strip()
    if explicit:
        return None if explicit.lower() in OFF else Path(explicit).expanduser()
    root = os.environ.get("RKNN_RAY_CACHE")
    if root:
        return Path(root).expanduser() / "calibration"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path.home() / ".cache"
    return base / "rknn-ray" / "calibration"


def fingerprinted_files(code: tuple = ()) -> list[Path]:
    """The source files whose bytes the fingerprint covers: this package's and ``code``."""
    return sorted(_PACKAGE.glob("*.py")) + [Path(p).resolve() for p in code]


@functools.lru_cache(maxsize=8)
def code_fingerprint(code: tuple = ()) -> str:
    """sha256 of the code a calibration runs (once per process per ``code``)."""
    import scipy  # defers scipy: only a process that calibrates asks for its version
    h = hashlib.sha256()
    for part in (sys.version, platform.machine(), np.__version__, scipy.__version__):
        h.update(part.encode() + b"\0")
    for path in fingerprinted_files(code):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def bound_key(bound) -> dict | None:
    """What identifies a bound object: its class and attributes, or None when an attribute is
    not a plain value (such a bound is not cached: its key could not say all it depends on)."""
    def plain(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return True
        return isinstance(v, dict) and all(isinstance(k, str) and plain(x) for k, x in v.items())
    attrs = vars(bound)
    if not all(plain(v) for v in attrs.values()):
        return None
    cls = type(bound)
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "attrs": dict(attrs)}


def calibration_key(bound, target_eps: float, n: int, delta: float, rtol: float,
                    guess: float | None, code: tuple = ()) -> dict | None:
    """Everything the calibration's answer depends on (None: not cacheable)."""
    b = bound_key(bound)
    if b is None:
        return None
    return {"format": FORMAT, "call": "local_eps0", "bound": b, "target_eps": float(target_eps),
            "n": int(n), "delta": float(delta), "rtol": float(rtol),
            "guess": None if guess is None else float(guess), "code": code_fingerprint(tuple(code))}


def entry_path(folder: Path, key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return folder / f"eps0-{digest[:40]}.json"


def granted(bound, eps0, target_eps: float, n: int, delta: float) -> bool:
    """Whether ``bound`` grants ``eps0`` for the target: ``local_eps0``'s own acceptance test
    (its score, log central eps - log target, <= 0), on a finite eps0 in the bound's range.
    One evaluation of the bound."""
    if isinstance(eps0, bool) or not isinstance(eps0, (int, float)) or not math.isfinite(eps0):
        return False
    if not (math.isfinite(target_eps) and target_eps > 0):
        return False                          # local_eps0 itself says what is wrong
    if not 0.0 < eps0 <= bound.eps0_max(n, delta):
        return False
    try:
        central = bound.central_eps(float(eps0), n, delta)
    except (ValueError, ArithmeticError):     # ConfigError is a ValueError: out of the range
        return False
    return math.log(max(central, 1e-300)) - math.log(target_eps) <= 0


def folder_problem(folder: Path) -> str | None:
    """Why the cache in ``folder`` must not be used (another owner, writable by others), or
    None (also when it does not exist yet, or is no folder: then nothing is cached anyway)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        return None
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by you"
    if st.st_mode & 0o022:
        return f"mode {stat.S_IMODE(st.st_mode):o}: others can write to it"
    return None


def read_entry(path: Path):
    """(the parsed entry or None, why it was not read or None): only a regular file of this
    user's, at most MAX_ENTRY_BYTES, is opened for reading (never a FIFO: the open does not
    wait; never through a symbolic link)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        return None, None
    except OSError:
        if os.path.islink(path):
            return None, "a symbolic link"
        return None, None                     # unreadable: as if absent, nothing to say
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None, "not a regular file"
        if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
            return None, f"owned by uid {st.st_uid}, not by you"
        data = fh.read(MAX_ENTRY_BYTES + 1)
    if len(data) > MAX_ENTRY_BYTES:
        return None, f"larger than {MAX_ENTRY_BYTES // 1024} KiB"
    try:
        return json.loads(data.decode()), None
    except UnicodeDecodeError:
        return None, "not valid JSON"
    except ValueError:
        return None, "not valid JSON"


def _warn_folder(folder: Path, why: str) -> None:
    if str(folder) not in _warned:
        _warned.add(str(folder))
        print(f"rknn-ray: ignored the calibration cache {folder} ({why}): calibrating without "
              f"it. Fix: chmod go-w {folder} (and own it), or set {ENV} to a folder of your own",
              file=sys.stderr)


def _warn(path: Path, why: str) -> None:
    if str(path) not in _warned:
        _warned.add(str(path))
        print(f"rknn-ray: ignored calibration cache entry {path} ({why}): calibrating afresh "
              "and replacing it", file=sys.stderr)


def cached_local_eps0(bound, target_eps: float, n: int, delta: float, *, rtol: float = 1e-6,
                      guess: float | None = None, code: tuple = ()) -> float:
    """``bound.local_eps0(target_eps, n, delta, rtol, guess)``, from the disk cache when an
    entry for the same key is there and passes :func:`granted`; else calibrated and stored.
    ``code``: the caller's source files the answer also depends on (in the fingerprint)."""
    folder = cache_dir()
    key = calibration_key(bound, target_eps, n, delta, rtol, guess, code) if folder else None
    if key is None:
        return float(bound.local_eps0(target_eps, n, delta, rtol=rtol, guess=guess))
    unsafe = folder_problem(folder)
    if unsafe:
        _warn_folder(folder, unsafe)
        return float(bound.local_eps0(target_eps, n, delta, rtol=rtol, guess=guess))
    path = entry_path(folder, key)
    entry, problem = read_entry(path)
    if entry is not None:
        if not isinstance(entry, dict) or entry.get("key") != key:
            problem = "its key does not match its name"
        elif granted(bound, entry.get("eps0"), target_eps, n, delta):
            return float(entry["eps0"])
        else:
            problem = f"eps0={entry.get('eps0')!r} fails the bound's check"
    if problem:
        _warn(path, problem)
    eps0 = float(bound.local_eps0(target_eps, n, delta, rtol=rtol, guess=guess))
    try:
        if not folder.exists():
            os.makedirs(folder, mode=0o700, exist_ok=True)    # owner-only (folder_problem)
        write_json(str(path), {"key": key, "eps0": eps0})
    except OSError:
        pass                                  # read-only or full: no cache, silently
    return eps0

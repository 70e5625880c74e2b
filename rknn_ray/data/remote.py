"""A bounded, interruptible first contact with a data path given as a URI.

pyarrow opens ``gs://``, ``s3://``, ``hdfs://`` (...) paths through file systems whose first
call can wait for minutes when nothing answers: ``gs://`` with no network hung 985 s in one
pyarrow call, which no signal interrupts. :func:`check_remote` makes that first contact in a
short-lived child process (open the file system, look up the path) and waits for it at most
:data:`REMOTE_WAIT_S` seconds (``$RKNN_RAY_REMOTE_WAIT_S`` overrides it): past that, or on an
interrupt, the child is killed and the caller gets one line naming the fix. A path that
answered once is not asked again in the same process.

Called by :func:`rknn_ray.data.tables.open_dataset` (so by every reader of a part: the
driver's public and evaluation parts, the private scan, the shards); a reader that opens a
URI another way calls it first.
"""
from __future__ import annotations

import os
import subprocess
import sys

from rknn_ray.errors import DataError, quoted

#: how long the first contact with a URI may take (seconds); ``$RKNN_RAY_REMOTE_WAIT_S``
#: overrides it
REMOTE_WAIT_S = 30.0
ENV = "RKNN_RAY_REMOTE_WAIT_S"
_answered: set[str] = set()

# the child: open the file system and look the path up; one line back, exit 0 when it answered
_CHILD = """
import sys
try:
    import pyarrow.fs as fs
    system, root = fs.FileSystem.from_uri(sys.argv[1])
    system.get_file_info(root)
except Exception as exc:
    text = str(exc).strip().splitlines()
    print(f"{type(exc).__name__}: {text[0] if text else ''}"[:200], file=sys.stderr)
    sys.exit(3)
"""


def is_uri(path) -> bool:
    return "://" in str(path)


def wait_s() -> float:
    """:data:`REMOTE_WAIT_S`, or ``$RKNN_RAY_REMOTE_WAIT_S`` when that is a positive number."""
    try:
        value = float(os.environ.get(ENV, ""))
    except ValueError:
        return REMOTE_WAIT_S
    return value if 0 < value < float("inf") else REMOTE_WAIT_S


def check_remote(path, what: str = "data path", timeout: float | None = None) -> None:
    """Return once the URI ``path`` answers (a local path returns at once); else a DataError
    in one line: no answer within ``timeout`` (default :func:`wait_s`), or the file system's
    own refusal (unknown scheme, no credentials, ...). ``what`` names the path in the line
    (``data.private``). Interruptible: a signal that raises here kills the child first."""
    path = str(path)
    if not is_uri(path) or path.startswith("file://") or path in _answered:
        return
    limit = wait_s() if timeout is None else float(timeout)
    fix = ("check that this machine reaches it (network, credentials), or copy the data to a "
           f"local path; ${ENV} (seconds) sets how long to wait")
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, path], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        raise DataError(f"{what}: {quoted(path, 200)} did not answer within {limit:g} s. "
                        f"Fix: {fix}") from None
    finally:
        if proc.poll() is None:         # timed out, or a signal raised while waiting
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        why = (err or "").strip().splitlines()
        why = why[-1][:200] if why else f"exit code {proc.returncode}"
        raise DataError(f"{what}: cannot open {quoted(path, 200)} ({why}). Fix: use a URI "
                        f"pyarrow opens (s3://, gs://, hdfs:// or file://) and {fix}")
    _answered.add(path)

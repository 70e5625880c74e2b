"""What a training loop is to its runners: the result of running one, and a loop named by
"module:function" (shared by the in-process and the Ray Train runner, below the package that
chooses between them)."""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class LoopRun:
    """What running a loop gave: rank 0's payload, where it ran, and the stages' seconds."""

    payload: dict
    device: str = "cpu"
    num_workers: int = 1
    timings: dict = field(default_factory=dict)


def resolve_loop(loop: str | Callable) -> Callable:
    """A loop given as a callable, or by name as "module:function"."""
    if callable(loop):
        return loop
    module, name = loop.rsplit(":", 1)
    return getattr(importlib.import_module(module), name)

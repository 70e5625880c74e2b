"""Privacy mechanisms for the BSVS problem, one module each, behind one interface.

``build(model, name, params)`` calibrates a mechanism by trust model and name;
the registry below is the single list of what exists.
"""
from __future__ import annotations

from typing import Callable
import importlib

from rknn_ray.mechanisms.base import MODELS, Mechanism, MechanismParams, MessageBatch

# (model, name) -> factory(params) -> Mechanism. Modules register themselves below.
_REGISTRY: dict[tuple[str, str], Callable[[MechanismParams], Mechanism]] = {}


def register(model: str, name: str):
    """Decorator: make a mechanism factory available to ``build``."""
    def wrap(factory):
        _REGISTRY[(model, name)] = factory
        return factory
    return wrap


def available() -> dict[str, list[str]]:
    """Mechanism names per trust model."""
    out: dict[str, list[str]] = {m: [] for m in MODELS}
    for model, name in _REGISTRY:
        out[model].append(name)
    return out


def build(model: str, name: str, params: MechanismParams) -> Mechanism:
    """Calibrate mechanism ``name`` of trust model ``model`` for ``params``."""
    if (model, name) not in _REGISTRY:
        names = available().get(model)
        if names is None:
            raise ValueError(f"unknown privacy model {model!r}; use one of {MODELS}")
        raise ValueError(f"unknown mechanism {name!r} for model {model!r}; "
                         f"use one of {sorted(names)}")
    return _REGISTRY[(model, name)](params)


def _load_builtin() -> None:
    """Import the mechanism modules so they register (kept tolerant of order)."""
    for mod in ("central", "randomized_response", "collision", "separation",
                "local_laplace", "shuffle_single", "shuffle_multi"):
        try:
            importlib.import_module(f"rknn_ray.mechanisms.{mod}")
        except ModuleNotFoundError as exc:  # a module not written yet
            if exc.name != f"rknn_ray.mechanisms.{mod}":
                raise


_load_builtin()

__all__ = ["Mechanism", "MechanismParams", "MessageBatch", "build",
           "register", "available"]

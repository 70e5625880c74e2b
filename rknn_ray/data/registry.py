"""The dataset registry: every ``data.dataset`` name is one entry, registered by its own module.

``register_dataset(name, reader, options)`` (the mechanisms' ``register`` is the model) is
all a new source of data needs: a module in :mod:`rknn_ray.data.kinds` that calls it when
imported. The registry imports every module of that package the first time a name is looked
up, so adding a reader is one new file; the config's choices, the aliases, the default
folders, the paper split each set means and the options a reader takes are all read from here.

An entry either *reads* a labelled :class:`~rknn_ray.data.dataset.Dataset` (the built-in sets:
one pool the job splits and partitions), or *prepares* the job's data itself (``prepare``: the
user's own tables, whose clients come from the data and whose private rows the driver never
loads; rknn_ray/data/kinds/table.py).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, field
from typing import Callable

from rknn_ray.errors import ConfigError
import rknn_ray.data.kinds as package


@dataclass(frozen=True)
class DatasetKind:
    """One registered ``data.dataset``."""
    name: str
    reader: Callable | None = None          # (root, **options) -> Dataset
    options: tuple = ()                      # keyword options the reader takes
    aliases: tuple = ()
    default_root: str | None = None          # where the reader looks without data.data_root
    paper_split: str = "stratified"          # what split.rule 'paper' means (rknn_ray.data.splits)
    from_config: Callable | None = None      # cfg.data -> the reader's options
    prepare: Callable | None = None          # (cfg, inputs) -> PreparedData: prepares itself
    parts: bool = False                      # reads data.private / public / evaluation
    description: str = field(default="", compare=False)


_KINDS: dict[str, DatasetKind] = {}
_loaded = False


def register_dataset(name: str, reader: Callable | None = None, options=(), **how) -> DatasetKind:
    """Register (or replace) the data set ``name``; ``how``: the other DatasetKind fields."""
    kind = DatasetKind(str(name), reader, tuple(options), **how)
    if kind.reader is None and kind.prepare is None:
        raise ValueError(f"data set {name!r} needs a reader or a prepare function")
    _KINDS[kind.name] = kind
    return kind


def kinds() -> dict[str, DatasetKind]:
    """Every registered data set (the modules of rknn_ray.data.kinds imported once)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
            importlib.import_module(f"{package.__name__}.{module}")
    return _KINDS


def known() -> tuple:
    """The registered names, in registration order (config choices)."""
    return tuple(kinds())


def aliases() -> dict[str, str]:
    return {a: k.name for k in kinds().values() for a in k.aliases}


def canonical_name(name: str) -> str:
    """The canonical data set name, or ConfigError listing the known ones."""
    key = str(name).strip().lower()
    key = aliases().get(key, key)
    if key not in kinds():
        raise ConfigError("dataset", f"unknown data set {name!r}",
                          f"use one of {', '.join(known())} (aliases: {', '.join(sorted(aliases()))})")
    return key


def kind_of(name: str) -> DatasetKind:
    return kinds()[canonical_name(name)]

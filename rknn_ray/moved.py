"""Old module names of the stage packages, kept importable for what was pickled under them.

A run folder's ``encoder.pkl`` (``student.input: features``) pickles the fitted encoder by
its module path; folders written before the stage packages name e.g. ``rknn_ray.represent``.
This finder answers those names with the module that now holds the code (the same module
object, not a copy). Nothing in the project imports the old names.
"""
import importlib
import importlib.abc
import importlib.util
import sys

#: old module -> the module that holds its code now
MOVED = {f"rknn_ray.{m}": f"rknn_ray.representation.{m}"
         for m in ("represent", "contrastive", "encoder", "hog", "augment")}
MOVED.update({f"rknn_ray.{m}": f"rknn_ray.labeling.{m}"
              for m in ("queries", "rknn", "answers", "labels", "denoise", "adaptive", "autotune")})


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        """Nothing to run: ``create_module`` returned the loaded module itself."""


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())   # first: only these exact names, no stale copy

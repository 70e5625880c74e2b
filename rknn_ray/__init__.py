"""rknn-ray: record-level private knowledge distillation by reverse k-NN labeling.

The library (this package) is pure numpy / torch / faiss; Ray appears only where
Ray is the job (student training with Ray Train). The parties' packages sit beside it:
``sealing/`` (the shared report format), ``shuffler/`` (the untrusted middle) and
``server/`` (the key holder); ``actors/`` holds their thin Ray wrappers.

``rknn_ray.run(config, private=None, public=None, evaluation=None, out_dir=None)`` runs one
job from Python (rknn_ray/job/api.py), loaded on first use.
"""

__version__ = "0.1.0"

import importlib
import logging
import warnings

from rknn_ray import moved as _moved

_moved.install()        # pickles made before the stage packages still load (rknn_ray/moved.py)

# faiss's loader logs every CPU build it tries at INFO (a ModuleNotFoundError among them):
# under logging.basicConfig(level=logging.INFO) that is 6-9 lines of noise per process. Left
# at WARNING unless the application set that logger's level itself.
# In a notebook without ipywidgets, importing Ray says so twice (tqdm.auto's "IProgress not
# found" warning and ray.widgets' "Missing packages" line): both are about rich widgets this
# project never draws. Silenced the same way, before the job layer imports Ray.
for _name in ("faiss.loader", "ray.widgets.util"):
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)
del _name
warnings.filterwarnings("ignore", message="IProgress not found")


# lazy, not a plain import: importing the job layer costs every ``import rknn_ray.<anything>``
# (each Ray worker too) Ray and ~2.5 s (docs/lab-notes/2026-11.md, "Costs behind design choices")
def __getattr__(name: str):
    """``run``: the job layer's entry (rknn_ray.job.api), imported on first use so the library
    never loads the job layer (Ray, the parties) unless a job is run from here."""
    if name == "run":
        return importlib.import_module("rknn_ray.job.api").run
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

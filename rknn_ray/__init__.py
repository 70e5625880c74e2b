"""rknn-ray: record-level private knowledge distillation by reverse k-NN labeling.

The library (this package) is pure numpy / torch / faiss; Ray appears only where
Ray is the job (student training with Ray Train). The parties' packages sit beside it:
``sealing/`` (the shared report format), ``shuffler/`` (the untrusted middle) and
``server/`` (the key holder); ``actors/`` holds their thin Ray wrappers.
"""

__version__ = "0.1.0"

from rknn_ray import moved as _moved

_moved.install()        # pickles made before the stage packages still load (rknn_ray/moved.py)

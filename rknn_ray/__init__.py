"""rknn-ray: record-level private knowledge distillation by reverse k-NN labeling.

The library (this package) is pure numpy / torch / faiss; Ray appears only where
Ray is the job (student training with Ray Train). Actors live in ``actors/``, the
trust boundary (sealing, shuffling) in ``shuffler/``.
"""

__version__ = "0.1.0"

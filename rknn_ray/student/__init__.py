"""The student: small models and their training loops (run by rknn_ray.training: Ray Train or
in-process).

``rknn_ray.student.config`` (every ``student.*`` key, torch-free) is what the run config
imports; the names below load torch only when first used, so validating a config does not.
"""
import importlib

_EXPORTS = {"ARCHS": "config", "StudentConfig": "config", "MLP": "models", "SmallCNN": "models",
            "build_model": "models", "hard_label_loss": "models", "resolve_arch": "models",
            "soft_label_loss": "models", "StudentResult": "train", "accuracy": "train",
            "load_student": "train", "predict": "train", "supervised_loop": "train",
            "train_student": "train", "train_student_local": "train"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rknn_ray.student' has no attribute {name!r}")
    return getattr(importlib.import_module(f"rknn_ray.student.{_EXPORTS[name]}"), name)

"""The student: small models and their training loop (Ray Train or in-process)."""
from rknn_ray.student.models import (ARCHS, MLP, SmallCNN, build_model, hard_label_loss, resolve_arch,
                                     soft_label_loss)
from rknn_ray.student.train import (StudentConfig, StudentResult, accuracy, load_student, predict,
                                    quiet_train_logs, train_student, train_student_local)

__all__ = ["ARCHS", "MLP", "SmallCNN", "StudentConfig", "StudentResult", "accuracy", "build_model",
           "hard_label_loss", "load_student", "predict", "quiet_train_logs", "resolve_arch",
           "soft_label_loss", "train_student", "train_student_local"]

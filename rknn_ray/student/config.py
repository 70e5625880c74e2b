"""The student's configuration, torch-free: every ``student.*`` key declared once.

:class:`StudentSection` is the run config's ``student`` section (rknn_ray/config.py uses it
as is); :class:`StudentConfig` (the supervised loop, rknn_ray/student/train.py) and
:class:`SemiConfig` (the semi-supervised loop, rknn_ray/student/semi.py) extend it with what
the loops also need, so a key's type, range, choices and doc live in one field. The choice
lists live here, not beside torch code, so validating a config never imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from rknn_ray.keyspec import checked, key, redefault

ARCHS = ("auto", "mlp", "cnn8", "cnn28", "cnn32")
AUGMENTATIONS = ("none", "shift")
LABEL_TYPES = ("hard", "soft")
METHODS = ("supervised", "semi")
TARGETS = ("hard", "soft", "weighted")
INITS = ("encoder", "scratch")
INPUTS = ("images", "features")
TRAINERS = ("ray", "local", "auto")
#: student.trainer: auto trains in this process up to this many sample-epochs (training
#: samples x epochs), on Ray Train above, by the student's kind: an MLP (a flat input: a table's
#: features, the encoder's features) or a CNN (an image). Ray Train's start-up (~20 s) is
#: more than the whole in-process loop below these; measured on 2 CPU cores, the CNN on
#: 28x28 images at 1,000 sample-epochs/s in process, 2 Train workers ~1.3x that (crossover
#: ~90,000), the MLP at ~29,000/s (docs/results.md, "student.trainer: auto")
AUTO_LOCAL_WORK = {"mlp": 1_000_000, "cnn": 100_000}
#: the student's files in a run folder (here, not beside torch code: the job layer names them)
CHECKPOINT_FILE = "student.pt"
HISTORY_FILE = "history.json"


@dataclass(frozen=True)
class StudentSection:
    """The run config's ``student`` section."""

    epochs: int = key(30, "training epochs", int, low=1)
    batch_size: int = key(64, "global batch, split evenly over the workers", int, low=1)
    lr: float = key(0.001, "Adam learning rate", float, low=0, low_open=True)
    weight_decay: float = key(0.0, "Adam weight decay (semi: 0 means its own 5e-4)", float, low=0)
    num_workers: int = key(2, "Ray Train workers (checked against the CPUs)", int, low=1)
    use_gpu: bool | None = key(None, "null: use a GPU when Ray has one", bool, nullable=True,
                               null="automatic")
    arch: str = key("auto", "model architecture (auto: by input shape)", str, choices=ARCHS)
    augment: str = key("none", "training augmentation (shift: random translations of images)",
                       str, choices=AUGMENTATIONS)
    method: str = key("supervised", "supervised (student/train.py) | semi (student/semi.py, "
                      "FixMatch-like)", str, choices=METHODS)
    target: str = key("weighted", "semi: hard labels, soft distributions, or hard labels "
                      "weighted by their confidence", str, choices=TARGETS)
    threshold: float = key(0.9, "semi: model confidence for a consistency target", float,
                           low=0, high=1, low_open=True)
    init: str = key("encoder", "semi: encoder (the simclr backbone, if any) | scratch", str,
                    choices=INITS)
    input: str = key("images", "images | features: an MLP on the (public) encoder's features",
                     str, choices=INPUTS)
    trainer: str = key("auto", "ray (Ray Train, num_workers workers) | local (this process, the "
                       "same training loop; no Train start-up cost) | auto (local up to "
                       f"{AUTO_LOCAL_WORK['cnn']:,} training samples x epochs for an image "
                       f"student, {AUTO_LOCAL_WORK['mlp']:,} for features; else ray; "
                       "report.json says which ran)", str, choices=TRAINERS)

    def validate(self):
        """A checked, normalized copy (the same checks and messages as the run config's)."""
        return checked(self, "student")

    def chosen_trainer(self, train_samples: int, input_shape=(1,)) -> tuple[str, str]:
        """(the trainer that runs: ray | local, why) for ``train_samples`` training samples
        of ``input_shape``: ``auto`` compares samples x epochs with :data:`AUTO_LOCAL_WORK`
        (an MLP for a flat input, else a CNN)."""
        if self.trainer != "auto":
            return self.trainer, "configured"
        kind = "mlp" if len(tuple(input_shape)) <= 1 else "cnn"
        work, limit = int(train_samples) * int(self.epochs), AUTO_LOCAL_WORK[kind]
        if work <= limit:
            return "local", (f"auto: {work:,} samples x epochs <= {limit:,} ({kind}), in this "
                             "process (Ray Train's start-up would cost more than training)")
        return "ray", f"auto: {work:,} samples x epochs > {limit:,} ({kind}), on Ray Train"


@dataclass(frozen=True)
class StudentConfig(StudentSection):
    """How ``train_student`` trains: the student section, plus the labels' type and the seed
    (from ``labels.type`` and ``run.seed`` in a run). The loop reads epochs .. augment; the
    run's choice of loop (method, trainer, input) and the semi keys ride along unread."""

    label_type: str = key("hard", "hard: (N,) int labels; soft: (N, C) distributions", str,
                          choices=LABEL_TYPES)
    seed: int = key(0, "shard order, initialization and augmentation", int, low=0)

    @classmethod
    def from_config(cls, cfg) -> "StudentConfig":
        """From a run :class:`rknn_ray.config.Config`: its student section, label type and seed."""
        st = cfg.student
        return cls(**{f.name: getattr(st, f.name) for f in fields(st)},
                   label_type=cfg.labels.type, seed=cfg.run.seed)


@dataclass(frozen=True)
class SemiConfig(StudentSection):
    """How ``train_semi_student`` trains: the student section (with the semi loop's own
    defaults for direct library use) plus its loss weights and augmentation. It runs one
    worker; num_workers, use_gpu, arch, augment, method, init and input ride along unread."""

    batch_size: int = redefault(StudentSection, "batch_size", 128)
    lr: float = redefault(StudentSection, "lr", 2e-3)
    weight_decay: float = redefault(StudentSection, "weight_decay", 5e-4)
    lambda_u: float = key(1.0, "weight of the consistency loss", float, low=0)
    flip: bool = key(True, "left-right mirror augmentation (represent.flip in a run)", bool)
    seed: int = key(0, "initialization, batches and augmentation", int, low=0)
    encoder_lr_scale: float = key(0.3, "a pretrained backbone learns slower than the new head",
                                  float, low=0)

    @classmethod
    def from_config(cls, cfg) -> "SemiConfig":
        """From a run :class:`rknn_ray.config.Config`, as the job has always mapped it:
        ``student.weight_decay: 0`` means the semi loop's 5e-4, ``represent.flip`` and
        ``run.seed`` carry over, and the loop runs where ``represent.trainer`` says."""
        st = cfg.student
        own = {f.name: getattr(st, f.name) for f in fields(st)}
        own.update(weight_decay=st.weight_decay or cls.weight_decay, trainer=cfg.represent.trainer)
        return cls(**own, flip=cfg.represent.flip, seed=cfg.run.seed)

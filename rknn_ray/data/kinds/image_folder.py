"""``data.dataset: image_folder``: the user's images in the ImageFolder layout.

Labelled parts (private, evaluation) hold one sub-folder per class (the label is the
sub-folder's name); the public part is one flat folder (a row's id is its file name). Each
image becomes one record of a ``pixels`` list column (float32 in [0, 1], channels first;
rknn_ray.data.tables.read_images) and the job is then a table job (rknn_ray/data/kinds/
table.py): the driver reads the public images only, the private folder is scanned in a process
of its own and read by the client shards, one record per client. ``data.classes`` must be
declared (the sub-folder names of the private part are not public); ``data.shape`` defaults
to the first public image's. The driver never opens the private folder: its layout is checked
by the scan, where the shards run.
"""
from __future__ import annotations

import os

from rknn_ray.data.registry import register_dataset
from rknn_ray.errors import ConfigError


def _first_shape(folder: str) -> list:
    from PIL import Image  # defers PIL

    from rknn_ray.data.tables import IMAGE_EXTS  # defers pandas, pyarrow
    names = sorted(f for f in os.listdir(folder) if os.path.splitext(f)[1].lower() in IMAGE_EXTS)
    from rknn_ray.data.tables import _image  # defers pandas, pyarrow
    a = _image(os.path.join(folder, names[0]), Image)   # a file that is no image: one line
    return [1, *a.shape] if a.ndim == 2 else [a.shape[2], a.shape[0], a.shape[1]]


def prepare_image_folder(cfg, inputs: dict):
    from rknn_ray.data.kinds.table import prepare_table  # defers pandas, pyarrow
    from rknn_ray.data.tables import image_folder, is_uri
    d = cfg.data
    for part, want in (("private", "classes"), ("public", "flat"), ("evaluation", "classes")):
        path = (getattr(d, part) or {}).get("path")
        if path and is_uri(path):
            raise ConfigError(f"data.{part}.path", f"{path!r} is a URI; image folders are read "
                              "from local paths only", "copy the images to a local folder (or "
                              "a mounted share), or export them to a parquet table with a "
                              "list column and use data.dataset=table")
        if part == "private" and path:      # read where the shards run: checked by the scan
            continue
        if (path is None and part != "evaluation") or (path and image_folder(path) != want):
            layout = "one sub-folder of images per class" if want == "classes" else \
                "a flat folder of images"
            raise ConfigError(f"data.{part}.path", f"{path!r} is not {layout}",
                              f"point data.{part}.path at {layout} (ImageFolder layout)")
    sets = ["data.private.label=label", "data.private.features=pixels", "data.public.id=id",
            "data.public.features=pixels"]
    if (d.evaluation or {}).get("path"):
        sets += ["data.evaluation.label=label", "data.evaluation.features=pixels"]
    if d.shape is None:
        sets.append(f"data.shape={_first_shape(d.public['path'])}")
    return prepare_table(cfg.with_overrides(sets), inputs, private_layout="classes")


register_dataset("image_folder", prepare=prepare_image_folder, parts=True,
                 description="the user's images, ImageFolder layout (docs/running.md)")

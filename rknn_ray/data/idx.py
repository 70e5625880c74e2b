"""IDX files (the MNIST / Fashion-MNIST format), raw or gzipped.

Format (big-endian): two zero bytes, a type code, the number of dimensions ``d``,
then ``d`` uint32 sizes, then the values in C order. We parse it ourselves (no
torchvision here) and check every size against the file length, so a truncated
download is reported as such instead of surfacing as a reshape error later.
"""
from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

from rknn_ray.errors import DataError

# IDX type code -> big-endian numpy dtype
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

# Standard file stems of an MNIST-style data set, split -> (images, labels).
# Both the LeCun names (``train-images-idx3-ubyte``) and the dotted names some
# mirrors use (``train-images.idx3-ubyte``) are accepted, raw or ``.gz``.
IDX_STEMS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def candidate_names(stem: str) -> list[str]:
    """File names under which ``stem`` may be stored."""
    dotted = stem.replace("-idx", ".idx")
    return [stem, stem + ".gz", dotted, dotted + ".gz"]


def find_idx_file(folders: list[str], stem: str) -> str | None:
    """The first existing file for ``stem`` in ``folders``, or None."""
    for folder in folders:
        for name in candidate_names(stem):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                return path
    return None


def parse_idx(buf: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode one IDX buffer into a native-endian numpy array."""
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0:
        raise DataError(f"{source}: not an IDX file (bad magic number {buf[:4]!r}). "
                        "Fix: point the data root at the original (gunzipped or .gz) IDX files.")
    code, ndim = buf[2], buf[3]
    if code not in IDX_DTYPES:
        raise DataError(f"{source}: unknown IDX type code 0x{code:02x}. "
                        "Fix: use the original IDX files (type 0x08 = uint8 for MNIST).")
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise DataError(f"{source}: truncated IDX header. Fix: download the file again.")
    shape = tuple(int(v) for v in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(buf) != expected:
        raise DataError(f"{source}: IDX header promises shape {shape} ({expected} bytes) "
                        f"but the file holds {len(buf)} bytes (truncated or corrupt). "
                        "Fix: download the file again.")
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(shape)
    return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str) -> np.ndarray:
    """Read one IDX file (``.gz`` decompressed on the fly)."""
    try:
        with open(path, "rb") as fh:
            buf = fh.read()
        if path.endswith(".gz"):
            buf = gunzip(buf)
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc}). Fix: download the file again.") from exc
    return parse_idx(buf, path)


def gunzip(raw: bytes) -> bytes:
    """Decompress gzip data with zlib directly (faster than gzip.open)."""
    d = zlib.decompressobj(wbits=31)
    out = d.decompress(raw)
    if not d.eof:
        raise EOFError("gzip stream is truncated")
    if d.unused_data:  # further gzip members (rare): let the gzip module handle them
        out += gzip.decompress(d.unused_data)
    return out


def write_idx(path: str, arr: np.ndarray) -> None:
    """Write ``arr`` as an IDX file (gzipped if ``path`` ends in .gz); used by tests and tools."""
    codes = {v.newbyteorder("="): k for k, v in IDX_DTYPES.items()}
    dt = np.dtype(arr.dtype)
    if dt not in codes:
        raise DataError(f"cannot write dtype {dt} as IDX; use uint8, int8, int16, int32, float32 or float64")
    header = bytes([0, 0, codes[dt], arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    body = np.ascontiguousarray(arr, dtype=dt.newbyteorder(">")).tobytes()
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wb") as fh:
        fh.write(header + body)


def read_idx_split(folders: list[str], split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) and labels (N,) of ``split`` ('train' or 'test') from ``folders``.

    Raises DataError if a file is missing (the caller turns that into the
    dataset-specific message) or if image and label counts disagree.
    """
    img_stem, lab_stem = IDX_STEMS[split]
    img_path, lab_path = find_idx_file(folders, img_stem), find_idx_file(folders, lab_stem)
    missing = [s for s, p in ((img_stem, img_path), (lab_stem, lab_path)) if p is None]
    if missing:
        raise FileNotFoundError(", ".join(missing))
    images, labels = read_idx(img_path), read_idx(lab_path)
    if images.ndim != 3:
        raise DataError(f"{img_path}: expected 3 dimensions (N, rows, cols), got shape {images.shape}")
    if labels.ndim != 1:
        raise DataError(f"{lab_path}: expected 1 dimension (N,), got shape {labels.shape}")
    if len(images) != len(labels):
        raise DataError(f"{img_path} holds {len(images)} images but {lab_path} holds "
                        f"{len(labels)} labels. Fix: use matching image/label files.")
    return images, labels

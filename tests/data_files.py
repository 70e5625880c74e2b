"""Writers of the datasets' original file formats (IDX, CIFAR pickles, SVHN .mat),
independent of the library's readers, for the tests that read them back."""
import gzip
import os
import pickle
import struct

import numpy as np
import scipy.io

RNG = np.random.default_rng(1234)


def write_idx_images(path, images):
    n, h, w = images.shape
    data = struct.pack(">IIII", 0x00000803, n, h, w) + images.astype(np.uint8).tobytes()
    (gzip.open if path.endswith(".gz") else open)(path, "wb").write(data)


def write_idx_labels(path, labels):
    data = struct.pack(">II", 0x00000801, len(labels)) + labels.astype(np.uint8).tobytes()
    (gzip.open if path.endswith(".gz") else open)(path, "wb").write(data)


def write_mnist(folder, n_train=40, n_test=20, gz=True, dotted=False):
    os.makedirs(folder, exist_ok=True)
    suffix = ".gz" if gz else ""
    sep = "." if dotted else "-"
    arrays = {}
    for split, n in (("train", n_train), ("t10k", n_test)):
        x = RNG.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        y = RNG.integers(0, 10, n).astype(np.uint8)
        write_idx_images(os.path.join(folder, f"{split}-images{sep}idx3-ubyte{suffix}"), x)
        write_idx_labels(os.path.join(folder, f"{split}-labels{sep}idx1-ubyte{suffix}"), y)
        arrays[split] = (x, y)
    return arrays


def write_cifar(root, n_per_batch=8):
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = RNG.integers(0, 256, (n_per_batch, 3072), dtype=np.uint8)
        labels = RNG.integers(0, 10, n_per_batch).tolist()
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": data,
                 b"filenames": [b"x.png"] * n_per_batch}
        with open(os.path.join(folder, name), "wb") as fh:
            pickle.dump(batch, fh, protocol=2)
        out[name] = (data, np.array(labels))
    with open(os.path.join(folder, "batches.meta"), "wb") as fh:
        pickle.dump({b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog",
                                      b"frog", b"horse", b"ship", b"truck"], b"num_vis": 3072}, fh)
    return out


def write_svhn(folder, name, n, labels=None):
    x = RNG.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
    y = (RNG.integers(1, 11, n) if labels is None else np.asarray(labels)).reshape(n, 1).astype(np.uint8)
    scipy.io.savemat(os.path.join(folder, name), {"X": x, "y": y})
    return x, y.ravel()

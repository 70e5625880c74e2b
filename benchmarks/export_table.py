"""Fashion-MNIST as a user's tables: the acceptance data for ``data.dataset: table``.

    python -m benchmarks.export_table --out DIR [--holders 3000] [--max-records 40]
        [--alpha 0.5] [--seed 0] [--dtype float32|uint8] [--limit N] [--data-root ROOT]

From the real IDX files (rknn_ray.data.idx, via the built-in reader) in the paper's split
(rknn_ray.data.splits, rule "paper" with ``--seed``: the same public and evaluation images as
the built-in ``fashion_mnist`` path at ``run.seed`` = seed) it writes

* ``private.parquet``: the 60,000 training images: ``pixels`` (one fixed-size list of 784
  values, as the built-in reader gives them: float32 in [0, 1], or uint8 with --dtype),
  ``label`` (the class name, a string) and ``holder`` (a string id): ``--holders`` holders of
  1 to ``--max-records`` records each, every holder's labels drawn from its own
  Dirichlet(alpha) class mix (small alpha: each holder has a few classes, as real parties do);
* ``public.parquet``: 5,000 test images under a string ``row_id``, without labels;
* ``evaluation.parquet``: the other 5,000 test images, labelled;
* ``public_truth.parquet``: the public rows' labels by ``row_id``, an answer key to measure
  the released labels afterwards. No config points at it: a real public table has none.

``--limit N`` keeps the first N training and N test images (tests). Prints what it wrote.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import numpy as np

from rknn_ray.data.readers import load_dataset
from rknn_ray.data.splits import make_splits
from rknn_ray.runio import write_parquet
from rknn_ray.errors import RknnError, first_line

FILES = ("private.parquet", "public.parquet", "evaluation.parquet", "public_truth.parquet")


def holder_sizes(total: int, holders: int, max_records: int, rng) -> np.ndarray:
    """``holders`` sizes in [1, max_records] that add up to ``total`` (about uniform)."""
    if not 1 <= holders <= total <= holders * max_records:
        raise ValueError(f"{total} records cannot go to {holders} holders of 1-{max_records} "
                         f"records each; pass --holders between {-(-total // max_records)} "
                         f"and {total}")
    sizes = rng.integers(1, max_records + 1, holders)
    while (diff := total - int(sizes.sum())) != 0:
        room = np.flatnonzero(sizes < max_records) if diff > 0 else np.flatnonzero(sizes > 1)
        pick = rng.choice(room, min(abs(diff), len(room)), replace=False)
        sizes[pick] += 1 if diff > 0 else -1
    return sizes


def skewed_holders(y: np.ndarray, sizes: np.ndarray, alpha: float, rng) -> np.ndarray:
    """The holder of each record: holder h takes ``sizes[h]`` records, their classes drawn
    from its own Dirichlet(alpha) mix among the records still free."""
    classes = int(y.max()) + 1
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(classes)]
    used = np.zeros(classes, np.int64)
    left = np.array([len(p) for p in pools], np.int64)
    out = np.full(len(y), -1, np.int64)
    for h in rng.permutation(len(sizes)):
        mix, need = rng.dirichlet(np.full(classes, alpha)), int(sizes[h])
        while need:
            q = mix * (left > 0)
            q = q / q.sum() if q.sum() > 0 else (left > 0) / (left > 0).sum()
            take = np.minimum(rng.multinomial(need, q), left)
            for c in np.flatnonzero(take):
                out[pools[c][used[c]:used[c] + take[c]]] = h
            used, left, need = used + take, left - take, need - int(take.sum())
    return out


def pixels_column(x: np.ndarray, dtype: str):
    """(N, ...) images -> one fixed-size list column of the flattened pixels."""
    import pyarrow as pa  # defers pyarrow
    flat = x.reshape(len(x), -1)
    flat = np.rint(flat * 255).astype(np.uint8) if dtype == "uint8" else flat.astype(np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])


def export(out: str, holders: int = 3000, max_records: int = 40, alpha: float = 0.5,
           seed: int = 0, dtype: str = "float32", limit: int | None = None,
           data_root: str | None = None) -> dict:
    """Write the four files into ``out``; returns what was written (for the printout)."""
    import pyarrow as pa  # defers pyarrow
    ds = load_dataset("fashion_mnist", data_root)
    if limit:
        ds = dataclasses.replace(ds, train_x=ds.train_x[:limit], train_y=ds.train_y[:limit],
                                 test_x=ds.test_x[:limit], test_y=ds.test_y[:limit])
    rng = np.random.default_rng(seed)
    sizes = holder_sizes(len(ds.train_y), holders, max_records, rng)
    sp = make_splits(ds, rule="paper", seed=seed)
    names = np.asarray(ds.class_names, dtype=object)
    n_train = len(ds.train_y)
    holder = skewed_holders(sp.private_y, sizes, alpha, rng)
    holder_ids = np.asarray([f"holder-{h:05d}" for h in rng.permutation(holders)], dtype=object)
    row_ids = [f"fmnist-test-{i - n_train:05d}" for i in sp.public_index]
    tables = {
        "private.parquet": pa.table({"pixels": pixels_column(sp.private_x, dtype),
                                     "label": names[sp.private_y].tolist(),
                                     "holder": holder_ids[holder].tolist()}),
        "public.parquet": pa.table({"row_id": row_ids,
                                    "pixels": pixels_column(sp.public_x, dtype)}),
        "evaluation.parquet": pa.table({"pixels": pixels_column(sp.eval_x, dtype),
                                        "label": names[sp.eval_y].tolist()}),
        "public_truth.parquet": pa.table({"row_id": row_ids,
                                          "label": names[sp.public_y].tolist()}),
    }
    os.makedirs(out, exist_ok=True)
    written = {}
    for name, table in tables.items():
        path = os.path.join(out, name)
        write_parquet(path, table)
        written[name] = (table.num_rows, os.path.getsize(path))
    per_holder = np.bincount(holder, minlength=holders)
    top = [np.bincount(sp.private_y[holder == h]).max() / per_holder[h] for h in range(holders)]
    return {"files": written, "holders": holders, "records": (int(per_holder.min()),
            int(np.median(per_holder)), int(per_holder.max())),
            "top_class_share": float(np.mean(top)), "image_shape": list(ds.image_shape)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for the parquet files")
    ap.add_argument("--holders", type=int, default=3000)
    ap.add_argument("--max-records", type=int, default=40, help="records per holder, at most")
    ap.add_argument("--alpha", type=float, default=0.5, help="Dirichlet skew of each holder's "
                    "labels (smaller: fewer classes per holder)")
    ap.add_argument("--seed", type=int, default=0, help="the split's seed (= run.seed) and the "
                    "holders'")
    ap.add_argument("--dtype", choices=("float32", "uint8"), default="float32")
    ap.add_argument("--limit", type=int, default=None, help="first N train and N test images")
    ap.add_argument("--data-root", default=None, help="folder of the IDX files")
    args = ap.parse_args(argv)
    if args.alpha <= 0 or args.max_records < 1 or (args.limit is not None and args.limit < 4):
        print("error: --alpha must be > 0, --max-records >= 1 and --limit >= 4", file=sys.stderr)
        return 2
    try:
        got = export(args.out, args.holders, args.max_records, args.alpha, args.seed,
                     args.dtype, args.limit, args.data_root)
    except (RknnError, ValueError, OSError) as exc:
        print(f"error: {first_line(exc)}", file=sys.stderr)
        return 2
    for name, (rows, size) in got["files"].items():
        print(f"{os.path.join(args.out, name)}: {rows:,} rows, {size / 2**20:.1f} MiB")
    lo, mid, hi = got["records"]
    print(f"{got['holders']:,} holders of {lo}-{hi} records (median {mid}); a holder's most "
          f"common class is {got['top_class_share']:.0%} of its records on average "
          f"(Dirichlet alpha {args.alpha}); pixels {args.dtype}, image shape "
          f"{got['image_shape']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

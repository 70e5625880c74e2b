"""A small labelled table as a user would bring it, for ``data.dataset: table``.

    python -m jobs.make_example_table --out DIR [--source breast_cancer|wine] [--seed 0]

From a data set that ships inside scikit-learn's wheel (breast cancer: 569 rows, 30
measurements, classes malignant / benign; wine: 178 rows, 13 measurements, three cultivars)
it writes CSV files with string class names, two made-up categorical columns (``site``, a
deterministic function of the row, carries no signal; ``size_band``, a coarse binning of one
measurement, does) and a made-up ``holder`` column (holders of 1 to ``--max-records``
records; the private records are theirs):

* ``private.csv``: features, ``label``, ``holder`` (60 % of the rows, stratified, seeded);
* ``public.csv``: a string ``row_id`` and the features, no label (25 %);
* ``evaluation.csv``: features and ``label`` (15 %);
* ``public_truth.csv``: ``row_id`` and ``label``: an answer key to measure the released
  labels afterwards; no config points at it.

jobs/configs/table_central.yaml and table_shuffle.yaml read the breast-cancer files shipped
in jobs/configs/data/breast_cancer/ (this command with its defaults writes them again).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import numpy as np

from rknn_ray.data.splits import stratified_parts

SOURCES = {"breast_cancer": ("load_breast_cancer", ("malignant", "benign"), "mean area"),
           "wine": ("load_wine", ("barolo", "grignolino", "barbera"), "proline")}
SITES = ("north", "south", "east", "west", "central")
FRACTIONS = (0.60, 0.25, 0.15)          # private, public, evaluation
DEFAULT_OUT = os.path.join("jobs", "configs", "data", "breast_cancer")


def _number(v: float) -> str:
    return f"{v:.5g}"


def _write(path: str, header: list[str], rows) -> int:
    n = 0
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        for row in rows:
            out.writerow(row)
            n += 1
    return n


def holders_for(count: int, max_records: int, rng) -> np.ndarray:
    """A holder index per record: holders of 1..max_records records, in a random order."""
    sizes = []
    while sum(sizes) < count:
        sizes.append(int(rng.integers(1, max_records + 1)))
    sizes[-1] -= sum(sizes) - count
    return rng.permutation(np.repeat(np.arange(len(sizes)), sizes))


def make_table(out: str, source: str = "breast_cancer", seed: int = 0,
               max_records: int = 8) -> dict:
    """Write the four CSV files into ``out``; returns {file: rows} and the class names."""
    import sklearn.datasets  # defers sklearn
    loader, classes, banded = SOURCES[source]
    bunch = getattr(sklearn.datasets, loader)()
    x, y = np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target, dtype=np.int64)
    names = [str(f).replace("/", "_") for f in bunch.feature_names]
    band_of = np.digitize(x[:, names.index(banded.replace("/", "_"))],
                          np.quantile(x[:, names.index(banded.replace("/", "_"))], [1 / 3, 2 / 3]))
    band = np.asarray(("small", "medium", "large"))[band_of]
    site = np.asarray(SITES)[(np.arange(len(y)) * 7 + 3) % len(SITES)]
    rng = np.random.default_rng(seed)
    n = len(y)
    n_pub, n_eval = int(round(n * FRACTIONS[1])), int(round(n * FRACTIONS[2]))
    priv, pub, ev = stratified_parts(y, n_pub, n_eval, rng)
    holder = holders_for(len(priv), max_records, rng)
    holder_ids = [f"h-{h:04d}" for h in rng.permutation(int(holder.max()) + 1)]
    row_ids = [f"row-{i:05d}" for i in rng.choice(100_000, len(pub), replace=False)]

    def features(i):
        return [_number(v) for v in x[i]] + [site[i], band[i]]
    cols = names + ["site", "size_band"]
    os.makedirs(out, exist_ok=True)
    rows = {
        "private.csv": _write(os.path.join(out, "private.csv"), cols + ["label", "holder"],
                              (features(i) + [classes[y[i]], holder_ids[holder[j]]]
                               for j, i in enumerate(priv))),
        "public.csv": _write(os.path.join(out, "public.csv"), ["row_id"] + cols,
                             ([row_ids[j]] + features(i) for j, i in enumerate(pub))),
        "evaluation.csv": _write(os.path.join(out, "evaluation.csv"), cols + ["label"],
                                 (features(i) + [classes[y[i]]] for i in ev)),
        "public_truth.csv": _write(os.path.join(out, "public_truth.csv"), ["row_id", "label"],
                                   ([row_ids[j], classes[y[i]]] for j, i in enumerate(pub))),
    }
    return {"rows": rows, "classes": list(classes), "holders": int(holder.max()) + 1,
            "features": len(cols)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT, help=f"folder (default {DEFAULT_OUT})")
    ap.add_argument("--source", choices=sorted(SOURCES), default="breast_cancer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-records", type=int, default=8, help="records per holder, at most")
    args = ap.parse_args(argv)
    if args.max_records < 1:
        print("error: --max-records must be >= 1", file=sys.stderr)
        return 2
    try:
        got = make_table(args.out, args.source, args.seed, args.max_records)
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror}. Fix: pass a writable --out",
              file=sys.stderr)
        return 2
    for name, rows in got["rows"].items():
        print(f"{os.path.join(args.out, name)}: {rows} rows")
    print(f"{got['features']} feature columns (2 categorical), classes {got['classes']}, "
          f"{got['holders']} holders of 1-{args.max_records} private records")
    return 0


if __name__ == "__main__":
    sys.exit(main())

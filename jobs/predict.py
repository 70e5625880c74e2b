"""The student of a finished run applied to new rows.

    rknn-ray predict RUN --input FILE --out FILE [--id COLUMN] [--allow-pickle]
    python -m jobs.predict RUN ...

Reads a parquet / CSV / Arrow file (or a folder or glob of them) with the table's feature
columns, turns each row into the student's input with the featurizer the run fitted on its
public rows (predictor.json: standardization, one-hot categories, pixel scaling) and writes
the id column (the public part's, or ``--id``, when the input has it), ``class`` and
``probability`` to ``--out`` (``.parquet`` or ``.csv``). When the input carries the run's
label column, the accuracy against it is printed too.
"""
from __future__ import annotations

import argparse
import sys

EXAMPLES = """\
examples:
  rknn-ray predict runs/mine --input new_rows.csv --out predictions.csv
  rknn-ray predict runs/mine --input evaluation.parquet --out pred.parquet --id row_id
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rknn-ray predict", description=__doc__.split("\n\n")[0],
                                 epilog=EXAMPLES,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run", help="a finished run folder (report.json, student.pt, predictor.json)")
    ap.add_argument("--input", required=True, help="parquet, CSV or Arrow file, folder or glob")
    ap.add_argument("--out", required=True, help="predictions file: .parquet or .csv")
    ap.add_argument("--id", default=None, help="the id column to keep (default: the public "
                    "part's data.public.id, when the input has it)")
    ap.add_argument("--allow-pickle", action="store_true",
                    help="load the run's pickled encoder (a student on simclr encoder features; "
                         "raw, pca and hog encoders are saved without pickle): only for a run "
                         "folder you trust")
    args = ap.parse_args(argv)
    # the heavy imports (torch, pyarrow) only once the arguments are good: --help stays fast
    import os

    import numpy as np

    from rknn_ray.errors import RknnError, first_line
    from rknn_ray.job.predict import Predictor
    from rknn_ray.data.tables import read
    from rknn_ray.runio import atomic_path
    ext = os.path.splitext(args.out)[1].lower()
    if ext not in (".csv", ".parquet", ".pq"):
        print(f"error: --out {args.out!r}: name a .csv or .parquet file", file=sys.stderr)
        return 2
    try:
        predictor = Predictor.from_run(args.run, allow_pickle=args.allow_pickle)
        table = read(args.input, what="--input")
        frame = predictor.predict(table, id_column=args.id)
        label = (predictor.table or {}).get("label")
        if label and label in table.column_names:
            truth = np.asarray(table.column(label).cast("string").to_pylist(), dtype=object)
            acc = float(np.mean(frame["class"].to_numpy() == truth)) if len(truth) else float("nan")
            print(f"accuracy against the input's {label!r} column: {acc:.4f} "
                  f"({len(truth)} rows)")
        with atomic_path(args.out) as tmp:
            if ext == ".csv":
                frame.to_csv(tmp, index=False)
            else:
                frame.to_parquet(tmp, index=False)
    except (RknnError, OSError) as exc:
        print(f"error: {first_line(exc, 400)}", file=sys.stderr)
        return 2
    print(f"{len(frame)} predictions: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

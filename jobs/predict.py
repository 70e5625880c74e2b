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
    from rknn_ray.predictor import Predictor
    from rknn_ray.runio import atomic_path
    ext = os.path.splitext(args.out)[1].lower()
    if ext not in (".csv", ".parquet", ".pq"):
        print(f"error: --out {args.out!r}: name a .csv or .parquet file", file=sys.stderr)
        return 2
    clash = output_clash(args.out, args.input)
    if clash:
        print(f"error: --out {args.out!r} {clash}: predictions would overwrite the input. Fix: "
              "write them to another file", file=sys.stderr)
        return 2
    try:
        predictor = Predictor.from_run(args.run, allow_pickle=args.allow_pickle)
        label = (predictor.table or {}).get("label")
        with atomic_path(args.out) as tmp:
            rows, right, labelled = predict_file(predictor, args.input, tmp, ext, args.id, label)
        if labelled:
            print(f"accuracy against the input's {label!r} column: {right / rows:.4f} "
                  f"({rows} rows)" if rows else f"accuracy against the input's {label!r} "
                  "column: no rows")
    except (RknnError, OSError) as exc:
        print(f"error: {first_line(exc, 400)}", file=sys.stderr)
        return 2
    print(f"{rows} predictions: {args.out}")
    return 0


#: input rows predicted at a time: the input is streamed, never read whole (a 1 GB CSV took
#: 9.9 GB of RAM read whole)
BATCH_ROWS = 1 << 16


def output_clash(out: str, source: str) -> str | None:
    """Why ``out`` may not be written (it is the input file, or inside the input folder), or
    None."""
    import glob
    import os
    target = os.path.realpath(out)
    inputs = glob.glob(source) if any(c in source for c in "*?[") else [source]
    for path in inputs:
        real = os.path.realpath(path)
        if real == target:
            return "is the --input file"
        if os.path.isdir(real) and target.startswith(real.rstrip(os.sep) + os.sep):
            return "is inside the --input folder"
    return None


def predict_file(predictor, source: str, tmp: str, ext: str, id_column, label):
    """Predict ``source`` batch by batch into ``tmp`` (CSV or parquet): (rows, rows whose class
    equals the input's ``label`` column, whether it had one). Memory: one batch at a time."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from rknn_ray.data.tables import open_dataset
    from rknn_ray.errors import DataError
    dataset = open_dataset(source, "--input")
    labelled = bool(label) and label in dataset.schema.names
    rows = right = 0
    writer = schema = None
    try:
        for batch in _batches(dataset):
            table = pa.Table.from_batches([batch])
            frame = predictor.predict(table, id_column=id_column)
            out = pa.Table.from_pandas(frame, preserve_index=False)
            if writer is None:
                schema = out.schema
                writer = (pcsv.CSVWriter(tmp, schema) if ext == ".csv"
                          else pq.ParquetWriter(tmp, schema))
            writer.write_table(out if out.schema == schema else out.cast(schema))
            rows += table.num_rows
            if labelled:
                truth = np.asarray(table.column(label).cast("string").to_pylist(), dtype=object)
                right += int(np.sum(frame["class"].to_numpy() == truth))
        if writer is None:                  # no rows: an empty file with the header
            frame = predictor.predict(dataset.schema.empty_table(), id_column=id_column)
            out = pa.Table.from_pandas(frame, preserve_index=False)
            (pcsv.write_csv if ext == ".csv" else pq.write_table)(out, tmp)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DataError(f"--input: cannot read {source!r}: {str(exc).splitlines()[0][:160]}. "
                        "Fix: check every file of the input has the same columns and "
                        "types") from None
    finally:
        if writer is not None:
            writer.close()
    return rows, right, labelled


def _batches(dataset):
    """The dataset's record batches of at most BATCH_ROWS rows, read ahead little."""
    for batch in dataset.to_batches(batch_size=BATCH_ROWS, batch_readahead=1,
                                    fragment_readahead=1):
        if batch.num_rows:
            yield batch


if __name__ == "__main__":
    sys.exit(main())

"""The user's tables: opening a part (file, folder or glob), its columns, features and labels.

Shared by the three places a table is read: the driver (public and evaluation parts only),
the private-part scan (rknn_ray.data.table_scan, where the shards run) and each client shard
(rknn_ray.data.table_source, its own clients' rows). One reading, so the three agree on
what a record's features and label are.

Features are every column that is not the label, client or id column (or ``features``: a
list of columns, or one list-typed column such as a fixed-size list of pixels). Numeric
columns are standardized and string columns one-hot encoded with statistics fitted on the
PUBLIC rows only (:class:`Featurizer`); with ``data.shape`` the features are an image,
reshaped and left as they are for the image encoders. Labels are mapped to the declared
class list by their text, so the same labels read from parquet (int) and CSV (int) agree.
"""
from __future__ import annotations

import difflib

import glob
import hashlib
import json
import os
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from rknn_ray.accounting.source_identity import blake2b_64
from rknn_ray.data.remote import check_remote
from rknn_ray.errors import ConfigError, DataError, first_line, quoted

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".arrow": "ipc",
           ".feather": "ipc", ".ipc": "ipc"}
PART_KEYS = {"private": ("path", "label", "client", "holders", "features", "sites"),
             "public": ("path", "id", "features"),
             "evaluation": ("path", "label", "features")}
PART_KEY_DOCS = {
    "path": "a parquet / CSV / Arrow file, a folder of them (hive sub-folders become columns) "
            "or a glob; the private path is read by the shards where they run",
    "label": "the label column (strings or integers, matched to data.classes by text)",
    "client": "the holder id column: each distinct id is one client (unset: one record per client)",
    "holders": "with client, optional: the number of holders you expect; the job reads the "
               "count from the data (public under its relation) and refuses a mismatch before "
               "any budget is reserved",
    "id": "the public row id column (labels are keyed by it; unset: row numbers)",
    "features": "a list of columns, or one list-typed column (unset: every column that is not "
                "the label, client or id)",
    "sites": "instead of path, private data that lives on its holders' own nodes: site name -> "
             "{path, labels, resources, shards}; each site's part is read only on a node with "
             "those Ray node labels / custom resources, by its own scan and its own shards "
             "(shards: default 1); a holder id on two sites is refused (running.md, 'Private "
             "data on its holders' nodes')"}
CLASSES_METADATA = b"classes"       # public file schema metadata: a JSON list of class names


@dataclass(frozen=True)
class Site:
    """One site of ``data.private.sites``: its part's path on its own nodes, what a node must
    offer to hold it (Ray node labels and/or custom resources, as ``cluster.placement``), and
    how many client shards read it there."""
    name: str
    path: str
    labels: tuple = ()                  # ((label, value), ...)
    resources: tuple = ()               # ((resource, amount), ...)
    shards: int = 1

    @property
    def key(self) -> str:
        return f"data.private.sites.{self.name}"

    @property
    def need(self) -> dict:
        """What a node must offer, as a checked ``cluster.placement`` entry."""
        return {"resources": dict(self.resources), "labels": dict(self.labels)}


@dataclass(frozen=True)
class Part:
    """One part of the user's data as ``data.<part>`` declares it."""
    name: str
    path: str | None = None
    label: str | None = None
    client: str | None = None
    id: str | None = None
    features: tuple | str | None = None
    holders: int | None = None          # optional: the holders expected (checked on the data)
    shown: str | None = None            # its name in messages, for data no config key names

    @classmethod
    def of(cls, name: str, section) -> "Part":
        values = dict(section or {})
        feats = values.get("features")
        if isinstance(feats, (list, tuple)):
            feats = tuple(str(f) for f in feats)
        return cls(name, values.get("path"), values.get("label"), values.get("client"),
                   values.get("id"), feats, values.get("holders"))

    @property
    def key(self) -> str:
        return self.shown or f"data.{self.name}"

    @property
    def is_private(self) -> bool:
        """The private part, or one site's share of it (its values are never named)."""
        return self.name.split(".")[0] == "private"

    def at_site(self, site: Site) -> "Part":
        """This part as one site holds it: that site's path, named ``data.private.sites.X``
        (so every message about its rows names the site)."""
        return replace(self, name=f"private.sites.{site.name}", path=site.path)


def sites_of(section) -> tuple:
    """``data.private.sites`` (checked by rknn_ray.data.config) as (Site, ...), in the
    config's order; () when the private part is one path."""
    return tuple(Site(str(n), str(v["path"]),
                      tuple(sorted((str(k), str(x)) for k, x in dict(v.get("labels") or {}).items())),
                      tuple(sorted((str(k), float(x)) for k, x in
                                   dict(v.get("resources") or {}).items())),
                      int(v.get("shards") or 1))
                 for n, v in dict(dict(section or {}).get("sites") or {}).items())


def is_uri(path: str) -> bool:
    """A path pyarrow opens through one of its file systems (``s3://``, ``gs://``,
    ``hdfs://``, ``file://``), not the local file system's own calls."""
    return "://" in str(path)


def _remote_files(path: str):
    """(what pyarrow opens, its format, its file system) for a URI: one file or a folder,
    listed recursively (``pyarrow.fs.FileSelector``); globs are for local paths only."""
    if any(ch in path.split("://", 1)[1] for ch in "*?["):
        raise DataError(f"{path!r}: a glob in a URI. Fix: globs work on local paths only; "
                        "give the URI of one file or of a folder of them")
    try:
        fs, root = pafs.FileSystem.from_uri(path)
        info = fs.get_file_info(root)
        if info.type == pafs.FileType.Directory:      # opened as a folder (hive sub-folders)
            target = root
            files = sorted(f.path for f in fs.get_file_info(pafs.FileSelector(root, recursive=True))
                           if f.type == pafs.FileType.File
                           and os.path.splitext(f.path)[1].lower() in FORMATS)
        else:
            files = [root] if info.type == pafs.FileType.File else []
            target = files
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
        raise DataError(f"cannot open {path!r}: {str(exc).splitlines()[0][:160]}. Fix: check "
                        "the URI (s3://, gs://, hdfs:// or file://) and that this machine can "
                        "reach it") from None
    return target, files, fs


def _folder_files(path: str) -> list:
    """Every data file under a local folder, each once: links to folders are refused (a loop
    such as ``loop -> .`` would read every file again), files reached twice (a link to a
    file) are read once."""
    files, seen = [], set()
    for folder, dirs, names in os.walk(path):
        for d in dirs:
            if os.path.islink(os.path.join(folder, d)):
                raise DataError(f"{os.path.join(folder, d)!r} is a link to a folder: links to "
                                "folders are not followed (a loop would read the same files "
                                "again). Fix: replace the link by the folder itself, or remove it")
        for f in sorted(names):
            full = os.path.join(folder, f)
            real = os.path.realpath(full)
            if os.path.splitext(f)[1].lower() in FORMATS and real not in seen:
                seen.add(real)
                files.append(full)
    return sorted(files)


def _files(path: str):
    """(what pyarrow opens, its format, its file system: None for local paths) for a file, a
    folder (searched recursively), a glob (local paths only) or a URI (:func:`is_uri`)."""
    fs = None
    if is_uri(path):
        target, files, fs = _remote_files(path)
    elif any(ch in path for ch in "*?["):
        files = sorted(f for f in glob.glob(path, recursive=True) if os.path.isfile(f))
        target = files
    elif os.path.isdir(path):
        files = _folder_files(path)
        target = path
    elif os.path.isfile(path):
        files, target = [path], path
    else:
        files, target = [], path
    if not files:
        raise DataError(f"no data files at {path!r}. Fix: point the path at a parquet, CSV or "
                        "Arrow file, a folder of them or a glob such as 'data/*.parquet'")
    formats = {FORMATS.get(os.path.splitext(f)[1].lower()) for f in files}
    if None in formats or len(formats) != 1:
        raise DataError(f"{path!r} holds files of several or unknown formats "
                        f"({sorted(str(f) for f in formats)}). Fix: one format per part, named "
                        f"by extension ({', '.join(sorted(FORMATS))})")
    return target, formats.pop(), fs


IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def image_folder(path: str) -> str | None:
    """'flat' (images in the folder: public rows, ids = file names), 'classes' (one sub-folder
    of images per class: a labelled part, labels = sub-folder names) or None (not one)."""
    if is_uri(path) or not os.path.isdir(path):       # image folders: local paths only
        return None
    names = os.listdir(path)
    if any(os.path.splitext(n)[1].lower() in IMAGE_EXTS for n in names):
        return "flat"
    subs = [n for n in names if os.path.isdir(os.path.join(path, n))]
    if subs and all(any(os.path.splitext(f)[1].lower() in IMAGE_EXTS
                        for f in os.listdir(os.path.join(path, d))) for d in subs):
        return "classes"
    return None


def _image(file: str, Image) -> np.ndarray:
    """One image as float32 in [0, 1] (H, W) or (H, W, C); a file that is not one (empty,
    damaged, a folder named like an image, beyond PIL's decompression-bomb limit) is a
    DataError naming it."""
    try:
        with Image.open(file) as im:
            return np.asarray(im.convert("L" if im.mode in ("L", "1", "I;16", "I") else "RGB"),
                              dtype=np.float32) / 255.0
    except Image.DecompressionBombError as exc:
        why = f"too large to decode safely ({first_line(exc).split(', could')[0]})"
    except IsADirectoryError:
        why = "a folder, not an image"
    except (OSError, ValueError, SyntaxError, Image.UnidentifiedImageError) as exc:
        why = ("an empty file" if os.path.isfile(file) and os.path.getsize(file) == 0
               else f"not an image PIL can read ({type(exc).__name__})")
    raise DataError(f"{quoted(file, 200)} is {why}. Fix: remove or replace it (every file "
                    "named like an image must be one, of the size of the others)")


def read_images(path: str, layout: str) -> pa.Table:
    """An image folder as a table: ``pixels`` (float32 in [0, 1], channels first, flattened:
    one fixed-size list) with ``id`` (flat) or ``label`` (class sub-folders). Every image must
    have the size and channels of the first."""
    from PIL import Image  # defers PIL
    if layout == "flat":
        files = [(f, None) for f in sorted(os.listdir(path))
                 if os.path.splitext(f)[1].lower() in IMAGE_EXTS]
    else:
        files = [(os.path.join(d, f), d) for d in sorted(os.listdir(path))
                 if os.path.isdir(os.path.join(path, d))
                 for f in sorted(os.listdir(os.path.join(path, d)))
                 if os.path.splitext(f)[1].lower() in IMAGE_EXTS]
    pixels, shape = [], None
    for name, _ in files:
        a = _image(os.path.join(path, name), Image)
        a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
        if shape is None:
            shape = a.shape
        elif a.shape != shape:
            raise DataError(f"{path}: mixed feature lengths: {name} is {a.shape}, the first image "
                            f"{shape}. Fix: give every image the same size and channels")
        pixels.append(a.ravel())
    flat = np.stack(pixels) if pixels else np.zeros((0, 1), np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
    other = {"id": [n for n, _ in files]} if layout == "flat" else {"label": [d for _, d in files]}
    meta = {b"shape": json.dumps(list(shape or ())).encode()}
    return pa.table({"pixels": column, **other}).replace_schema_metadata(meta)


def open_dataset(path: str, what: str = "") -> pads.Dataset:
    """A pyarrow dataset over a file, a folder (hive-partitioned sub-folders become columns),
    a glob or a URI (:func:`is_uri`: a file or a folder); an image folder is read whole (rknn_ray.data.tables.read_images). Opening a
    file reads metadata at most, no rows."""
    layout = image_folder(str(path))
    if layout is not None:
        return pads.dataset(read_images(str(path), layout))
    check_remote(str(path), what or "data path")     # a URI answers within a bounded wait
    target, fmt, fs = _files(str(path))
    try:
        if isinstance(target, str) and fs is None and os.path.isdir(target):   # a local folder
            dataset = pads.dataset(_folder_files(target), format=fmt, partitioning="hive",
                                   partition_base_dir=target, exclude_invalid_files=False)
        elif isinstance(target, str) and fs is not None:      # a remote folder
            dataset = pads.dataset(target, format=fmt, partitioning="hive", filesystem=fs,
                                   exclude_invalid_files=False)
        else:
            dataset = pads.dataset(target, format=fmt, filesystem=fs)
        dataset.schema.names       # decoded here: a header that is not UTF-8 fails now
        return dataset
    except UnicodeDecodeError:     # a spreadsheet's Latin-1 or UTF-16 export
        raise DataError(f"cannot read {path!r} as {fmt}: its column names are not UTF-8 text. "
                        "Fix: save the file as UTF-8 (a spreadsheet's 'CSV UTF-8')") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise DataError(f"cannot read {path!r} as {fmt}: {str(exc).splitlines()[0][:160]}. "
                        "Fix: check the file is a valid, complete file of that format") from None


def read(path: str, columns=None, what: str = "") -> pa.Table:
    """The rows of ``path`` (only ``columns``), a file that cannot be parsed a DataError."""
    try:
        return open_dataset(path, what).to_table(columns=columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as exc:
        raise DataError(f"{what or path}: cannot read {path!r}: {str(exc).splitlines()[0][:160]}. "
                        "Fix: check every file of the part has the same columns and types") from None


def as_table(data) -> pa.Table:
    """An Arrow table from data given in memory: an Arrow table, a pandas DataFrame, or a
    dict of column -> numpy array (2-D arrays become one fixed-size list column)."""
    table = _as_table(data)        # marked: a message about it names no file (missing)
    return table.replace_schema_metadata({**(table.schema.metadata or {}), IN_MEMORY: b"1"})


#: schema metadata key :func:`as_table` sets on a table given in memory
IN_MEMORY = b"rknn_ray.in_memory"


def _as_table(data) -> pa.Table:
    if isinstance(data, pa.Table):
        return data
    if hasattr(data, "to_dict") and hasattr(data, "columns"):          # pandas
        return pa.Table.from_pandas(data, preserve_index=False)
    if isinstance(data, dict):
        cols = {}
        for name, values in data.items():
            a = np.asarray(values)
            if a.ndim > 1:
                flat = a.reshape(len(a), -1)
                cols[name] = pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])
            else:
                cols[name] = pa.array(a)
        return pa.table(cols)
    raise DataError(f"data of type {type(data).__name__} cannot be read as a table. Fix: pass a "
                    "pandas DataFrame, an Arrow table or a dict of column -> numpy array")


def schema_of(part: Part, table: pa.Table | None = None) -> pa.Schema:
    return table.schema if table is not None else open_dataset(part.path).schema


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _is_text(t: pa.DataType) -> bool:
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_dictionary(t)
            or pa.types.is_boolean(t))


def missing(part: Part, schema: pa.Schema, columns) -> None:
    """DataError naming the first column ``part`` lacks."""
    names = set(schema.names)
    memory = IN_MEMORY in (schema.metadata or {})
    where = (f"the data given in memory for {part.name!r}" if memory
             else quoted(part.path, 200) if part.path else "the data")
    for col in columns:
        if col is not None and col not in names:
            near = difflib.get_close_matches(str(col), schema.names, n=3, cutoff=0.6)
            near += [n for n in schema.names if str(col).lower() in n.lower() and n not in near]
            shown = list(dict.fromkeys(near[:3] + schema.names[:12]))   # the near ones first
            meant = f"; did you mean {quoted(near[0], 60)}?" if near else ""
            raise DataError(f"{part.key}: column {quoted(col)} not found in {where}{meant} "
                            f"(columns: {', '.join(quoted(n, 40) for n in shown)}"
                            f"{', ...' if len(schema.names) > len(shown) else ''}). Fix: name an "
                            f"existing column in {part.key}, or add it to the file")


@dataclass(frozen=True)
class Columns:
    """The feature columns every part reads: a list of scalar columns, or one list column."""
    names: tuple
    list_column: bool
    categorical: tuple = ()      # the string columns among ``names`` (one-hot encoded)

    @classmethod
    def resolve(cls, part: Part, schema: pa.Schema, exclude) -> "Columns":
        """``part.features`` (or every column but ``exclude``), typed by ``schema``."""
        if isinstance(part.features, str):
            names = (part.features,)
        elif part.features:
            names = tuple(part.features)
        else:
            names = tuple(n for n in schema.names if n not in set(exclude) and n is not None)
        missing(part, schema, names)
        if not names:
            raise DataError(f"{part.key}: no feature columns left. Fix: list them in "
                            f"{part.key}.features")
        types = {n: schema.field(n).type for n in names}
        lists = [n for n in names if _is_list(types[n])]
        if lists and len(names) > 1:
            raise DataError(f"{part.key}: list column {lists[0]!r} among other feature columns. "
                            f"Fix: set {part.key}.features to the one list column, or to scalar "
                            "columns only")
        empty = [n for n in names if pa.types.is_null(types[n])]
        if empty and len(empty) == len(names):
            raise DataError(f"{part.key}: {quoted(part.path or 'the data', 200)} holds no rows "
                            "(a header only: every column is empty). Fix: point "
                            f"{part.key}.path at a file with rows")
        if empty:
            raise DataError(f"{part.key}: column {quoted(empty[0])} is empty in every row. Fix: "
                            f"fill it, or leave it out of {part.key}.features")
        bad = [n for n in names if not (_is_list(types[n]) or _is_text(types[n])
                                        or pa.types.is_integer(types[n])
                                        or pa.types.is_floating(types[n]))]
        if bad:
            raise DataError(f"{part.key}: column {bad[0]!r} has type {types[bad[0]]}, not a "
                            f"number, text or list of numbers. Fix: leave it out of {part.key}.features")
        return cls(names, bool(lists), tuple(n for n in names if _is_text(types[n])))


def feature_matrix(table: pa.Table, cols: Columns, part: Part, width: int | None = None,
                   private: bool = False) -> np.ndarray:
    """(N, L) float64 of a list column, or the numeric columns with text columns as ``object``:
    the raw values, before any fitted statistics. Nulls, NaN and mixed list lengths are
    errors naming the part and the fix (``private``: never a row's position, which depends
    on other holders' records)."""
    n = table.num_rows
    if cols.list_column:
        col = table.column(cols.names[0]).combine_chunks()
        if col.null_count:
            raise DataError(f"{part.key}: {col.null_count} rows have no value in list column "
                            f"{cols.names[0]!r}. Fix: drop those rows")
        if pa.types.is_fixed_size_list(col.type):
            lengths = np.full(n, col.type.list_size)
        else:
            lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
        if n and (lengths.min() != lengths.max() or (width is not None and lengths[0] != width)):
            want = width if width is not None else int(lengths[0])
            bad = int(np.flatnonzero(lengths != want)[0])
            where = "a record" if private else f"row {bad}"
            raise DataError(f"{part.key}: mixed feature lengths in {cols.names[0]!r} ({where} "
                            f"has {int(lengths[bad])} values, expected {want}). Fix: give every "
                            "record the same number of features")
        values = pc.list_flatten(col).to_numpy(zero_copy_only=False).astype(np.float64)
        if not private:             # the private scan says it without a count (its own check)
            _finite(values.reshape(n, -1) if n else values, part, cols.names[0])
        return values.reshape(n, -1) if n else np.zeros((0, width or 0))
    out = np.empty((n, len(cols.names)), dtype=object if cols.categorical else np.float64)
    for j, name in enumerate(cols.names):
        col = table.column(name)
        if col.null_count:
            raise DataError(f"{part.key}: column {name!r} has {col.null_count} empty values. "
                            "Fix: drop or impute those rows")
        if name in cols.categorical:
            out[:, j] = np.asarray(col.cast(pa.string()).to_pylist(), dtype=object)
        else:
            out[:, j] = col.to_numpy().astype(np.float64)
            if not private:
                _finite(out[:, j], part, name)
    return out


def _finite(values: np.ndarray, part: Part, column: str) -> None:
    """DataError when a feature value is NaN or infinite (before any statistics are fitted
    on it: an inf made numpy warn four times, and was accepted in the evaluation part)."""
    values = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        rows = int(bad.any(axis=1).sum()) if bad.ndim == 2 else int(bad.sum())
        raise DataError(f"{part.key}: {rows} rows have a NaN or infinite value in "
                        f"{quoted(column)}. Fix: drop or impute those rows")


def raw_numbers(matrix: np.ndarray) -> np.ndarray:
    """Every raw feature as a number: text values as a 24-bit digest of their text. What a
    record's fingerprint is made of (the same record read from any format gives the same)."""
    if matrix.dtype != object:
        return matrix
    out = np.empty(matrix.shape, dtype=np.float64)
    for j in range(matrix.shape[1]):
        col = matrix[:, j]
        if isinstance(col[0] if len(col) else 0.0, str):
            out[:, j] = [int.from_bytes(hashlib.blake2b(v.encode(), digest_size=3).digest(),
                                        "little") for v in col]
        else:
            out[:, j] = col.astype(np.float64)
    return out


@dataclass
class Featurizer:
    """Raw features -> float32 model inputs, fitted on the public rows only: numeric columns
    standardized, text columns one-hot over the categories public rows hold (another
    category: all zeros), an image (``shape``) reshaped and multiplied by ``scale``
    (:func:`pixel_scale`: 1/255 for uint8 pixels, else 1)."""
    columns: Columns
    shape: tuple | None = None
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    categories: dict = field(default_factory=dict)
    scale: float = 1.0
    # the value domain (:meth:`fit`, data.clip): each numeric model column's bounds
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    domain: dict | None = None          # column -> {low, high, from}
    margin: float = 0.0

    def _numeric(self, raw: np.ndarray) -> list:
        """The raw matrix's numeric columns (every value of a list column)."""
        if self.columns.list_column:
            return list(range(raw.shape[1]))
        return [j for j, n in enumerate(self.columns.names) if n not in self.columns.categorical]

    def fit(self, raw: np.ndarray, clip=None) -> "Featurizer":
        """Statistics and the value domain from the PUBLIC rows ``raw`` (``clip``: the checked
        ``data.clip`` mapping, :func:`clip_settings`)."""
        num = self._numeric(raw)
        if self.columns.list_column:     # every column numeric: no copy of a float64 matrix
            values = np.asarray(raw, np.float64)
        else:
            values = raw[:, num].astype(np.float64) if num else np.zeros((len(raw), 0))
        if self.shape is None:
            self.mean = values.mean(axis=0) if len(values) else np.zeros(len(num))
            std = values.std(axis=0) if len(values) else np.ones(len(num))
            self.std = np.where(std > 0, std, 1.0)
            self.categories = {n: tuple(sorted(set(raw[:, j])))
                               for j, n in enumerate(self.columns.names)
                               if n in self.columns.categorical}
        self._fit_domain(values, clip)
        return self

    def _fit_domain(self, values: np.ndarray, clip) -> None:
        """``low`` / ``high`` per numeric model column (:func:`clip_settings`): the public
        range widened by the margin, or the config's bounds; a list column (an image) has one
        pair for all its values. Checked on public facts alone: a bound that is not finite once
        featurized (float32) is refused here, so no private value can overflow."""
        margin, bounds = clip_settings(clip)
        names = [self.columns.names[0]] if self.columns.list_column else \
            [n for n in self.columns.names if n not in self.columns.categorical]
        numeric = set(names)
        for name in bounds:
            if name not in numeric:
                raise ConfigError(f"data.clip.bounds.{name}", "is not a numeric feature column",
                                  "name one of " + (", ".join(quoted(n, 40) for n in names[:12])
                                                    or "none: every feature is text"))
        if self.columns.list_column:        # one pair over every value of the list column
            flat = values.reshape(-1)
            lo0 = np.array([flat.min() if flat.size else 0.0])
            hi0 = np.array([flat.max() if flat.size else 0.0])
        else:
            lo0 = values.min(axis=0) if len(values) else np.zeros(len(names))
            hi0 = values.max(axis=0) if len(values) else np.zeros(len(names))
        with np.errstate(over="ignore", invalid="ignore"):
            lo, hi = lo0 - margin * (hi0 - lo0), hi0 + margin * (hi0 - lo0)
        given = np.array([n in bounds for n in names], bool)
        for j, n in enumerate(names):
            if n in bounds:
                lo[j], hi[j] = bounds[n]
        with np.errstate(over="ignore", invalid="ignore"):
            if self.shape is not None:
                ends = np.stack([lo, hi]) * self.scale
            else:
                ends = (np.stack([lo, hi]) - self.mean) / self.std
            ok = np.isfinite(np.stack([lo, hi])).all(axis=0) & \
                np.isfinite(ends.astype(np.float32)).all(axis=0)
        if not ok.all():
            j = int(np.flatnonzero(~ok)[0])
            if given[j]:
                raise ConfigError(f"data.clip.bounds.{names[j]}", "is too wide: its ends are "
                                  "not finite once featurized (float32)", "give bounds "
                                  "closer to the public rows' range")
            raise DataError(f"data.public: column {quoted(names[j])}'s range, widened by "
                            f"data.clip.margin={margin:g}, is not finite once featurized "
                            "(float32). Fix: rescale that column, or lower data.clip.margin")
        self.domain = {n: {"low": float(lo[j]), "high": float(hi[j]),
                           "from": "data.clip.bounds" if given[j] else "public"}
                       for j, n in enumerate(names)}
        self.margin = float(margin)
        width = values.shape[1]
        self.low = np.broadcast_to(lo, (width,)).copy() if self.columns.list_column else lo
        self.high = np.broadcast_to(hi, (width,)).copy() if self.columns.list_column else hi

    def clipped(self, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``values`` (numeric model columns, float) clipped to the domain (a featurizer saved
        before it had one: unchanged; NaN stays NaN)."""
        if self.low is None or self.low.size == 0:
            if out is None:
                return values
            out[...] = values
            return out
        if self.columns.list_column:     # one pair for every value: scalars (3x faster)
            lo, hi = self.low[:1].astype(values.dtype)[0], self.high[:1].astype(values.dtype)[0]
        else:
            lo, hi = self.low.astype(values.dtype), self.high.astype(values.dtype)
        return np.clip(values, lo, hi, out=out)

    def describe_domain(self) -> dict:
        """report.json's ``privacy.domain``: what a record's value may be, where the bounds
        came from, and what is refused (public facts only)."""
        out = {"values": "finite numbers; every private numeric feature value is clipped to "
                         "its column's [low, high] before it is featurized (in the scan, the "
                         "shards, the public and evaluation parts and prediction alike)",
               "bounds": f"the public rows' range per column widened by data.clip.margin="
                         f"{self.margin:g} of its width on each side, unless data.clip.bounds "
                         "names the column" + ("; a list column (an image) has one pair for "
                                               "all its values" if self.columns.list_column
                                               else ""),
               "text": "a text value is one of the public rows' categories, or none (all "
                       "zeros)" if self.columns.categorical else None,
               "outside": "NaN, infinite or unparseable values, empty cells and labels "
                          "outside data.classes are malformed input: refused before any "
                          "budget is reserved, never clipped",
               "margin": float(self.margin), "columns": dict(self.domain or {})}
        return {k: v for k, v in out.items() if v is not None}

    @property
    def output_shape(self) -> tuple:
        if self.shape is not None:
            return tuple(self.shape)
        width = len(self.mean) + sum(len(c) for c in self.categories.values())
        return (int(width),)

    def to_dict(self) -> dict:
        """The fitted parameters as plain JSON values (saved with the student as
        ``predictor.json``; fitted on public rows only). :meth:`from_dict` reads them back:
        no pickle, so a run folder's file cannot run code when loaded."""
        return {"columns": {"names": list(self.columns.names),
                            "list_column": bool(self.columns.list_column),
                            "categorical": list(self.columns.categorical)},
                "shape": None if self.shape is None else [int(s) for s in self.shape],
                "mean": None if self.mean is None else [float(v) for v in self.mean],
                "std": None if self.std is None else [float(v) for v in self.std],
                "categories": {n: [str(c) for c in cats] for n, cats in self.categories.items()},
                "scale": float(self.scale),
                "low": None if self.low is None else [float(v) for v in self.low],
                "high": None if self.high is None else [float(v) for v in self.high],
                "domain": self.domain, "margin": float(self.margin)}

    @classmethod
    def from_dict(cls, values: dict) -> "Featurizer":
        """The featurizer :meth:`to_dict` saved (checked: a malformed file is a DataError)."""
        try:
            c = values["columns"]
            cols = Columns(tuple(str(n) for n in c["names"]), bool(c["list_column"]),
                           tuple(str(n) for n in c["categorical"]))
            shape = values.get("shape")
            mean, std = values.get("mean"), values.get("std")
            low, high = values.get("low"), values.get("high")    # absent: saved before domains
            if (low is None) != (high is None) or (low is not None and len(low) != len(high)):
                raise ValueError("low and high do not match")
            return cls(cols, None if shape is None else tuple(int(s) for s in shape),
                       None if mean is None else np.asarray(mean, np.float64),
                       None if std is None else np.asarray(std, np.float64),
                       {str(n): tuple(str(v) for v in cats)
                        for n, cats in dict(values.get("categories") or {}).items()},
                       float(values.get("scale", 1.0)),
                       None if low is None else np.asarray(low, np.float64),
                       None if high is None else np.asarray(high, np.float64),
                       values.get("domain"), float(values.get("margin") or 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"a saved featurizer is malformed ({type(exc).__name__}: {exc}). "
                            "Fix: use the predictor.json the run wrote, unchanged") from None

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        if self.shape is not None:
            with np.errstate(over="ignore"):      # beyond float32: +-inf, then clipped
                x = np.ascontiguousarray(raw, dtype=np.float32)
            if self.low is not None:
                self.clipped(x, out=x)
            x = x.reshape(len(raw), *self.shape)
            return x * np.float32(self.scale) if self.scale != 1.0 else x
        num = self._numeric(raw)
        values = raw[:, num].astype(np.float64)          # a copy: clipped in place
        if self.low is not None:
            self.clipped(values, out=values)
        parts = [((values - self.mean) / self.std).astype(np.float32)]
        del values
        for j, n in enumerate(self.columns.names):
            if n in self.categories:
                index = {c: i for i, c in enumerate(self.categories[n])}
                hot = np.zeros((len(raw), len(index)), np.float32)
                at = np.array([index.get(v, -1) for v in raw[:, j]], dtype=np.int64)
                rows = np.flatnonzero(at >= 0)
                hot[rows, at[rows]] = 1.0
                parts.append(hot)
        return np.ascontiguousarray(np.concatenate(parts, axis=1))


#: data.clip.margin's default: the public range widened by this fraction of its width on each
#: side (docs/threat-model.md, "The domain of a record's value")
CLIP_MARGIN = 0.1


def clip_settings(clip) -> tuple[float, dict]:
    """(margin, column -> (low, high)) of a checked ``data.clip`` mapping (rknn_ray.data.config;
    None or empty: the default margin, no configured bounds)."""
    clip = dict(clip or {})
    margin = clip.get("margin")
    bounds = dict(clip.get("bounds") or {})
    return (CLIP_MARGIN if margin is None else float(margin),
            {str(n): (float(v[0]), float(v[1])) for n, v in bounds.items()})


def pixel_scale(schema: pa.Schema, cols: Columns) -> float:
    """1/255 when every feature value is typed uint8 in ``schema`` (0-255 pixels: scaled to
    [0, 1] as the built-in readers give images), else 1 (values left as given). Decided from
    the public part's schema alone (public information), never from the values."""
    types = [schema.field(n).type for n in cols.names]
    types = [t.value_type if _is_list(t) else t for t in types]
    return 1.0 / 255.0 if types and all(pa.types.is_uint8(t) for t in types) else 1.0


def label_indices(table: pa.Table, column: str, classes: tuple, part: Part) -> np.ndarray:
    """Each row's class index in ``classes`` (matched by text); a null or a label outside the
    class list is an error naming it."""
    col = table.column(column)
    if col.null_count:
        raise DataError(f"{part.key}: {col.null_count} rows have no label in {column!r}. "
                        "Fix: drop unlabelled rows")
    names = {str(c): i for i, c in enumerate(classes)}
    enc = col.cast(pa.string()).combine_chunks().dictionary_encode() if table.num_rows else None
    if enc is None:
        return np.zeros(0, np.int64)
    lookup = np.array([names.get(v, -1) for v in enc.dictionary.to_pylist()], dtype=np.int64)
    y = lookup[enc.indices.to_numpy(zero_copy_only=False)]
    if (y < 0).any():
        # a private label's value is private: only the public parts' are named
        bad = enc.dictionary.to_pylist()[int(np.flatnonzero(lookup < 0)[0])]
        what = f"label {quoted(bad)} is" if not part.is_private else \
            f"{int((y < 0).sum())} rows have a label that is"
        raise DataError(f"{part.key}: {what} not in data.classes "
                        f"({', '.join(map(str, classes))}). Fix: add it to data.classes or drop "
                        "those rows")
    return y


def bucket_of(values: pa.ChunkedArray | pa.Array, shards: int) -> tuple[np.ndarray, list, np.ndarray]:
    """(each row's shard, the distinct client ids as text, each id's shard): a client's shard
    is a plain hash of its id's text modulo the shard count, so every reader agrees on it."""
    arr = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    enc = arr.cast(pa.string()).dictionary_encode()
    ids = enc.dictionary.to_pylist()
    buckets = (blake2b_64([v.encode() for v in ids]) % np.uint64(shards)).astype(np.int64)
    rows = buckets[enc.indices.to_numpy(zero_copy_only=False)] if len(ids) else np.zeros(0, np.int64)
    return rows, ids, buckets

"""Pandera schemas for the pipeline's tables, checked whenever one is written and read.

Each table is a Parquet file. The Dagster side shows the same schemas as column schemas in the UI,
so a malformed table fails at the boundary where it was produced. A table is read whole, and checked
against the sha256 its folder's manifest records for it (`verified_read`) whatever its size.
"""

from __future__ import annotations

import os

import pandas as pd
import pandera.pandas as pa

from .label_policy import STATE_MEANINGS
from .parquet_bytes import arrow_owned_reader
from .storage import write_bytes_atomic
from .verified_read import read_verified

REASONS = (
    "empty",
    "unidentified",
    "truncated",
    "checksum",
    "bomb",
    "timeout",
    "crash",
    "unsupported",
    "format_not_allowed",
    "too_small",
    "exif",
    "decode_error",
    "corrupt_data",  # a JPEG whose compressed data libjpeg-turbo reports corrupt (Pillow decodes it silently)
    "unreadable",  # listed in the index but could not be read (vanished, permissions): stage "read"
    # Decided before a byte is read (see training_code/lib/raw_files.py): stage "read".
    "unsafe_key",
    "outside_root",
    "too_large",
)
LABEL_REASONS = (
    "outside_image",
    "degenerate",
    "non_finite",
    "unknown_category",
    "malformed",
    "bad_number",  # a bbox value that is no usable number (an integer too large for a float, a bool)
    # Entries of annotations.json itself, keyed by that file (see training_code/lib/coco.py):
    "not_an_object",
    "bad_id",
    "bad_file_name",
    "unknown_image",
)
SPLITS = ("train", "val")
# What an accepted image's labels are (training_code/lib/label_policy.py): only the first two train.
ANNOTATION_STATES = tuple(STATE_MEANINGS)

# ne, a vectorised compare; str_length(min_value=1) called Python a value (6 ms of 10,000 keys, each check)
_key = pa.Column(str, pa.Check.ne("", error="a key is never empty"))
_sha = pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$"))

RAW_INDEX = pa.DataFrameSchema(
    {
        "source": pa.Column(str),
        "key": _key,  # path relative to the raw root: "<source>/<file>"
        "size": pa.Column("int64", pa.Check.ge(0)),
        "etag": pa.Column(str),  # S3 ETag, or "<mtime_ns>-<size>" for local files
        "group": pa.Column(str),
        "annotation_count": pa.Column("int64", pa.Check.ge(0)),
    },
    unique=["key"],
    name="raw_image_index",
    strict=True,
)

ACCEPTED = pa.DataFrameSchema(
    {
        "source": pa.Column(str),
        "key": _key,
        "sha256": _sha,
        "size": pa.Column("int64", pa.Check.gt(0)),
        "format": pa.Column(str),
        "mode": pa.Column(str),  # the decoder's original mode (CMYK, I;16, P, RGBA...)
        "width": pa.Column("int64", pa.Check.gt(0)),  # upright frame
        "height": pa.Column("int64", pa.Check.gt(0)),
        "orientation": pa.Column("int64", pa.Check.isin(list(range(1, 9)))),
        "group": pa.Column(str),
        "split": pa.Column(str, pa.Check.isin(list(SPLITS))),
        "boxes": pa.Column(object),  # list of [x1, y1, x2, y2], upright frame
        "category_names": pa.Column(object),  # list of str, one per box
        "annotation": pa.Column(str, pa.Check.isin(list(ANNOTATION_STATES))),
        # perceptual_hash.Hashes of the upright picture: one int64 per view of perceptual_hash.VIEWS
        "phash": pa.Column(object),
        "dhash": pa.Column(object),
    },
    unique=["key"],
    name="validated_images",
    strict=True,
)

QUARANTINE = pa.DataFrameSchema(
    {
        "key": _key,
        "sha256": pa.Column(str, nullable=True),  # null when the bytes could not be read
        "stage": pa.Column(str),
        "reason": pa.Column(str, pa.Check.isin(list(REASONS))),
        "error": pa.Column(str),
    },
    name="quarantine",
    strict=True,
)

# Every image verdict of a validation run with the listing identity it was reached for: the cache an
# incremental run reuses for keys whose etag and size did not change. Not part of the data version
# (a local etag holds an mtime), so it is left out of the manifest's file hashes.
VERDICTS = pa.DataFrameSchema(
    {
        "key": _key,
        "etag": pa.Column(str),
        "listed_size": pa.Column("int64", pa.Check.ge(0)),  # the index's size, compared with the next listing
        "sha256": pa.Column(str),  # "" when the bytes could not be read
        "size": pa.Column("int64", pa.Check.ge(0)),  # bytes actually read
        "reason": pa.Column(str),  # "" for an accepted image
        "stage": pa.Column(str),
        "error": pa.Column(str),
        "format": pa.Column(str),
        "mode": pa.Column(str),
        "width": pa.Column("int64"),
        "height": pa.Column("int64"),
        "orientation": pa.Column("int64"),
        "phash": pa.Column(object),  # as in ACCEPTED; [] when nothing was decoded (see `reason`)
        "dhash": pa.Column(object),
    },
    unique=["key"],
    name="verdicts",
    strict=True,
)

DUPLICATES = pa.DataFrameSchema(
    {"key": _key, "sha256": _sha, "duplicate_of": _key},
    unique=["key"],
    name="duplicates",
    strict=True,
)

REJECTED_LABELS = pa.DataFrameSchema(
    {
        "key": _key,
        "annotation_id": pa.Column("int64"),
        "category": pa.Column(str),
        "bbox": pa.Column(object),  # the COCO [x, y, w, h] as given
        "reason": pa.Column(str, pa.Check.isin(list(LABEL_REASONS))),
        "detail": pa.Column(str),
    },
    name="rejected_labels",
    strict=True,
)

UNMATCHED = pa.DataFrameSchema(
    {
        "kind": pa.Column(str, pa.Check.isin(["image_without_annotation", "annotation_without_image"])),
        "key": _key,
        "detail": pa.Column(str),
    },
    name="unmatched",
    strict=True,
)


def _is_text(series: pd.Series) -> bool:
    """Every value that is not null is a str, by pandas' type inference (a C loop)."""
    return pd.api.types.infer_dtype(series, skipna=True) in ("string", "empty")


_TEXT = pa.Check(_is_text, error="every value must be a str")
_AS_CHECKED: dict[int, tuple[pa.DataFrameSchema, pa.DataFrameSchema]] = {}


def as_checked(schema: pa.DataFrameSchema) -> pa.DataFrameSchema:
    """`schema` as tables are checked against it: each `str` column's type checked by `_is_text`, a
    check of the whole column, instead of pandera's own `str` check, which calls a Python function a
    cell (most of the check's time on a table of 20,000 rows). The same rules: nulls where the column
    allows them, every other value a str. `schema` itself, with its `str` types, is what the UI shows."""
    cached = _AS_CHECKED.get(id(schema))
    if cached is None or cached[0] is not schema:
        text = {name: column for name, column in schema.columns.items() if str(column.dtype) == "str"}
        checked = schema.update_columns(
            {name: {"dtype": None, "checks": [_TEXT, *column.checks]} for name, column in text.items()}
        )
        cached = _AS_CHECKED[id(schema)] = (schema, checked)
    return cached[1]


def write_table(frame: pd.DataFrame, schema: pa.DataFrameSchema, uri: str | os.PathLike) -> pd.DataFrame:
    """Validate `frame` against `schema`, then write it as Parquet atomically (local path or s3:// URI)."""
    frame = as_checked(schema).validate(frame.reset_index(drop=True), lazy=True)
    write_bytes_atomic(uri, frame.to_parquet(index=False))
    return frame


def read_table(uri: str | os.PathLike, schema: pa.DataFrameSchema) -> pd.DataFrame:
    """Read the Parquet table at `uri` (local path or s3:// URI) whole, check its bytes against its
    folder's manifest (`FileIntegrityError` when they differ) and its rows against `schema`."""
    frame = pd.read_parquet(arrow_owned_reader(read_verified(uri)), pre_buffer=False)  # why: parquet_bytes
    return as_checked(schema).validate(frame, lazy=True)


def empty_frame(schema: pa.DataFrameSchema) -> pd.DataFrame:
    """A zero-row frame with the schema's columns, for tables that have nothing to report."""
    return pd.DataFrame(
        {name: pd.Series(dtype=str(col.dtype) if col.dtype else object) for name, col in schema.columns.items()}
    )

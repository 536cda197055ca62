"""The pipeline's tables: Parquet files with an Arrow schema and pandera checks, run on every write and read."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pandera.pyarrow as pandera
import pyarrow
import pyarrow.parquet as pq

from .label_policy import STATE_MEANINGS
from .parquet_bytes import arrow_owned_reader, parquet_bytes
from .reason_meanings import IMAGE_REASONS
from .reason_meanings import LABEL_REASONS as LABEL_MEANINGS
from .storage import write_bytes_atomic
from .verified_read import read_verified

# What each quarantine and label-rejection reason means is in reason_meanings; the codes are its keys.
REASONS = tuple(IMAGE_REASONS)
LABEL_REASONS = tuple(LABEL_MEANINGS)
SPLITS = ("train", "val")
# What an accepted image's labels are (training_code/lib/label_policy.py): only the first two train.
ANNOTATION_STATES = tuple(STATE_MEANINGS)


@dataclass(frozen=True)
class TableSpec:
    """A table's Arrow schema and the pandera checks (pyarrow backend) its rows must pass."""

    name: str
    arrow: pyarrow.Schema
    checks: pandera.DataFrameSchema

    def empty(self) -> pyarrow.Table:
        return self.arrow.empty_table()


def table_spec(
    name: str,
    columns: dict[str, pyarrow.DataType | tuple[pyarrow.DataType, list[pandera.Check]]],
    *,
    nullable: tuple[str, ...] = (),
    unique: list[str] | None = None,
) -> TableSpec:
    """A TableSpec from `column: type` or `column: (type, checks)`; no column holds nulls unless named."""
    typed = {name: value if isinstance(value, tuple) else (value, []) for name, value in columns.items()}
    return TableSpec(
        name,
        pyarrow.schema([(column, kind) for column, (kind, _) in typed.items()]),
        pandera.DataFrameSchema(
            {
                column: pandera.Column(kind, rules or None, nullable=column in nullable)
                for column, (kind, rules) in typed.items()
            },
            unique=unique,
            name=name,
            strict=True,
        ),
    )


_str, _int = pyarrow.string(), pyarrow.int64()
_key = (_str, [pandera.Check.ne("", error="a key is never empty")])
_sha = (_str, [pandera.Check.str_matches(r"^[0-9a-f]{64}$")])

RAW_INDEX = table_spec(
    "raw_image_index",
    {
        "source": _str,
        "key": _key,  # path relative to the raw root: "<source>/<file>"
        "size": (_int, [pandera.Check.ge(0)]),
        "etag": _str,  # S3 ETag, or "<mtime_ns>-<size>" for local files
        "group": _str,
        "annotation_count": (_int, [pandera.Check.ge(0)]),
    },
    unique=["key"],
)

ACCEPTED = table_spec(
    "validated_images",
    {
        "source": _str,
        "key": _key,
        "sha256": _sha,
        "size": (_int, [pandera.Check.gt(0)]),
        "format": _str,
        "mode": _str,  # the decoder's original mode (CMYK, I;16, P, RGBA...)
        "width": (_int, [pandera.Check.gt(0)]),  # upright frame
        "height": (_int, [pandera.Check.gt(0)]),
        "orientation": (_int, [pandera.Check.isin(list(range(1, 9)))]),
        "group": _str,
        "split": (_str, [pandera.Check.isin(list(SPLITS))]),
        "boxes": pyarrow.list_(pyarrow.list_(pyarrow.float64())),  # [x1, y1, x2, y2] each, upright frame
        "category_names": pyarrow.list_(_str),  # one per box
        "annotation": (_str, [pandera.Check.isin(list(ANNOTATION_STATES))]),
        # perceptual_hash.Hashes of the upright picture: one int64 per view of perceptual_hash.VIEWS
        "phash": pyarrow.list_(_int),
        "dhash": pyarrow.list_(_int),
    },
    unique=["key"],
)

QUARANTINE = table_spec(
    "quarantine",
    {
        "key": _key,
        "sha256": _str,  # null when the bytes could not be read
        "stage": _str,
        "reason": (_str, [pandera.Check.isin(list(REASONS))]),
        "error": _str,
    },
    nullable=("sha256",),
)

# Every image verdict with the listing identity it was reached for: the next run's cache (verdict_cache).
VERDICTS = table_spec(
    "verdicts",
    {
        "key": _key,
        "etag": _str,
        "listed_size": (_int, [pandera.Check.ge(0)]),  # the index's size, compared with the next listing
        "sha256": _str,  # "" when the bytes could not be read
        "size": _int,  # bytes actually read
        "reason": _str,  # "" for an accepted image
        "stage": _str,
        "error": _str,
        "format": _str,
        "mode": _str,
        "width": _int,
        "height": _int,
        "orientation": _int,
        "phash": pyarrow.list_(_int),  # as in ACCEPTED; [] when nothing was decoded (see `reason`)
        "dhash": pyarrow.list_(_int),
    },
    unique=["key"],
)

DUPLICATES = table_spec("duplicates", {"key": _key, "sha256": _sha, "duplicate_of": _key}, unique=["key"])

REJECTED_LABELS = table_spec(
    "rejected_labels",
    {
        "key": _key,
        "annotation_id": _int,
        "category": _str,
        "bbox": pyarrow.list_(pyarrow.float64()),  # the COCO [x, y, w, h] as given
        "reason": (_str, [pandera.Check.isin(list(LABEL_REASONS))]),
        "detail": _str,
    },
)

UNMATCHED = table_spec(
    "unmatched",
    {
        "kind": (_str, [pandera.Check.isin(["image_without_annotation", "annotation_without_image"])]),
        "key": _key,
        "detail": _str,
    },
)


# One check at a time: pandera imports optional engines on each call, and a thread seeing one half-done fails.
_CHECKING = threading.Lock()


class TableError(ValueError):
    """Rows that do not fit a table's Arrow schema; the message names the table and the column."""


def as_table(rows: pyarrow.Table | pd.DataFrame | list[dict[str, Any]], spec: TableSpec) -> pyarrow.Table:
    """`rows` (a table, a frame or a list of row dicts) as an Arrow table of `spec`'s schema, not yet checked."""
    try:
        if isinstance(rows, pd.DataFrame):
            return pyarrow.Table.from_pandas(rows, schema=spec.arrow, preserve_index=False)
        if isinstance(rows, list):
            return pyarrow.Table.from_pylist(rows, schema=spec.arrow)
        if rows.schema.names != spec.arrow.names:
            raise TableError(f"{spec.name}: columns {rows.schema.names} are not {spec.arrow.names}")
        for field, expected in zip(rows.schema, spec.arrow):
            if field.type != expected.type:  # never cast: a cast would turn numbers into text
                raise TableError(f"{spec.name}: column {field.name!r} ({expected.type}) holds {field.type}")
        return rows.cast(spec.arrow)
    except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, pyarrow.ArrowNotImplementedError) as error:
        raise TableError(f"{spec.name}: {_misfit_column(rows, spec)}: {error}") from None


def _misfit_column(rows: Any, spec: TableSpec) -> str:
    """Which column's values do not fit its type (the first), for the message."""
    for field in spec.arrow:
        try:
            values = rows[field.name] if not isinstance(rows, list) else [row.get(field.name) for row in rows]
            pyarrow.array(values, type=field.type, from_pandas=True).cast(field.type)
        except (pyarrow.ArrowInvalid, pyarrow.ArrowTypeError, pyarrow.ArrowNotImplementedError, KeyError):
            return f"column {field.name!r} ({field.type})"
    return "a column"


def checked(rows: pyarrow.Table | pd.DataFrame | list[dict[str, Any]], spec: TableSpec) -> pyarrow.Table:
    """`rows` as `spec`'s Arrow table, checked with pandera's pyarrow backend (SchemaErrors naming columns)."""
    table = as_table(rows, spec)
    with _CHECKING:
        spec.checks.validate(table, lazy=True)
    return table


def write_table(
    rows: pyarrow.Table | pd.DataFrame | list[dict[str, Any]], spec: TableSpec, uri: str | os.PathLike
) -> pyarrow.Table:
    """Check `rows` against `spec`, then write them as Parquet atomically (local path or s3:// URI)."""
    table = checked(rows, spec)
    write_bytes_atomic(uri, parquet_bytes(table))
    return table


def read_table(uri: str | os.PathLike, spec: TableSpec) -> pyarrow.Table:
    """The Parquet table at `uri`, its bytes checked against its folder's manifest and its rows against `spec`."""
    table = pq.read_table(arrow_owned_reader(read_verified(uri)), pre_buffer=False)  # why: parquet_bytes
    try:
        return checked(table.replace_schema_metadata(None), spec)
    except TableError as error:
        raise TableError(f"{uri}: {error}; rematerialize its asset") from None

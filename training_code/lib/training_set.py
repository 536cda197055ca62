"""The training set's files: the selection of validated images that arrow_shards packs, and what was left out.

`<lake>/training_set/<fingerprint16>/` holds
- `selection.parquet` (SELECTION_SCHEMA): one row per selected image with everything packing needs
  (where its bytes are, their sha256, size and etag, the split and group validation gave it, its
  labels), sorted by (source, key);
- `excluded.parquet` (source, key, reason): the chosen sources' accepted images left out, and why;
- `near_duplicates.parquet` (near_duplicate_split.NEAR_DUPLICATES_SCHEMA): the selected images in
  near-duplicate groups, the split validation gave each and the one it trains in;
- `manifest.json` (format `zero-selection/1`), written last: per source where its validated set is,
  its data version and the counts; the policy as configured; the selected categories; the data
  version; each file with its bytes and sha256.

The rules that decide the rows are `selection`'s; this module is the format and its reading.
"""

from __future__ import annotations

import io
import json
import os
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from .hashing import sha256_bytes, sha256_json
from .parquet_bytes import read_parquet_bytes
from .storage import join, read_bytes, write_bytes_atomic
from .verified_read import read_verified

FORMAT = "zero-selection/1"
MANIFEST = "manifest.json"
SELECTION = "selection.parquet"
EXCLUDED = "excluded.parquet"
NEAR_DUPLICATES = "near_duplicates.parquet"

# The accepted table's columns as validation wrote them (labels as they are), plus the etag the
# validation read each image at: what a packing job needs to fetch, check and label every row.
SELECTION_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),  # relative to the raw root: "<source>/<file>"
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("etag", pa.string(), nullable=False),
        pa.field("format", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("width", pa.int64(), nullable=False),  # upright frame
        pa.field("height", pa.int64(), nullable=False),
        pa.field("orientation", pa.int64(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("boxes", pa.list_(pa.list_(pa.float64())), nullable=False),  # x1, y1, x2, y2, upright frame
        pa.field("category_names", pa.list_(pa.string()), nullable=False),  # one per box
    ]
)
EXCLUDED_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)


def parquet_bytes(table: pa.Table) -> bytes:
    """The table as Parquet bytes: the same table writes the same bytes (the data version hashes them)."""
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def write_training_set(
    out: str, selected: pa.Table, excluded: pa.Table, fields: dict[str, Any], near_duplicates: pa.Table | None = None
) -> tuple[dict[str, Any], int]:
    """Write the selection and the excluded rows, then the manifest (with `fields`: sources, policy,
    categories) last. Returns the manifest and the bytes written.

    The data version is a hash of what was selected (the rows but their etags, which locally hold a
    file's mtime), the policy and the categories: an equal selection has an equal version whatever
    validation run it came from, and its shards stay as they are."""
    selected = selected.cast(SELECTION_SCHEMA)
    files = {SELECTION: parquet_bytes(selected), EXCLUDED: parquet_bytes(excluded)}
    if near_duplicates is not None:
        files[NEAR_DUPLICATES] = parquet_bytes(near_duplicates)
    for name, data in files.items():
        write_bytes_atomic(join(out, name), data)
    listed = {name: {"bytes": len(data), "sha256": sha256_bytes(data)} for name, data in files.items()}
    content = sha256_bytes(parquet_bytes(selected.drop_columns(["etag"])))
    version = sha256_json([content, fields.get("policy"), fields.get("categories")])
    manifest = {"format": FORMAT, "data_version": version, **fields, "files": listed}
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_bytes_atomic(join(out, MANIFEST), data)
    return manifest, sum(len(d) for d in files.values()) + len(data)


def read_manifest(folder: str | os.PathLike) -> dict[str, Any]:
    """The selection manifest in `folder`; an error naming it when it is missing or of another format."""
    uri = join(folder, MANIFEST)
    try:
        manifest = json.loads(read_bytes(uri))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no training-set manifest at {uri}: the selection is incomplete or was never written; "
            "materialize training_set"
        ) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ValueError(f"{uri}: format {found!r} is not {FORMAT!r}; materialize training_set again")
    return manifest


def read_selection(folder: str | os.PathLike) -> tuple[dict[str, Any], pa.Table]:
    """The manifest and the selected rows, the table checked against the manifest's sha256."""
    manifest = read_manifest(folder)
    table = read_parquet_bytes(read_verified(join(folder, SELECTION)))
    if not table.schema.equals(SELECTION_SCHEMA):
        raise ValueError(
            f"{join(folder, SELECTION)}: columns {table.schema.names} are not the selection's "
            f"{SELECTION_SCHEMA.names}; materialize training_set again"
        )
    return manifest, table


def read_excluded(folder: str | os.PathLike) -> pa.Table:
    """The excluded (source, key, reason) rows, checked against the manifest's sha256."""
    return read_parquet_bytes(read_verified(join(folder, EXCLUDED)))

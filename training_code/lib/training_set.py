"""The training set's files: `selection.parquet` (SELECTION_SCHEMA, by source and key) that arrow_shards packs,
`excluded.parquet` (LISTED_RULES exclusions), `near_duplicates.parquet`, `policy.sql`, and `manifest.json`
(`zero-selection/2`: sources, policy, categories, data version, each file's bytes and sha256), written last."""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .hashing import sha256_bytes, sha256_file, sha256_json
from .parquet_bytes import read_parquet_bytes
from .storage import join, read_bytes, write_atomically, write_bytes_atomic
from .verified_read import read_verified

FORMAT = "zero-selection/2"
MANIFEST = "manifest.json"
SELECTION = "selection.parquet"
EXCLUDED = "excluded.parquet"
NEAR_DUPLICATES = "near_duplicates.parquet"
POLICY = "policy.sql"


def _required(*names: str, kind: pa.DataType | None = None) -> list[pa.Field]:
    return [pa.field(name, pa.string() if kind is None else kind, nullable=False) for name in names]


# The accepted table's columns plus the etag validation read each image at: what packing needs. Keys are
# relative to the raw root ("<source>/<file>"); sizes and boxes (x1, y1, x2, y2) in the upright frame.
SELECTION_SCHEMA = pa.schema(
    [
        *_required("source", "key", "sha256"),
        *_required("size", kind=pa.int64()),
        *_required("etag", "format", "mode"),
        *_required("width", "height", "orientation", kind=pa.int64()),
        *_required("group", "split"),
        *_required("boxes", kind=pa.list_(pa.list_(pa.float64()))),
        *_required("category_names", kind=pa.list_(pa.string())),  # one per box
    ]
)
EXCLUDED_SCHEMA = pa.schema([*_required("source", "key", "rule", "reason"), pa.field("copy_of", pa.string())])
# One row per image in a near-duplicate cluster of two or more, named by its first image (by source, key);
# `outcome` is train, val, or "left val" (it copies a train image: `copy_of`).
NEAR_DUPLICATES_SCHEMA = pa.schema(
    [*_required("cluster", "source", "key", "group", "validated_split", "outcome"), pa.field("copy_of", pa.string())]
)
CHUNK_ROWS = 1 << 16  # rows in a Parquet row group, and in a piece of the content hash


Rows = pa.Table | pa.RecordBatchReader | Callable[[], pa.RecordBatchReader]  # a callable: started when written


def write_training_set(
    out: str | os.PathLike,
    selected: Rows,
    excluded: Rows,
    fields: dict[str, Any],
    near_duplicates: Rows | None = None,
    policy_sql: str | None = None,
) -> tuple[dict[str, Any], int]:
    """Stream the files into the local folder `out`, the manifest (with `fields`) last: (manifest, bytes).
    The data version hashes the selected rows less their etags, the policy, its SQL and the categories."""
    out = Path(out)
    content = hashlib.sha256()
    listed = {SELECTION: _write_parquet(out / SELECTION, selected, SELECTION_SCHEMA, content)}
    listed[EXCLUDED] = _write_parquet(out / EXCLUDED, excluded, EXCLUDED_SCHEMA)
    near = NEAR_DUPLICATES_SCHEMA.empty_table() if near_duplicates is None else near_duplicates
    listed[NEAR_DUPLICATES] = _write_parquet(out / NEAR_DUPLICATES, near, NEAR_DUPLICATES_SCHEMA)
    if policy_sql is not None:
        write_bytes_atomic(out / POLICY, policy_sql.encode())
        listed[POLICY] = {"bytes": len(policy_sql.encode()), "sha256": sha256_bytes(policy_sql.encode())}
    policy_sha256 = listed.get(POLICY, {}).get("sha256")
    version = sha256_json([content.hexdigest(), fields.get("policy"), fields.get("categories"), policy_sha256])
    manifest = {"format": FORMAT, "data_version": version, **fields, "files": listed}
    data = json.dumps(manifest, indent=1, sort_keys=True).encode()
    write_bytes_atomic(out / MANIFEST, data)
    return manifest, sum(entry["bytes"] for entry in listed.values()) + len(data)


def _write_parquet(path: Path, rows: Rows, schema: pa.Schema, content: Any = None) -> dict[str, Any]:
    """Write `rows` atomically in row groups of CHUNK_ROWS; `content`, a hash, is fed them less etags."""
    hashed = None
    if content is not None:
        hashed = pa.ipc.new_stream(
            pa.PythonFile(_HashSink(content), mode="w"), schema.remove(schema.get_field_index("etag"))
        )

    def write(tmp: Path) -> None:
        with pq.ParquetWriter(tmp, schema) as writer:
            for piece in _pieces(rows, schema):
                writer.write_table(piece, row_group_size=CHUNK_ROWS)
                if hashed is not None:  # fresh arrays (take): a slice's IPC bytes depend on where it was cut
                    hashed.write_table(piece.drop_columns(["etag"]).take(pa.array(range(piece.num_rows))))
        if hashed is not None:
            hashed.close()

    write_atomically(path, write)
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _pieces(rows: Rows, schema: pa.Schema) -> Iterator[pa.Table]:
    """`rows` as tables of CHUNK_ROWS rows (the last one fewer) with `schema`'s columns and types."""
    pending, count = [], 0
    rows = rows() if callable(rows) else rows
    for batch in rows.to_batches() if isinstance(rows, pa.Table) else rows:
        pending.append(batch)
        count += batch.num_rows
        while count >= CHUNK_ROWS:
            table = pa.Table.from_batches(pending)
            yield _conformed(table.slice(0, CHUNK_ROWS), schema)
            rest = table.slice(CHUNK_ROWS)
            pending, count = rest.to_batches(), rest.num_rows
    if count:
        yield _conformed(pa.Table.from_batches(pending), schema)


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with `schema`'s columns and types; a null where the schema allows none fails, naming the row."""
    for field in schema:
        column = table.column(field.name)
        if not field.nullable and column.null_count:
            at = pc.index(pc.is_null(column), True).as_py()
            raise ValueError(f"{field.name!r} is missing (null) in row {table.slice(at, 1).to_pylist()[0]}")
    return table.select(schema.names).cast(schema).combine_chunks()


class _HashSink(io.RawIOBase):
    """A writable stream that only hashes what is written to it."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        return len(data)


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
    """The listed excluded rows (EXCLUDED_SCHEMA), checked against the manifest's sha256."""
    return read_parquet_bytes(read_verified(join(folder, EXCLUDED)))

"""A job's read list, written before launch: `reads.parquet` (key, size, etag; sorted) and `reads.json` last.
Objects above `max_object_bytes` are listed, never read; each host of a fanned-out job reads its `part`."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .hashing import sha256_bytes
from .parquet_bytes import parquet_bytes, read_parquet_bytes
from .storage import join, read_bytes, write_bytes_atomic

FORMAT = "zero-reads/1"
TABLE = "reads.parquet"
MANIFEST = "reads.json"
SCHEMA = pa.schema([("key", pa.string()), ("size", pa.int64()), ("etag", pa.string())])


@dataclass(frozen=True, eq=False)
class ReadList:
    raw_uri: str  # the root the keys are relative to (an s3:// prefix or a local folder)
    table: pa.Table  # SCHEMA, sorted by key
    max_object_bytes: int  # larger objects are listed, never read
    # What the list was planned for (validation: the decode settings), so a job needing more can say why.
    basis: dict[str, Any] = field(default_factory=dict)

    @property
    def objects(self) -> int:
        return self.table.num_rows

    @property
    def read_bytes(self) -> int:
        """Bytes of the objects a job reads: every listed one up to `max_object_bytes`."""
        sizes = self.table.column("size")
        return int(pc.sum(pc.filter(sizes, pc.less_equal(sizes, self.max_object_bytes))).as_py() or 0)

    def keys(self) -> list[str]:
        return self.table.column("key").to_pylist()

    def rows(self) -> list[tuple[str, int, str]]:
        """(key, size, etag) of every listed object."""
        return list(zip(*(self.table.column(name).to_pylist() for name in SCHEMA.names)))

    def part(self, host: int, hosts: int) -> ReadList:
        """Host `host`'s part (0-based) of `hosts`: every `hosts`-th row from the `host`-th."""
        if not 0 <= host < hosts:
            raise ValueError(f"host {host} is not one of {hosts} hosts")
        rows = self.table.take(pa.array(range(host, self.objects, hosts), pa.int64()))
        return ReadList(self.raw_uri, rows, self.max_object_bytes, self.basis)

    def largest_part_bytes(self, hosts: int) -> int:
        """The bytes the busiest of `hosts` hosts reads: what each host's volume is sized for."""
        sizes = self.table.column("size").to_numpy()
        read = np.where(sizes <= self.max_object_bytes, sizes, 0)
        return max((int(read[host::hosts].sum()) for host in range(hosts)), default=0)

    def manifest(self, table_bytes: bytes) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "raw_uri": self.raw_uri,
            "objects": self.objects,
            "read_bytes": self.read_bytes,
            "max_object_bytes": self.max_object_bytes,
            "basis": self.basis,
            "files": {TABLE: {"bytes": len(table_bytes), "sha256": sha256_bytes(table_bytes)}},
        }


def read_list_of(raw_uri: str, table: pa.Table, max_object_bytes: int, basis: dict[str, Any] | None = None) -> ReadList:
    """A read list of (key, size, etag) rows, cast to the schema and sorted by key."""
    rows = table.select(SCHEMA.names).cast(SCHEMA)
    return ReadList(raw_uri, rows.sort_by("key"), max_object_bytes, dict(basis or {}))


def write_read_list(uri: str, reads: ReadList) -> None:
    """The list at `uri` (a folder; local or s3://), `reads.json` last."""
    table_bytes = parquet_bytes(reads.table)
    write_bytes_atomic(join(uri, TABLE), table_bytes)
    write_bytes_atomic(join(uri, MANIFEST), json.dumps(reads.manifest(table_bytes), indent=1).encode())


def read_read_list(folder: str | Path) -> ReadList:
    """The list in `folder` (the job's input), its table checked against `reads.json`."""
    manifest_uri = join(folder, MANIFEST)
    try:
        manifest = json.loads(read_bytes(manifest_uri))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{manifest_uri} is missing: the job's read list is written before the job is launched; "
            "materialize the asset again"
        ) from None
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_uri} is not a read list ({FORMAT}): format {manifest.get('format')!r}")
    table_bytes = read_bytes(join(folder, TABLE))
    expected = manifest["files"][TABLE]
    if len(table_bytes) != expected["bytes"] or sha256_bytes(table_bytes) != expected["sha256"]:
        raise ValueError(f"{join(folder, TABLE)} is not the table {manifest_uri} lists; materialize the asset again")
    table = read_parquet_bytes(table_bytes).cast(SCHEMA)
    return ReadList(str(manifest["raw_uri"]), table, int(manifest["max_object_bytes"]), manifest.get("basis") or {})

"""Write rows into size-capped Arrow IPC stream shards with deterministic names.

The writer rolls over to a new shard when the current one reaches the target size, writes each shard
under a temporary name and renames it when closed, and returns the manifest entries; the caller
writes the manifest last.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa

from .shard_format import SHARD_SCHEMA, sha256_file

ROWS_PER_BATCH = 64  # small record batches keep memory flat and let readers slice cheaply


class ShardWriter:
    """`with ShardWriter(out, "train", target_bytes) as writer: writer.write(row)`; then `writer.entries`."""

    def __init__(self, out_dir: Path, split: str, target_bytes: int, first_index: int = 0) -> None:
        if target_bytes <= 0:
            raise ValueError(f"target shard size must be positive, got {target_bytes}")
        self.out_dir, self.split, self.target_bytes = Path(out_dir), split, target_bytes
        self.next_index = first_index
        self.entries: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink: pa.OSFile | None = None
        self._rows = 0
        self._name = ""

    def __enter__(self) -> "ShardWriter":
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._flush()
            self._close_shard()
        else:
            self._abort()

    def write(self, row: dict[str, Any]) -> None:
        self._pending.append(row)
        if len(self._pending) >= ROWS_PER_BATCH:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = pa.RecordBatch.from_pylist(self._pending, schema=SHARD_SCHEMA)
        self._pending = []
        if self._stream is None:
            self._open_shard()
        self._stream.write_batch(batch)
        self._rows += batch.num_rows
        if self._sink.tell() >= self.target_bytes:
            self._close_shard()

    def _open_shard(self) -> None:
        self._name = f"{self.split}-{self.next_index:05d}.arrow"
        self.next_index += 1
        self._sink = pa.OSFile(str(self._tmp_path()), "wb")
        self._stream = pa.ipc.new_stream(self._sink, SHARD_SCHEMA)
        self._rows = 0

    def _tmp_path(self) -> Path:
        return self.out_dir / f".{self._name}.tmp"

    def _close_shard(self) -> None:
        if self._stream is None:
            return
        self._stream.close()
        self._sink.close()
        final = self.out_dir / self._name
        os.replace(self._tmp_path(), final)
        self.entries.append(
            {"split": self.split, "file": self._name, "rows": self._rows, "bytes": final.stat().st_size, "sha256": sha256_file(final)}
        )
        self._stream = self._sink = None

    def _abort(self) -> None:
        if self._stream is not None:
            self._sink.close()
            self._tmp_path().unlink(missing_ok=True)
            self._stream = self._sink = None

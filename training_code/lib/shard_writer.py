"""Write rows into size-capped Arrow IPC stream shards named by their content.

The writer rolls over to a new shard when the current one reaches the target size, writes each shard
under a temporary name, hashes it while writing, and renames it to `<split>-<sha256[:16]>.arrow`
when closed: one name is one content, so a shard is never rewritten, copied or verified twice for
being named again. It returns the manifest entries (`path` relative to the set's folder:
`shards/<name>`); the caller writes the manifest last. Each shard's schema carries the `datasets`
features of the shard set's categories (shard_format.shard_schema), so the writer is given the
categories the manifest will list.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa

from .shard_format import IMAGE_TYPE, LABEL_SCHEMA, SHARD_SCHEMA, SHARDS, shard_schema

ROWS_PER_BATCH = 64  # small record batches keep memory flat and let readers slice cheaply
BATCH_BYTES = 4 << 20  # and about this much image data per batch: short flushes keep the reader threads busy meanwhile
_COLUMNS = SHARD_SCHEMA.names


class ShardWriter:
    """`with ShardWriter(out, "train", target_bytes, categories=manifest_categories) as writer: writer.write(row)`;
    then `writer.entries`. A row holds every SHARD_SCHEMA column, `image` as the bytes to store. The
    shards go to `out/shards/`."""

    def __init__(self, out_dir: Path, split: str, target_bytes: int, *, categories: list[dict[str, Any]]) -> None:
        if target_bytes <= 0:
            raise ValueError(f"target shard size must be positive, got {target_bytes}")
        self.out_dir, self.split, self.target_bytes = Path(out_dir) / SHARDS, split, target_bytes
        self.schema = shard_schema(categories)
        self.opened = 0
        self.entries: list[dict[str, Any]] = []
        self._pending: list[dict[str, Any]] = []
        self._pending_bytes = 0
        self._stream: pa.ipc.RecordBatchStreamWriter | None = None
        self._sink: pa.OSFile | None = None
        self._rows = 0
        self._name = ""

    def __enter__(self) -> ShardWriter:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self._flush()
            self._close_shard()
        else:
            self._abort()

    def write(self, row: dict[str, Any]) -> None:
        # The schema's fields are nullable for `datasets`' sake, so Arrow would store a missing value as null.
        if missing := [name for name in _COLUMNS if row.get(name) is None]:
            raise ValueError(
                f"shard row {row.get('key')!r}: column {missing[0]!r} is missing or None; "
                "every shard column needs a value"
            )
        self._pending.append(row)
        self._pending_bytes += len(row["image"])
        # Roll over by the row, not by the batch, so a shard ends close to the target whatever the batch size.
        written = self._sink.tell() if self._sink is not None else 0
        if written + self._pending_bytes >= self.target_bytes:
            self._flush()
            self._close_shard()
        elif len(self._pending) >= ROWS_PER_BATCH or self._pending_bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = _record_batch(self._pending, self.schema)
        self._pending, self._pending_bytes = [], 0
        if self._stream is None:
            self._open_shard()
        self._stream.write_batch(batch)
        self._rows += batch.num_rows
        self._hasher.submit(self._sink.tell())

    def _open_shard(self) -> None:
        self._name = f"{self.split}-{self.opened:05d}"  # the temporary name's; the final one is the content's
        self.opened += 1
        self._sink = pa.OSFile(str(self._tmp_path()), "wb")
        self._stream = pa.ipc.new_stream(self._sink, self.schema)
        self._hasher = _TrailingHasher(self._tmp_path())
        self._rows = 0

    def _tmp_path(self) -> Path:
        return self.out_dir / f".{self._name}.tmp"

    def _close_shard(self) -> None:
        if self._stream is None:
            return
        self._stream.close()
        size = self._sink.tell()
        self._sink.close()
        digest = self._hasher.finish(size)
        name = f"{self.split}-{digest[:16]}.arrow"
        os.replace(self._tmp_path(), self.out_dir / name)  # a name already there holds these very bytes
        self.entries.append(
            {
                "path": f"{SHARDS}/{name}",
                "split": self.split,
                "rows": self._rows,
                "bytes": size,
                "sha256": digest,
                "masked": 0,
            }
        )
        self._stream = self._sink = None

    def _abort(self) -> None:
        if self._stream is not None:
            self._sink.close()
            self._hasher.finish(None)
            self._tmp_path().unlink(missing_ok=True)
            self._stream = self._sink = None


def _record_batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    """The rows as one batch of `schema`: `image` built as its struct (bytes, null path) from the row's bytes."""
    stored = pa.array([row["image"] for row in rows], pa.binary())
    image = pa.StructArray.from_arrays([stored, pa.nulls(len(rows), pa.string())], fields=list(IMAGE_TYPE))
    labels = pa.RecordBatch.from_pylist(rows, schema=LABEL_SCHEMA)
    return pa.RecordBatch.from_arrays([image, *labels.columns], schema=schema)


class _TrailingHasher:
    """sha256 of a file being written, computed in a thread that reads each flushed part back from the
    page cache while the writer goes on: the manifest's hash costs no second pass over the shard."""

    CHUNK = 8 << 20

    def __init__(self, path: Path) -> None:
        self._reader = open(path, "rb")
        self._digest = hashlib.sha256()
        self._offsets: queue.Queue[int | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"hash-{path.name}", daemon=True)
        self._thread.start()

    def submit(self, written: int) -> None:
        """Everything up to `written` bytes is on disk (flushed by the writer)."""
        self._offsets.put(written)

    def finish(self, size: int | None) -> str:
        """Hash up to `size` and return the hex digest; None abandons the file."""
        if size is not None:
            self._offsets.put(size)
        self._offsets.put(None)
        self._thread.join()
        self._reader.close()
        if self._error is not None:
            raise self._error
        return self._digest.hexdigest()

    def _run(self) -> None:
        try:
            self._hash_until_told_to_stop()
        except BaseException as error:  # noqa: BLE001 - handed to finish(), which raises it in the writer's thread
            self._error = error
            while self._offsets.get() is not None:  # drain so finish() does not wait on a dead thread
                pass

    def _hash_until_told_to_stop(self) -> None:
        done = 0
        while (target := self._offsets.get()) is not None:
            while done < target:
                block = os.pread(self._reader.fileno(), min(self.CHUNK, target - done), done)
                if not block:
                    raise RuntimeError(f"{self._reader.name}: ended at byte {done}, the writer reported {target}")
                self._digest.update(block)
                done += len(block)

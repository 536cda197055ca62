"""Write rows into size-capped Arrow IPC stream shards named by their content (`<split>-<sha256[:16]>.arrow`,
hashed as written, renamed at the end); returns manifest entries, the caller writes the manifest."""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .shard_format import IMAGE_TYPE, LABEL_SCHEMA, SHARDS, shard_schema
from .shard_hf import convention_columns

ROWS_PER_BATCH = 64  # small record batches keep memory flat and let readers slice cheaply
BATCH_BYTES = 4 << 20  # and about this much image data per batch, so flushes stay short


class ShardWriter:
    """`with ShardWriter(out, split, target_bytes, categories=...) as writer:` rows to `out/shards/`."""

    def __init__(self, out_dir: Path, split: str, target_bytes: int, *, categories: list[dict[str, Any]]) -> None:
        if target_bytes <= 0:
            raise ValueError(f"target shard size must be positive, got {target_bytes}")
        self.out_dir, self.split, self.target_bytes = Path(out_dir) / SHARDS, split, target_bytes
        self.schema = shard_schema(categories)
        self.opened = 0
        self.entries: list[dict[str, Any]] = []
        self._pieces: list[tuple[list[bytes] | pa.Array, pa.Table]] = []  # pending (images, labels) slices
        self._pending_rows = self._pending_bytes = 0
        self._written = 0  # bytes of the open shard on disk, as of its last batch
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
        elif self._stream is not None:  # abandon the open shard
            self._sink.close()
            self._hasher.finish(None)
            self._tmp_path().unlink(missing_ok=True)
            self._stream = self._sink = None

    def write(self, row: dict[str, Any]) -> None:
        """One row as a dict, `image` the bytes to store."""
        self.write_batch([row.get("image")], pa.Table.from_pylist([row], schema=LABEL_SCHEMA))

    def write_batch(self, images: Sequence[bytes] | pa.Array | pa.ChunkedArray, labels: pa.Table) -> None:
        """Rows as columns: `images` (bytes) and `labels` (every other column, cast to the shard's)."""
        if len(images) != labels.num_rows:
            raise ValueError(f"{len(images)} images for {labels.num_rows} label rows")
        labels = _label_columns(labels)
        if isinstance(images, pa.ChunkedArray):
            done = 0
            for chunk in images.chunks:
                self.write_batch(chunk, labels.slice(done, len(chunk)))
                done += len(chunk)
            return
        if isinstance(images, pa.Array):
            images = images.cast(pa.binary())
            sizes = pc.binary_length(images).fill_null(-1).to_numpy(zero_copy_only=False)
        else:
            images = list(images)
            sizes = np.fromiter((-1 if image is None else len(image) for image in images), np.int64, len(images))
        _refuse_nulls(sizes, labels)
        ends = np.cumsum(sizes, dtype=np.int64)
        start = 0
        while start < len(images):
            before = int(ends[start - 1]) if start else 0
            # The first row at which the pending batch reaches its row cap, its byte cap or the shard's target.
            by_rows = start + ROWS_PER_BATCH - self._pending_rows - 1
            room = min(BATCH_BYTES, self.target_bytes - self._written) - self._pending_bytes
            by_bytes = max(start, int(np.searchsorted(ends, before + room, side="left")))
            end = min(by_rows, by_bytes, len(images) - 1) + 1
            self._pieces.append((images[start:end], labels.slice(start, end - start)))
            self._pending_rows += end - start
            self._pending_bytes += int(ends[end - 1]) - before
            start = end
            # Roll over by the row, not by the batch, so a shard ends close to the target whatever the batch size.
            full = self._written + self._pending_bytes >= self.target_bytes
            if full or self._pending_rows >= ROWS_PER_BATCH or self._pending_bytes >= BATCH_BYTES:
                self._flush()
                if full:
                    self._close_shard()

    def _flush(self) -> None:
        if not self._pieces:
            return
        pieces, self._pieces = self._pieces, []
        self._pending_rows = self._pending_bytes = 0
        batch = _record_batch(pieces, self.schema)
        if self._stream is None:
            self._open_shard()
        self._stream.write_batch(batch)
        self._rows += batch.num_rows
        self._written = self._sink.tell()
        self._hasher.submit(self._written)

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
        self._written = 0


def _binary_array(images: list[bytes]) -> pa.Array:
    """`pa.array(images, pa.binary())`, faster: one join and the offsets (a batch is far from 2 GiB)."""
    offsets = np.zeros(len(images) + 1, np.int32)
    np.cumsum([len(image) for image in images], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.binary(), len(images), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(images))]
    )


def _label_columns(labels: pa.Table) -> pa.Table:
    """`labels` as LABEL_SCHEMA: its columns in the shard's order and types, or an error naming the column."""
    if missing := [name for name in LABEL_SCHEMA.names if name not in labels.column_names]:
        raise ValueError(f"write_batch labels lack column {missing[0]!r}; every shard column but image needs one")
    columns = []
    for field in LABEL_SCHEMA:
        column = labels.column(field.name)
        if column.type != field.type:  # the shard job hands them typed: a cast would copy them for nothing
            try:
                column = column.cast(field.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
                raise ValueError(
                    f"write_batch labels: column {field.name!r} of type {column.type} "
                    f"does not convert to the shard's {field.type}: {error}"
                ) from None
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=LABEL_SCHEMA)


def _refuse_nulls(image_sizes: np.ndarray, labels: pa.Table) -> None:
    """Refuse a missing value: the schema is nullable for `datasets`, so Arrow would store a null."""
    missing_images = image_sizes < 0
    if missing_images.any():
        _refuse_missing(labels, "image", pa.array(missing_images))
    for name, column in zip(labels.column_names, labels.columns):
        if column.null_count:
            _refuse_missing(labels, name, pc.is_null(column))


def _refuse_missing(labels: pa.Table, name: str, missing: pa.Array | pa.ChunkedArray) -> NoReturn:
    first = pc.index(missing, True).as_py()
    raise ValueError(
        f"shard row {labels.column('key')[first].as_py()!r}: column {name!r} is missing or None; "
        "every shard column needs a value"
    )


def _record_batch(pieces: list[tuple[list[bytes] | pa.Array, pa.Table]], schema: pa.Schema) -> pa.RecordBatch:
    """The pending pieces as one batch of `schema`, in fresh buffers (bytes depend on rows only)."""
    if all(isinstance(images, list) for images, _ in pieces):
        stored = _binary_array([image for images, _ in pieces for image in images])
    else:
        arrays = [_binary_array(images) if isinstance(images, list) else images for images, _ in pieces]
        stored = pa.concat_arrays(arrays)
    columns = [
        pa.concat_arrays([chunk for _, table in pieces for chunk in table.column(name).chunks])
        for name in LABEL_SCHEMA.names
    ]
    image = pa.StructArray.from_arrays([stored, pa.nulls(len(stored), pa.string())], fields=list(IMAGE_TYPE))
    derived = convention_columns(dict(zip(LABEL_SCHEMA.names, columns)))
    return pa.RecordBatch.from_arrays([image, *columns, *derived], schema=schema)


class _TrailingHasher:
    """sha256 of a file being written, read back from the page cache in a thread."""

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

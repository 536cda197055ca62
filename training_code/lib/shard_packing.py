"""A split's rows as the packing job hands them to the ShardWriter: columns, not one dict a row.

`label_columns` builds every shard column but `image` with Arrow compute (as `shard_rows.shard_labels`
would per row); `image_batches` reads, checks and (for resize) re-encodes the images in batches on a pool.
"""

from __future__ import annotations

import multiprocessing
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .image_encoding import Encoding, read_batch
from .raw_files import Locator
from .shard_format import LABEL_SCHEMA
from .shard_rows import shard_labels

READ_ROWS = 64  # images a pool task reads: small files cost a hand-off each otherwise
READ_BYTES = 8 << 20  # and at most about this many bytes, so large photos keep few in flight
# Resizing costs a decode and an encode an image: a task holds about one photo, so the last tasks
# spread over every worker.
RESIZE_BYTES = 1 << 20
BATCHES_PER_WORKER = 3  # tasks in flight per worker: enough to hide I/O and a flush, bounded so memory stays flat


def label_columns(rows: pa.Table, categories: list[dict[str, Any]], encoding: Encoding) -> pa.Table:
    """Every shard column but `image` for the selected `rows`, in their order (LABEL_SCHEMA)."""
    category_id = {c["name"]: c["id"] for c in categories}
    if encoding.mode != "original":
        labels = [shard_labels(row, category_id, encoding) for row in rows.to_pylist()]
        return pa.Table.from_pylist(labels, schema=LABEL_SCHEMA)
    names = rows.column("category_names").combine_chunks()
    known = pa.array(list(category_id), pa.string())
    position = pc.index_in(pc.list_flatten(names), value_set=known)
    if position.null_count:
        _refuse_unknown_category(rows, names, position)
    ids = pc.take(pa.array(list(category_id.values()), pa.int64()), position)
    offsets = pc.subtract(names.offsets, names.offsets[0])  # a slice's offsets start where its values do
    columns = {
        "image_format": rows.column("format"),
        "width": rows.column("width"),
        "height": rows.column("height"),
        "boxes": rows.column("boxes"),
        "category_ids": pa.ListArray.from_arrays(offsets, ids),
        "category_names": names,
        "source": rows.column("source"),
        "key": rows.column("key"),
        "sha256": rows.column("sha256"),
    }
    return pa.table([columns[f.name].cast(f.type) for f in LABEL_SCHEMA], schema=LABEL_SCHEMA)


def _refuse_unknown_category(rows: pa.Table, names: pa.ListArray, position: pa.Array) -> None:
    first = pc.index(pc.is_null(position), True).as_py()
    row = pc.list_parent_indices(names)[first].as_py()
    name = pc.list_flatten(names)[first].as_py()
    raise ValueError(
        f"{rows.column('key')[row].as_py()}: category {name!r} is not among the training set's categories; "
        "materialize training_set again"
    )


@contextmanager
def reading_pool(encoding: Encoding, workers: int) -> Iterator[Executor]:
    """The pool `image_batches` reads on, one per pack: processes to resize (decode and encode hold the
    GIL), threads to read originals. Starting a process pool is slow, so one serves every split."""
    if encoding.mode == "resize":
        executor: Executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
    else:
        executor = ThreadPoolExecutor(workers)
    with executor:
        yield executor


def image_batches(
    raw: Path, rows: pa.Table, labels: pa.Table, encoding: Encoding, pool: Executor, workers: int
) -> Iterator[list[bytes]]:
    """The stored bytes of `rows` (with `labels` their label_columns), in order, in batches of up to
    READ_ROWS rows or READ_BYTES of raw files, read on `pool` (of `workers`)."""
    locator = Locator(raw)
    columns = [rows.column(name).to_pylist() for name in ("key", "sha256", "size", "orientation")]
    targets = zip(labels.column("width").to_pylist(), labels.column("height").to_pylist())
    max_bytes = RESIZE_BYTES if encoding.mode == "resize" else READ_BYTES
    return _ordered_map(pool, read_batch, _batched(zip(*columns, targets), locator, encoding, max_bytes), workers)


def _batched(rows: Iterable[tuple], locator: Locator, encoding: Encoding, max_bytes: int) -> Iterator[tuple]:
    batch: list[tuple] = []
    size = 0
    for key, sha256, raw_size, orientation, target in rows:
        batch.append((key, sha256, target, orientation))
        size += raw_size
        if len(batch) >= READ_ROWS or size >= max_bytes:
            yield locator, batch, encoding
            batch, size = [], 0
    if batch:
        yield locator, batch, encoding


def _ordered_map(pool: Executor, function: Callable[[Any], Any], tasks: Iterable[Any], workers: int) -> Iterator[Any]:
    """`map(function, tasks)` on `pool`, in order, with a bounded number of results in flight."""
    window: deque = deque()
    for task in tasks:
        window.append(pool.submit(function, task))
        if len(window) >= workers * BATCHES_PER_WORKER:
            yield window.popleft().result()
    while window:
        yield window.popleft().result()

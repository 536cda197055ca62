"""A split's rows as the packing job hands them to the ShardWriter: labels (per row, or as Arrow columns)
and images, read, checked and (for resize) re-encoded in batches on a pool. Labels are a pure function of
the selected row and the encoding, so a `label_digest` tells whether an earlier shard's row stands."""

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

from .hashing import sha256_json
from .image_encoding import Encoding, read_batch, resized_size
from .raw_files import Locator
from .shard_format import LABEL_SCHEMA

READ_ROWS = 64  # images a pool task reads: small files cost a hand-off each otherwise
READ_BYTES = 8 << 20  # and at most about this many bytes, so large photos keep few in flight
RESIZE_BYTES = 1 << 20  # a resize task holds about one photo (decode and encode), so the last spread out
BATCHES_PER_WORKER = 3  # tasks in flight per worker: enough to hide I/O and a flush, bounded so memory stays flat
# The selected row's columns a shard row's labels are made of (the encoding is fixed per shard set).
LABEL_SOURCES = ("format", "width", "height", "orientation", "boxes", "category_names")


def label_digests(selected: pa.Table) -> list[str]:
    """`label_digest` of each row of a selection table, in its order."""
    columns = selected.select(list(LABEL_SOURCES)).to_pydict()
    return [sha256_json(values)[:16] for values in zip(*columns.values())]


def shard_labels(row: dict[str, Any], category_id: dict[str, int], encoding: Encoding) -> dict[str, Any]:
    """Every shard column but `image` for one selected row (training_set.SELECTION_SCHEMA as a dict)."""
    width, height = int(row["width"]), int(row["height"])
    boxes = [[float(v) for v in box] for box in row["boxes"]]
    image_format = row["format"]
    if encoding.mode == "resize":
        new_width, new_height = resized_size(width, height, encoding.max_side)
        sx, sy = new_width / width, new_height / height
        boxes = [[x1 * sx, y1 * sy, x2 * sx, y2 * sy] for x1, y1, x2, y2 in boxes]
        width, height, image_format = new_width, new_height, "JPEG"
    return {
        "image_format": image_format,
        "width": width,
        "height": height,
        "boxes": boxes,
        "category_ids": [category_id[name] for name in row["category_names"]],
        "category_names": list(row["category_names"]),
        "source": row["source"],
        "key": row["key"],
        "sha256": row["sha256"],
    }


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
    """The pool `image_batches` reads on: processes to resize (decode holds the GIL), else threads."""
    if encoding.mode == "resize":
        executor: Executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
    else:
        executor = ThreadPoolExecutor(workers)
    with executor:
        yield executor


def image_batches(
    raw: Path, rows: pa.Table, labels: pa.Table, encoding: Encoding, pool: Executor, workers: int
) -> Iterator[list[bytes]]:
    """The stored bytes of `rows`, in order, in batches of READ_ROWS rows or READ_BYTES, read on `pool`."""
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

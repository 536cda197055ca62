r"""Pack the training set's selected rows into Arrow IPC shards, keeping an earlier set's shards by reference.

    python -m training_code.shard --selection DIR --raw DIR --out DIR [--previous DIR --previous-name NAME] \
        [--target-shard-bytes 1000000000] [--image-encoding original|resize] [--max-side 1024] \
        [--jpeg-quality 90] [--compact-masked-share 0.25] [--merge-small-share 0.5] [--merge-rows-share 0.1] \
        [--workers N] [--selection-uri URI] [--rows-of N --rows-from I]

A SageMaker Processing job script. `--selection` is a training_set output (selection.parquet), `--raw`
the raw root its keys are relative to (images of any number of sources). Image bytes are packed as
they are, or resized to --max-side and re-encoded (preprocessing, part of the config; augmentation
happens at read time, never here). Each image's sha256 is checked while it is packed, so bytes that
changed after validation fail the job. With --previous (the earlier arrow_shards output, only its
manifest.json, rows.parquet and masked.parquet are read; NAME is its folder's name) its shards are
kept by reference and only the rows in none of them are packed: see lib/shard_plan for the rules and
lib/shard_format for the layout (zero-shards/3). The manifest is written last.

A map stage of a fan-out packs one part of the rows to pack (`--rows-of N --rows-from I`: the I-th of N
contiguous parts of each split's, in pack order) and writes its shards with `part-<I>.json` (their
entries and rows) instead of a manifest.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import multiprocessing
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training_code.lib import job_env
from training_code.lib import training_set as ts
from training_code.lib.hashing import sha256_bytes
from training_code.lib.raw_files import Refused, locate
from training_code.lib.shard_format import FORMAT, MANIFEST, MASKED, ROWS, ROWS_SCHEMA, masked_keys
from training_code.lib.shard_hf import write_dataset_dict
from training_code.lib.shard_plan import (
    PACK_ORDER,
    Compaction,
    PreviousSet,
    ShardPlan,
    masked_table,
    plan_shards,
    rows_table,
)
from training_code.lib.shard_rows import ENCODINGS, Encoding, label_digests, load_image_bytes, shard_labels
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import SPLITS
from training_code.lib.verified_read import read_verified

log = logging.getLogger("zero.shard")

DEFAULT_COMPACTION = Compaction()
PREFETCH_PER_WORKER = 8  # images in flight per worker: enough to hide I/O and a flush, bounded so memory stays flat


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--selection", type=Path, required=True, help="the training set: selection.parquet")
    parser.add_argument("--raw", type=Path, required=True, help="the raw root the selected keys are relative to")
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards and manifest.json")
    parser.add_argument("--target-shard-bytes", type=int, default=1_000_000_000)
    parser.add_argument("--image-encoding", choices=ENCODINGS, default="original")
    parser.add_argument("--max-side", type=int, default=1024, help="resize: longest upright side in pixels")
    parser.add_argument("--jpeg-quality", type=int, default=90, help="resize: JPEG quality of the re-encoded image")
    defaults = DEFAULT_COMPACTION
    for name in ("compact_masked_share", "merge_small_share", "merge_rows_share"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="threads (original) or processes (resize)"
    )
    parser.add_argument("--previous", type=Path, default=None, help="the earlier shard set, whose shards are kept")
    parser.add_argument("--previous-name", default=None, help="the earlier set's folder name, beside --out's")
    parser.add_argument("--selection-uri", default=None, help="where the training set is, as the manifest names it")
    parser.add_argument("--rows-of", type=int, default=1, help="map stage: the rows to pack are cut in this many parts")
    parser.add_argument("--rows-from", type=int, default=0, help="map stage: the part this instance packs (0-based)")
    return parser


def read_previous(folder: Path, name: str | None) -> PreviousSet:
    """What the planner reads of an earlier set: its manifest, and unless it is of another format
    (then nothing of it is kept) its rows and masked rows, checked against the manifest."""
    manifest = json.loads((folder / MANIFEST).read_text())
    if not name:
        raise ValueError(f"--previous {folder} needs --previous-name, the folder's name beside --out's")
    if manifest.get("format") != FORMAT:
        return PreviousSet(manifest, rows_table([]), frozenset(), name)
    rows = pq.read_table(io.BytesIO(read_verified(folder / ROWS))).cast(ROWS_SCHEMA)
    masked = frozenset((path, key) for path, keys in masked_keys(folder, manifest).items() for key in keys)
    return PreviousSet(manifest, rows, masked, name)


def build_shards(
    selection: Path,
    raw: Path,
    out: Path,
    target_shard_bytes: int,
    encoding: Encoding = Encoding(),
    workers: int = 1,
    previous: Path | None = None,
    previous_name: str | None = None,
    compaction: Compaction = DEFAULT_COMPACTION,
    selection_uri: str | None = None,
    part: tuple[int, int] = (0, 1),
) -> tuple[dict[str, Any], dict[str, int]]:
    """Write the shard set (or, with `part` (i, n) for n > 1, part i of its new shards); returns the
    manifest (the part listing) and what was kept, masked or packed."""
    chosen, table = ts.read_selection(selection)
    keys = table.column("key").to_pylist()
    identity = zip(table.column("split").to_pylist(), table.column("sha256").to_pylist(), label_digests(table))
    selected = dict(zip(keys, identity))
    groups = dict(zip(keys, zip(table.column("source").to_pylist(), table.column("group").to_pylist())))
    config = {"target_shard_bytes": target_shard_bytes, **encoding.config()}
    (out / MANIFEST).unlink(missing_ok=True)
    plan = plan_shards(
        selected,
        groups,
        chosen["categories"],
        config,
        compaction,
        read_previous(previous, previous_name) if previous else None,
    )
    index = {key: position for position, key in enumerate(keys)}
    entries, new_rows = _pack(raw, out, table, index, selected, plan, (target_shard_bytes, encoding, workers), part)
    work = {**plan.work(), "shards_packed": len(entries), "bytes_packed": sum(e["bytes"] for e in entries)}
    if part[1] > 1:
        listing = {"part": part[0], "of": part[1], "entries": entries, "rows": new_rows}
        write_bytes_atomic(out / f"part-{part[0]:05d}.json", json.dumps(listing, indent=1).encode())
        return listing, work
    entries = plan.kept + entries
    files = {
        MASKED: ts.parquet_bytes(masked_table(plan.masked)),
        ROWS: ts.parquet_bytes(rows_table(plan.kept_rows + new_rows)),
    }
    for name, data in files.items():
        write_bytes_atomic(out / name, data)
    listed = {name: {"bytes": len(data), "sha256": sha256_bytes(data)} for name, data in files.items()}
    hf_files = write_dataset_dict(out, entries, plan.categories)  # `datasets.load_from_disk(out)`, by split
    manifest = {
        "format": FORMAT,
        "categories": plan.categories,
        "shards": entries,
        "rows": {split: sum(e["rows"] - e["masked"] for e in entries if e["split"] == split) for split in SPLITS},
        "masked_rows": len(plan.masked),
        "selection": {"uri": selection_uri or str(selection), "data_version": chosen["data_version"]},
        "config": {**config, **vars(compaction)},
        "pack_order": PACK_ORDER,
        "files": {**listed, **hf_files},
    }
    write_bytes_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest, work


def _pack(
    raw: Path,
    out: Path,
    table: pa.Table,
    index: dict[str, int],
    selected: dict[str, tuple[str, str, str]],
    plan: ShardPlan,
    packing: tuple[int, Encoding, int],
    part: tuple[int, int],
) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Pack the plan's rows (this part's) into new shards of about `target` bytes (`packing`: target,
    encoding, workers); returns their entries and their rows."""
    target, encoding, workers = packing
    category_id = {c["name"]: c["id"] for c in plan.categories}
    entries: list[dict[str, Any]] = []
    rows: list[dict[str, str]] = []
    for split in SPLITS:
        keys = plan.to_pack.get(split, [])
        keys = keys[len(keys) * part[0] // part[1] : len(keys) * (part[0] + 1) // part[1]]
        records = table.take(pa.array([index[key] for key in keys], pa.int64())).to_pylist()
        labels = [shard_labels(record, category_id, encoding) for record in records]
        tasks = (_task(raw, record, label, encoding) for record, label in zip(records, labels))
        images = _ordered_map(load_image_bytes, tasks, workers, processes=encoding.mode == "resize")
        with ShardWriter(out, split, target, categories=plan.categories) as writer:
            for label, image in zip(labels, images):
                writer.write({"image": image, **label})
        packed = iter(keys)
        for entry in writer.entries:
            for key in (next(packed) for _ in range(entry["rows"])):
                _, sha, digest = selected[key]
                rows.append({"path": entry["path"], "key": key, "sha256": sha, "split": split, "labels": digest})
        entries += writer.entries
    return entries, rows


def _task(raw: Path, row: dict[str, Any], labels: dict[str, Any], encoding: Encoding) -> tuple:
    # Located inside the raw root: a symlink swapped in after validation fails the job, its target
    # unread, as a changed file fails the sha256 re-check.
    try:
        path = str(locate(raw, row["key"]))
    except Refused as refused:
        raise RuntimeError(
            f"{row['key']}: {refused}; the raw root changed since validation, rematerialize validated_images"
        ) from None
    return (path, row["key"], row["sha256"], (labels["width"], labels["height"]), int(row["orientation"]), encoding)


def _ordered_map(function: Callable[[Any], Any], tasks: Iterable[Any], workers: int, processes: bool) -> Iterator[Any]:
    """`map(function, tasks)` on a pool, in order, with a bounded number of results in flight.

    Threads for plain reads (hashing and file reads release the GIL); processes for decode and encode.
    """
    if processes:
        executor: Executor = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("forkserver"))
    else:
        executor = ThreadPoolExecutor(workers)
    with executor:
        window = deque()
        for task in tasks:
            window.append(executor.submit(function, task))
            if len(window) >= workers * PREFETCH_PER_WORKER:
                yield window.popleft().result()
        while window:
            yield window.popleft().result()


SHARD_SIZE_COLUMNS = {
    "split": "train, val, or all shards",
    "shards": "shard files",
    "rows_min": "fewest rows in one shard",
    "rows_median": "median rows per shard (the lower middle one)",
    "rows_max": "most rows in one shard",
    "bytes_min": "smallest shard, bytes",
    "bytes_median": "median shard size (the lower middle one)",
    "bytes_max": "largest shard, bytes",
}


def shard_sizes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows and bytes per shard, min/median/max per split and overall: the shard list itself can run to
    thousands of entries, so the report summarises it and the manifest keeps it."""
    groups = [(split, [e for e in entries if e["split"] == split]) for split in SPLITS] + [("all", entries)]
    summary = []
    for split, group in groups:
        if not group:
            continue
        row = {"split": split, "shards": len(group)}
        for measure in ("rows", "bytes"):
            values = [e[measure] for e in group]
            row |= {
                f"{measure}_min": min(values),
                f"{measure}_median": statistics.median_low(values),
                f"{measure}_max": max(values),
            }
        summary.append(row)
    return summary


def main(args: argparse.Namespace) -> None:
    with job_env.pipes_session() as pipes:
        started = time.perf_counter()
        encoding = Encoding(args.image_encoding, args.max_side, args.jpeg_quality)
        compaction = Compaction(args.compact_masked_share, args.merge_small_share, args.merge_rows_share)
        if not 0 <= args.rows_from < args.rows_of:
            raise ValueError(f"--rows-from {args.rows_from} must be within 0..{args.rows_of - 1} (--rows-of)")
        manifest, work = build_shards(
            args.selection,
            args.raw,
            args.out,
            args.target_shard_bytes,
            encoding,
            max(1, args.workers),
            args.previous,
            args.previous_name,
            compaction,
            args.selection_uri,
            (args.rows_from, args.rows_of),
        )
        wall = time.perf_counter() - started
        log.info("%s in %.1f s", work, wall)
        if args.rows_of > 1:
            return  # a map stage reports nothing: its part listing is the reduce stage's input
        pipes.report_asset_materialization(
            metadata={
                "dagster/row_count": sum(manifest["rows"].values()),
                "shards": len(manifest["shards"]),
                "train_rows": manifest["rows"]["train"],
                "val_rows": manifest["rows"]["val"],
                "masked_rows": manifest["masked_rows"],
                "categories": len(manifest["categories"]),
                **work,
                "image_encoding": encoding.mode,
                "pack_wall_s": round(wall, 3),
                "shard_sizes": job_env.table(shard_sizes(manifest["shards"]), columns=SHARD_SIZE_COLUMNS),
            },
            data_version=sha256_bytes((args.out / MANIFEST).read_bytes()),
        )


if __name__ == "__main__":
    main(get_args_parser().parse_args())

r"""Pack the validated image set into Arrow IPC shards per split, with a manifest written last.

    python -m training_code.shard --validated DIR --raw DIR --out DIR [--target-shard-bytes 1000000000] \
        [--image-encoding original|resize] [--max-side 1024] [--jpeg-quality 90] [--workers N] [--previous DIR]

A SageMaker Processing job script. Image bytes are packed as they are, or resized to --max-side and
re-encoded (preprocessing, part of the config; augmentation happens at read time, never here). Each
image's sha256 is checked while it is packed, so bytes that changed after validation fail the job.
With --previous (an earlier shard set) unchanged shards are carried over byte for byte (hard links
where possible) and only rows not in them are packed: see lib/shard_plan for the rules.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import shutil
import statistics
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from training_code.lib import job_env
from training_code.lib.hashing import sha256_bytes
from training_code.lib.raw_files import Refused, locate
from training_code.lib.shard_format import FORMAT, MANIFEST, reusable_manifest
from training_code.lib.shard_hf import write_dataset_dict
from training_code.lib.shard_plan import PACK_ORDER, ShardPlan, plan_shards
from training_code.lib.shard_rows import ENCODINGS, Encoding, load_image_bytes, shard_labels
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import ACCEPTED, SPLITS, read_table

log = logging.getLogger("zero.shard")

PREFETCH_PER_WORKER = 8  # images in flight per worker: enough to hide I/O and a flush, bounded so memory stays flat


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--validated", type=Path, required=True, help="folder with accepted.parquet and categories.json"
    )
    parser.add_argument("--raw", type=Path, required=True, help="the raw root the validated keys are relative to")
    parser.add_argument("--out", type=Path, required=True, help="folder for the shards and manifest.json")
    parser.add_argument("--target-shard-bytes", type=int, default=1_000_000_000)
    parser.add_argument("--image-encoding", choices=ENCODINGS, default="original")
    parser.add_argument("--max-side", type=int, default=1024, help="resize: longest upright side in pixels")
    parser.add_argument("--jpeg-quality", type=int, default=90, help="resize: JPEG quality of the re-encoded image")
    parser.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="threads (original) or processes (resize)"
    )
    parser.add_argument(
        "--previous", type=Path, default=None, help="an earlier shard set whose unchanged shards are carried over"
    )
    return parser


def build_shards(
    validated: Path,
    raw: Path,
    out: Path,
    target_shard_bytes: int,
    encoding: Encoding = Encoding(),
    workers: int = 1,
    previous: Path | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """Write the shard set; returns the manifest and what was reused or packed."""
    accepted = read_table(validated / "accepted.parquet", ACCEPTED).sort_values("key")
    categories = json.loads((validated / "categories.json").read_text())
    category_id = {c["name"]: c["id"] for c in categories}
    rows = {row.key: row for row in accepted.itertuples(index=False)}
    expected = {key: (row.split, shard_labels(row, category_id, encoding)) for key, row in rows.items()}
    config = {"target_shard_bytes": target_shard_bytes, **encoding.config()}
    (out / MANIFEST).unlink(missing_ok=True)
    groups = {
        key: (row.source, row.group) for key, row in rows.items()
    }  # packed interleaved, see shard_plan.pack_order
    plan = plan_shards(expected, config, previous, reusable_manifest(previous, categories), groups)
    for reason in plan.dropped:
        log.info("earlier shard not carried over: %s", reason)
    entries = [_carry_over(previous, out, entry) for entry in plan.kept]
    for split in SPLITS:
        keys = plan.to_pack.get(split, [])
        tasks = (_task(raw, rows[key], expected[key][1], encoding) for key in keys)
        images = _ordered_map(load_image_bytes, tasks, workers, processes=encoding.mode == "resize")
        with ShardWriter(
            out, split, target_shard_bytes, categories=categories, first_index=plan.first_index.get(split, 0)
        ) as writer:
            for key, image in zip(keys, images):
                writer.write({"image": image, **expected[key][1]})
        entries += writer.entries
    entries.sort(key=lambda e: (SPLITS.index(e["split"]), e["file"]))
    hf_files = write_dataset_dict(out, entries, categories)  # `datasets.load_from_disk(out)`: a DatasetDict by split
    manifest = {
        "format": FORMAT,
        "categories": categories,
        "shards": entries,
        "files": hf_files,
        "rows": {split: sum(e["rows"] for e in entries if e["split"] == split) for split in SPLITS},
        "config": config,
        "pack_order": PACK_ORDER,
        "validated_manifest_sha256": sha256_bytes((validated / MANIFEST).read_bytes()),
    }
    write_bytes_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest, _work(plan)


def _work(plan: ShardPlan) -> dict[str, int]:
    return {
        "shards_reused": len(plan.kept),
        "shards_dropped": len(plan.dropped),
        "rows_reused": sum(e["rows"] for e in plan.kept),
        "rows_packed": sum(len(keys) for keys in plan.to_pack.values()),
    }


def _task(raw: Path, row: Any, labels: dict[str, Any], encoding: Encoding) -> tuple:
    # Located inside the raw root: a symlink swapped in after validation fails the job, its target
    # unread, as a changed file fails the sha256 re-check.
    try:
        path = str(locate(raw, row.key))
    except Refused as refused:
        raise RuntimeError(
            f"{row.key}: {refused}; the raw root changed since validation, rematerialize validated_images"
        ) from None
    return (path, row.key, row.sha256, (labels["width"], labels["height"]), int(row.orientation), encoding)


def _carry_over(previous: Path, out: Path, entry: dict[str, Any]) -> dict[str, Any]:
    """Put an unchanged earlier shard into this set: a hard link (no bytes written) or, across devices, a copy."""
    source, target = previous / entry["file"], out / entry["file"]
    out.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
    return dict(entry)


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
        manifest, work = build_shards(
            args.validated, args.raw, args.out, args.target_shard_bytes, encoding, max(1, args.workers), args.previous
        )
        wall = time.perf_counter() - started
        shard_bytes = sum(e["bytes"] for e in manifest["shards"])
        log.info("%d shards (%d bytes) in %.1f s: %s", len(manifest["shards"]), shard_bytes, wall, work)
        pipes.report_asset_materialization(
            metadata={
                "dagster/row_count": sum(manifest["rows"].values()),
                "shards": len(manifest["shards"]),
                "train_rows": manifest["rows"]["train"],
                "val_rows": manifest["rows"]["val"],
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

r"""Pack the training set's selected rows into Arrow IPC shards, keeping an earlier set's shards by reference.

Processing job. `--selection` is a training_set output; images come from the raw root of `--reads`,
`--raw-uri` or `--raw`, each checked against its validated sha256. With --previous only rows in no kept
shard are packed (rules: lib/shard_plan; layout: lib/shard_format). The manifest is written last;
--phase map/reduce splits the pack over hosts without moving a shard.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

from training_code.lib import job_env
from training_code.lib.hashing import sha256_bytes
from training_code.lib.image_encoding import ENCODINGS, Encoding
from training_code.lib.parquet_bytes import parquet_bytes
from training_code.lib.raw_fetch import readable_root
from training_code.lib.read_list import ReadList, read_read_list
from training_code.lib.shard_format import FORMAT, MANIFEST, MASKED, ROWS
from training_code.lib.shard_hf import write_dataset_dict
from training_code.lib.shard_packing import image_batches, label_columns, reading_pool
from training_code.lib.shard_plan import (
    PACK_ORDER,
    Compaction,
    ShardPlan,
    masked_table,
    rows_table,
)
from training_code.lib.shard_work import check_reads, collected_parts, plan_for, rows_to_pack
from training_code.lib.shard_writer import ShardWriter
from training_code.lib.storage import write_bytes_atomic
from training_code.lib.tables import SPLITS

log = logging.getLogger("zero.shard")

DEFAULT_COMPACTION = Compaction()
PHASES = ("all", "map", "reduce")


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--selection", type=Path, required=True, help="the training set: selection.parquet")
    add("--reads", type=Path, help="the read list: the only images this job reads")
    add("--raw-uri", help="the raw root the selected keys are relative to")
    add("--raw", type=Path, help="a local raw root, as a folder")
    add("--out", type=Path, required=True, help="folder for the shards and manifest.json")
    add("--target-shard-bytes", type=int, default=1_000_000_000)
    add("--image-encoding", choices=ENCODINGS, default="original")
    add("--max-side", type=int, default=1024, help="resize: longest upright side in pixels")
    add("--jpeg-quality", type=int, default=90, help="resize: JPEG quality of the re-encoded image")
    defaults = DEFAULT_COMPACTION
    for name in ("compact_masked_share", "merge_small_share", "merge_rows_share"):
        add(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    add("--workers", type=int, default=os.cpu_count() or 1, help="threads (original) or processes (resize)")
    add("--previous", help="the earlier shard set (a folder or an s3:// URI), whose shards are kept")
    add("--previous-name", help="the earlier set's folder name, beside --out's")
    add("--selection-uri", help="where the training set is, as the manifest names it")
    add("--phase", choices=PHASES, default="all", help="all, or a stage of a multi-instance pack")
    add("--parts", type=Path, help="map: where its listing goes; reduce: all of them")
    return parser


def planned_reads(inputs: Mapping[str, str], arguments: Mapping[str, Any]) -> ReadList:
    """The read list (rows its plan packs) for a request's `inputs` and `arguments`; runs before launch."""
    flags = [token for key, value in arguments.items() for token in (f"--{key.replace('_', '-')}", str(value))]
    args = get_args_parser().parse_args([*flags, "--selection", inputs["selection"], "--out", "-"])
    config = {"target_shard_bytes": args.target_shard_bytes, **_encoding(args).config()}
    _, table, _, plan = plan_for(inputs["selection"], config, _compaction(args), args.previous, args.previous_name)
    return rows_to_pack(table, plan, args.raw_uri)


def build_shards(
    selection: Path,
    raw: Path | None,
    out: Path,
    target_shard_bytes: int,
    encoding: Encoding = Encoding(),
    workers: int = 1,
    previous: str | Path | None = None,
    previous_name: str | None = None,
    compaction: Compaction = DEFAULT_COMPACTION,
    selection_uri: str | None = None,
    reads: ReadList | None = None,
    phase: str = "all",
    parts: Path | None = None,
) -> tuple[dict[str, Any], dict[str, int]]:
    """Write the shard set, or one stage of it (map: pack this host's part of `reads`, list it in
    `parts`; reduce: assemble the set from those listings). Returns the manifest (map: its listing) and
    the work counts. Images come from `reads`'s raw root, else the local folder `raw`."""
    config = {"target_shard_bytes": target_shard_bytes, **encoding.config()}
    if phase != "map":
        (out / MANIFEST).unlink(missing_ok=True)
    chosen, table, selected, plan = plan_for(selection, config, compaction, previous, previous_name)
    index = {key: position for position, key in enumerate(table.column("key").to_pylist())}
    if reads is not None:
        check_reads(reads, plan)
    fetched = None
    if phase == "reduce":
        entries, new_rows = collected_parts(parts)
    else:
        todo = rows_to_pack(table, plan, reads.raw_uri if reads else str(raw))
        mine = todo if phase == "all" else (reads or todo).part(*job_env.host_slot())
        only = set(mine.keys())
        with readable_root(mine.raw_uri, mine.rows()) as (root, fetched):
            packing = (target_shard_bytes, encoding, workers)
            entries, new_rows = _pack(root, out, table, index, selected, plan, packing, only)
    work = {**plan.work(), "shards_packed": len(entries), "bytes_packed": sum(e["bytes"] for e in entries)}
    if fetched is not None:  # an S3 raw root: what was fetched by key
        work.update(fetched_objects=fetched.objects, fetched_bytes=fetched.bytes)
    if phase == "map":
        host = job_env.current_host()
        listing = {"host": host, "entries": entries, "rows": new_rows}
        write_bytes_atomic(parts / f"part-{host}.json", json.dumps(listing, indent=1).encode())
        return listing, work
    entries = plan.kept + entries
    files = {
        MASKED: parquet_bytes(masked_table(plan.masked)),
        ROWS: parquet_bytes(rows_table(plan.kept_rows + new_rows)),
    }
    for name, data in files.items():
        write_bytes_atomic(out / name, data)
    listed_files = {name: {"bytes": len(data), "sha256": sha256_bytes(data)} for name, data in files.items()}
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
        "files": {**listed_files, **hf_files},
    }
    write_bytes_atomic(out / MANIFEST, json.dumps(manifest, indent=1).encode())
    return manifest, work


def _pack(raw: Path, out: Path, table: pa.Table, index, selected, plan: ShardPlan, packing, only: set[str]):
    """Pack the plan's rows in `only` (this host's) into new shards in pack order (`packing`: target
    bytes, encoding, workers): their entries and rows."""
    target, encoding, workers = packing
    entries: list[dict[str, Any]] = []
    rows: list[dict[str, str]] = []
    with reading_pool(encoding, workers) as pool:
        for split in SPLITS:
            keys = [key for key in plan.to_pack.get(split, []) if key in only]
            records = table.take(pa.array([index[key] for key in keys], pa.int64()))
            labels = label_columns(records, plan.categories, encoding)
            with ShardWriter(out, split, target, categories=plan.categories) as writer:
                done = 0
                for images in image_batches(raw, records, labels, encoding, pool, workers):
                    writer.write_batch(images, labels.slice(done, len(images)))
                    done += len(images)
            packed = iter(keys)
            for entry in writer.entries:
                for key in (next(packed) for _ in range(entry["rows"])):
                    _, sha, digest = selected[key]
                    rows.append({"path": entry["path"], "key": key, "sha256": sha, "split": split, "labels": digest})
            entries += writer.entries
    return entries, rows


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
    """Rows and bytes per shard, min/median/max per split and overall (the manifest keeps the full list)."""
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
        encoding, compaction = _encoding(args), _compaction(args)
        if args.phase != "all" and args.parts is None:
            raise ValueError(f"--phase {args.phase} needs --parts (the map stage's listings)")
        reads = read_read_list(args.reads) if args.reads else None
        if reads is None and args.raw is None and args.raw_uri is None:
            raise ValueError("name the raw root: --reads (the read list), --raw-uri or --raw")
        raw = args.raw if args.raw is not None or args.raw_uri is None else args.raw_uri
        manifest, work = build_shards(
            args.selection,
            raw,
            args.out,
            args.target_shard_bytes,
            encoding,
            max(1, args.workers),
            args.previous,
            args.previous_name,
            compaction,
            args.selection_uri,
            reads,
            args.phase,
            args.parts,
        )
        wall = time.perf_counter() - started
        log.info("%s in %.1f s", work, wall)
        if args.phase == "map":
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


def _encoding(args: argparse.Namespace) -> Encoding:
    return Encoding(args.image_encoding, args.max_side, args.jpeg_quality)


def _compaction(args: argparse.Namespace) -> Compaction:
    return Compaction(args.compact_masked_share, args.merge_small_share, args.merge_rows_share)


if __name__ == "__main__":
    main(get_args_parser().parse_args())

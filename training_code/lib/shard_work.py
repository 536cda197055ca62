"""What a pack of the selection works from: the shard plan (from the selection and the earlier set's
manifest and tables, never a shard), the rows it packs (its read list), and the map hosts' listings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from . import training_set as ts
from .parquet_bytes import read_parquet_bytes
from .read_list import ReadList, read_list_of
from .shard_format import FORMAT, MANIFEST, ROWS, ROWS_SCHEMA, masked_keys
from .shard_packing import label_digests
from .shard_plan import Compaction, PreviousSet, ShardPlan, plan_shards, rows_table
from .storage import join, read_bytes
from .tables import SPLITS
from .verified_read import read_verified

ANY_SIZE = 1 << 62  # packing reads every selected image, whatever its size (validation bounded it)


def read_previous(folder: Path, name: str | None) -> PreviousSet:
    """An earlier set's manifest and, if of this format, its rows and masked rows, checked."""
    manifest = json.loads(read_bytes(join(folder, MANIFEST)))
    if not name:
        raise ValueError(f"--previous {folder} needs --previous-name, the folder's name beside --out's")
    if manifest.get("format") != FORMAT:
        return PreviousSet(manifest, rows_table([]), frozenset(), name)
    rows = read_parquet_bytes(read_verified(join(folder, ROWS))).cast(ROWS_SCHEMA)
    masked = frozenset((path, key) for path, keys in masked_keys(folder, manifest).items() for key in keys)
    return PreviousSet(manifest, rows, masked, name)


def plan_for(
    selection: str | Path,
    config: dict[str, Any],
    compaction: Compaction,
    previous: str | Path | None,
    previous_name: str | None,
) -> tuple[dict[str, Any], pa.Table, dict[str, tuple[str, str, str]], ShardPlan]:
    """The selection (its manifest and table), each selected row's identity, and the shard plan."""
    chosen, table = ts.read_selection(selection)
    keys = table.column("key").to_pylist()
    identity = zip(table.column("split").to_pylist(), table.column("sha256").to_pylist(), label_digests(table))
    selected = dict(zip(keys, identity))
    groups = dict(zip(keys, zip(table.column("source").to_pylist(), table.column("group").to_pylist())))
    earlier = read_previous(previous, previous_name) if previous else None
    plan = plan_shards(selected, groups, chosen["categories"], config, compaction, earlier)
    return chosen, table, selected, plan


def rows_to_pack(table: pa.Table, plan: ShardPlan, raw_uri: str) -> ReadList:
    """The read list of a pack: the (key, size, etag) of every row the plan packs."""
    packed = pa.array([key for split in SPLITS for key in plan.to_pack.get(split, [])], pa.string())
    rows = table.filter(pc.is_in(table.column("key"), packed)).select(["key", "size", "etag"])
    return read_list_of(raw_uri, rows, ANY_SIZE)


def check_reads(reads: ReadList, plan: ShardPlan) -> None:
    """The job reads only what its read list names: every row the plan packs must be in it."""
    named = set(reads.keys())
    missing = [key for split in SPLITS for key in plan.to_pack.get(split, []) if key not in named]
    if missing:
        raise ValueError(
            f"{len(missing)} rows to pack are not in the read list (e.g. {missing[0]}): it was planned from "
            "another selection or earlier shard set than this job reads; materialize arrow_shards again"
        )


def collected_parts(parts: Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """The entries and rows the map hosts packed, from their listings, in host order."""
    listings = [json.loads(path.read_text()) for path in sorted(Path(parts).glob("part-*.json"))]
    if not listings:
        raise FileNotFoundError(f"{parts} holds no part-<host>.json: the map stage wrote nothing; check its job logs")
    by_split = {split: i for i, split in enumerate(SPLITS)}
    entries = sorted(
        (e for listing in listings for e in listing["entries"]), key=lambda e: (by_split[e["split"]], e["path"])
    )
    return entries, [row for listing in listings for row in listing["rows"]]

"""Plan a shard set of the selection from the previous one: the shards it keeps, the rows it masks, the rows it packs.

An earlier shard is kept by reference while it holds a live row (nothing is kept across another format,
BYTES_CONFIG or pack order); compaction repacks mostly-masked and merges small shards; new rows are packed
in `pack_order`; category ids are append-only."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from .relative_paths import split_relative
from .shard_format import FORMAT, MASKED_SCHEMA, ROWS_SCHEMA
from .tables import SPLITS

log = logging.getLogger("zero.shard")

# Recorded in the manifest: an earlier set packed in another order is packed again, not kept.
PACK_ORDER = {"order": "groups interleaved", "seed": 0}
# The config that decides a shard's bytes: an earlier set with other values is never kept.
BYTES_CONFIG = ("target_shard_bytes", "image_encoding", "max_side", "jpeg_quality")


@dataclass(frozen=True)
class Compaction:
    compact_masked_share: float = 0.25
    merge_small_share: float = 0.5
    merge_rows_share: float = 0.1

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"--{name.replace('_', '-')} must be within [0, 1], got {value}")


@dataclass(frozen=True)
class PreviousSet:
    """An earlier shard set as the planner reads it; its shards are listed as `../<name>/shards/...`."""

    manifest: dict[str, Any]
    rows: pa.Table  # ROWS_SCHEMA
    masked: frozenset[tuple[str, str]]  # (path, key)
    name: str


@dataclass
class ShardPlan:
    categories: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)  # earlier entries, paths from the new set
    kept_rows: list[dict[str, str]] = field(default_factory=list)  # their rows (ROWS_SCHEMA), masked ones too
    masked: list[dict[str, str]] = field(default_factory=list)  # (path, key) of the kept shards' masked rows
    to_pack: dict[str, list[str]] = field(default_factory=dict)  # split -> keys, in pack_order
    dropped: dict[str, list[str]] = field(default_factory=dict)  # why -> earlier paths

    def work(self) -> dict[str, int]:
        return {
            "shards_kept": len(self.kept),
            "shards_dropped": sum(len(paths) for paths in self.dropped.values()),
            "shards_compacted": len(self.dropped.get("compacted", [])),
            "shards_merged": len(self.dropped.get("merged", [])),
            "rows_kept": sum(e["rows"] - e["masked"] for e in self.kept),
            "rows_masked": len(self.masked),
            "rows_packed": sum(len(keys) for keys in self.to_pack.values()),
        }


def plan_shards(
    selected: dict[str, tuple[str, str, str]],
    groups: dict[str, tuple[str, str]],
    category_names: list[str],
    config: dict[str, Any],
    compaction: Compaction,
    previous: PreviousSet | None,
) -> ShardPlan:
    """`selected`: key -> (split, sha256, label digest); `groups`: key -> (source, group)."""
    keep = previous is not None and _keeps(previous.manifest, config)
    plan = ShardPlan(categories=append_categories(previous.manifest["categories"] if keep else [], category_names))
    live: dict[str, list[str]] = {}  # kept shard path (from the new set) -> its live keys
    if keep:
        live = _keep_shards(plan, previous, selected)
        _compact(plan, live, selected, config["target_shard_bytes"], compaction)
    claimed = {key for keys in live.values() for key in keys}
    for split in SPLITS:
        plan.to_pack[split] = pack_order(
            [k for k, (s, _, _) in selected.items() if s == split and k not in claimed], groups
        )
    for why, paths in plan.dropped.items():
        log.info("%d earlier shards not kept (%s), e.g. %s", len(paths), why, paths[0])
    return plan


def _keeps(manifest: dict[str, Any], config: dict[str, Any]) -> bool:
    earlier = {name: manifest.get("config", {}).get(name) for name in BYTES_CONFIG}
    now = {name: config.get(name) for name in BYTES_CONFIG}
    if manifest.get("format") != FORMAT or earlier != now or manifest.get("pack_order") != PACK_ORDER:
        log.info(
            "earlier shard set is format %s, config %s, order %s; now %s, %s, %s: every row is packed again",
            manifest.get("format"),
            earlier,
            manifest.get("pack_order"),
            FORMAT,
            now,
            PACK_ORDER,
        )
        return False
    return True


def _keep_shards(
    plan: ShardPlan, previous: PreviousSet, selected: dict[str, tuple[str, str, str]]
) -> dict[str, list[str]]:
    """Each earlier shard's rows sorted into live and masked; returns path -> live keys of the kept."""
    by_path: dict[str, list[tuple[str, str, str, str]]] = {}
    columns = previous.rows.to_pydict()
    for path, key, sha, split, labels in zip(*(columns[name] for name in ROWS_SCHEMA.names)):
        by_path.setdefault(path, []).append((key, sha, split, labels))
    claimed: set[str] = set()
    live_by_path = {}
    for entry in previous.manifest["shards"]:
        rows = by_path.get(entry["path"], [])
        if len(rows) != entry["rows"]:
            raise ValueError(
                f"earlier shard set {previous.name}: {entry['path']} has {entry['rows']} rows in its manifest but "
                f"{len(rows)} in rows.parquet; the set is damaged, delete it and materialize arrow_shards again"
            )
        path = rebased(entry["path"], previous.name)
        live, masked = [], []
        for key, sha, split, labels in rows:
            still = (entry["path"], key) not in previous.masked and key not in claimed
            (live if still and selected.get(key) == (split, sha, labels) else masked).append(key)
        if not live:
            plan.dropped.setdefault("no row of it selected", []).append(path)
            continue
        claimed.update(live)
        live_by_path[path] = live
        plan.kept.append({**entry, "path": path, "masked": len(masked)})
        plan.kept_rows += [
            {"path": path, "key": key, "sha256": sha, "split": split, "labels": labels}
            for key, sha, split, labels in rows
        ]
        plan.masked += [{"path": path, "key": key} for key in masked]
    return live_by_path


def _compact(
    plan: ShardPlan,
    live: dict[str, list[str]],
    selected: dict[str, tuple[str, str, str]],
    target_bytes: int,
    compaction: Compaction,
) -> None:
    """Drop the kept shards compaction rewrites (their live rows are then packed again)."""
    dropped = {e["path"]: "compacted" for e in plan.kept if e["masked"] / e["rows"] > compaction.compact_masked_share}
    for split in SPLITS:
        small = [
            e
            for e in plan.kept
            if e["split"] == split
            and e["path"] not in dropped
            and e["bytes"] < compaction.merge_small_share * target_bytes
        ]
        split_rows = sum(1 for s, _, _ in selected.values() if s == split)
        small_rows = sum(len(live[e["path"]]) for e in small)
        if len(small) > 1 and small_rows > compaction.merge_rows_share * split_rows:
            dropped |= {e["path"]: "merged" for e in small}
    for path, why in dropped.items():
        plan.dropped.setdefault(why, []).append(path)
        del live[path]
    plan.kept = [e for e in plan.kept if e["path"] not in dropped]
    plan.kept_rows = [row for row in plan.kept_rows if row["path"] not in dropped]
    plan.masked = [row for row in plan.masked if row["path"] not in dropped]


def rebased(path: str, previous_name: str) -> str:
    """An earlier manifest's shard path as the new set lists it (its own shards become `../<name>/...`)."""
    ups, key = split_relative(path)
    if ups == 0:
        return f"../{previous_name}/{key}"
    if ups == 1:
        return path
    raise ValueError(f"earlier shard path {path!r} is not in a shard set's folder nor beside it")


def append_categories(earlier: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """The earlier categories with their ids, then the names new to them with the next ids (name order)."""
    ids = {c["name"]: int(c["id"]) for c in earlier}
    categories = [{"id": ids[name], "name": name} for name in sorted(ids, key=ids.get)]
    for name in sorted(set(names) - set(ids)):
        categories.append({"id": len(categories) + 1, "name": name})
    return categories


def rows_table(rows: list[dict[str, str]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ROWS_SCHEMA)


def masked_table(rows: list[dict[str, str]]) -> pa.Table:
    return pa.Table.from_pylist(sorted(rows, key=lambda r: (r["path"], r["key"])), schema=MASKED_SCHEMA)


def pack_order(keys: list[str], groups: dict[str, tuple[str, str]], seed: int = PACK_ORDER["seed"]) -> list[str]:
    """`keys` with every (source, group) spread evenly along the order (seeded)."""
    members: dict[tuple[str, str], list[str]] = {}
    for key in keys:
        members.setdefault(groups[key], []).append(key)
    placed = []
    for (source, group), group_keys in members.items():
        phase = _unit(seed, "group", source, group)
        group_keys.sort(key=lambda key: _unit(seed, "key", key))
        placed += [
            ((index + phase) / len(group_keys), _unit(seed, "key", key), key) for index, key in enumerate(group_keys)
        ]
    return [key for *_, key in sorted(placed)]


def _unit(seed: int, *parts: str) -> float:
    """A number in [0, 1) drawn from the seed and `parts` alone: the same on every machine and run."""
    digest = hashlib.sha256("\0".join([str(seed), *parts]).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64

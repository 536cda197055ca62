"""Decide which shards of an earlier shard set can be carried over unchanged, and what is left to pack.

Rules (the incremental contract of arrow_shards):
- Nothing is reused when the earlier set's shard config (target size, image encoding) differs.
- An earlier shard is kept, byte for byte, only when every row in it is still accepted, in the same
  split, with the same sha256 and the same labels (boxes, category ids and names, size, format).
  Any removed, changed or relabelled image, or a vocabulary change that renumbers one of its
  categories, drops the whole shard; its rows that are still valid are packed again with the new ones.
- Rows not in a kept shard are packed into new shards, numbered after the highest earlier index of
  their split, so a shard name never names two different contents in one lineage.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .shard_format import FORMAT, SHARD_SCHEMA, open_shard

log = logging.getLogger("zero.shard")

LABEL_SCHEMA = pa.schema([f for f in SHARD_SCHEMA if f.name != "image"])
_INDEX = re.compile(r"^(?P<split>[a-z]+)-(?P<index>\d+)\.arrow$")


@dataclass
class ShardPlan:
    kept: list[dict[str, Any]] = field(default_factory=list)  # earlier manifest entries carried over
    to_pack: dict[str, list[str]] = field(default_factory=dict)  # split -> keys, sorted
    first_index: dict[str, int] = field(default_factory=dict)  # split -> index of the first new shard
    dropped: list[str] = field(default_factory=list)  # "file: why"


def plan_shards(
    expected: dict[str, tuple[str, dict[str, Any]]], config: dict[str, Any], previous: Path | None, previous_manifest: dict[str, Any] | None
) -> ShardPlan:
    """`expected` maps key -> (split, shard_labels row) for the current validated set."""
    plan = ShardPlan()
    claimed: set[str] = set()
    reusable = previous_manifest is not None and _same_config(previous_manifest, config)
    for entry in previous_manifest["shards"] if reusable else []:
        why = _why_not_reusable(previous / entry["file"], entry, expected, claimed)
        if why:
            plan.dropped.append(f"{entry['file']}: {why}")
            continue
        plan.kept.append(entry)
    splits = sorted({split for split, _ in expected.values()})
    for split in splits:
        plan.to_pack[split] = sorted(k for k, (s, _) in expected.items() if s == split and k not in claimed)
    for entry in previous_manifest["shards"] if reusable else []:
        match = _INDEX.match(entry["file"])
        if match:
            split = match["split"]
            plan.first_index[split] = max(plan.first_index.get(split, 0), int(match["index"]) + 1)
    return plan


def _same_config(manifest: dict[str, Any], config: dict[str, Any]) -> bool:
    if manifest.get("format") != FORMAT or manifest.get("config") != config:
        log.info("earlier shard set has config %s, now %s: every row is packed again", manifest.get("config"), config)
        return False
    return True


def _why_not_reusable(path: Path, entry: dict[str, Any], expected: dict[str, tuple[str, dict[str, Any]]], claimed: set[str]) -> str:
    """"" when the shard can be carried over (its keys are then added to `claimed`), else the reason."""
    if not path.is_file() or path.stat().st_size != entry["bytes"]:
        return "missing or not the size its manifest records"
    # Memory-mapped: the image column is never read, only the label columns are compared.
    stored = open_shard(path).select(LABEL_SCHEMA.names)
    if stored.num_rows != entry["rows"]:
        return f"{stored.num_rows} rows, manifest says {entry['rows']}"
    keys = stored.column("key").to_pylist()
    gone = [k for k in keys if k not in expected or expected[k][0] != entry["split"] or k in claimed]
    if gone:
        return f"{len(gone)} of its images are no longer accepted in split {entry['split']!r}, e.g. {gone[0]}"
    wanted = pa.Table.from_pylist([expected[k][1] for k in keys], schema=LABEL_SCHEMA)
    if not stored.equals(wanted):
        return "an image in it changed (sha256, labels, size or category ids)"
    claimed.update(keys)
    return ""

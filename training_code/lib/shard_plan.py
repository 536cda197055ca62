"""Decide which shards of an earlier shard set can be carried over unchanged, and what is left to pack.

Rules (the incremental contract of arrow_shards):
- Nothing is reused when the earlier set's shard config (target size, image encoding) differs.
- An earlier shard is kept, byte for byte, only when every row in it is still accepted, in the same
  split, with the same sha256 and the same labels (boxes, category ids and names, size, format).
  Any removed, changed or relabelled image, or a vocabulary change that renumbers one of its
  categories, drops the whole shard; its rows that are still valid are packed again with the new ones.
- Rows not in a kept shard are packed into new shards, numbered after the highest earlier index of
  their split, so a shard name never names two different contents in one lineage.
- Rows are packed in `pack_order`: a seeded order that spreads every (source, group) evenly over the
  rows packed, so each shard holds a sample of all of them, never a run of one lot. It is a function of
  the keys packed alone, so an incremental run orders its new rows the same way whatever was kept.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from .shard_format import FORMAT, LABEL_SCHEMA, open_shard

log = logging.getLogger("zero.shard")

_INDEX = re.compile(r"^(?P<split>[a-z]+)-(?P<index>\d+)\.arrow$")
# Recorded in the manifest: an earlier set packed in another order is packed again, not carried over.
PACK_ORDER = {"order": "groups interleaved", "seed": 0}


@dataclass
class ShardPlan:
    kept: list[dict[str, Any]] = field(default_factory=list)  # earlier manifest entries carried over
    to_pack: dict[str, list[str]] = field(default_factory=dict)  # split -> keys, in pack_order
    first_index: dict[str, int] = field(default_factory=dict)  # split -> index of the first new shard
    dropped: list[str] = field(default_factory=list)  # "file: why"


def plan_shards(
    expected: dict[str, tuple[str, dict[str, Any]]],
    config: dict[str, Any],
    previous: Path | None,
    previous_manifest: dict[str, Any] | None,
    groups: dict[str, tuple[str, str]],
) -> ShardPlan:
    """`expected` maps key -> (split, shard_labels row) for the current validated set; `groups` key ->
    (source, group)."""
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
        plan.to_pack[split] = pack_order(
            [k for k, (s, _) in expected.items() if s == split and k not in claimed], groups
        )
    for entry in previous_manifest["shards"] if reusable else []:
        match = _INDEX.match(entry["file"])
        if match:
            split = match["split"]
            plan.first_index[split] = max(plan.first_index.get(split, 0), int(match["index"]) + 1)
    return plan


def pack_order(keys: list[str], groups: dict[str, tuple[str, str]], seed: int = PACK_ORDER["seed"]) -> list[str]:
    """`keys` with every (source, group) spread evenly: the i-th of a group's m keys (in a seeded order)
    goes at (i + phase) / m, its group's phase seeded too, so any run of rows holds each group in
    proportion to its size."""
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


def _same_config(manifest: dict[str, Any], config: dict[str, Any]) -> bool:
    if manifest.get("format") != FORMAT or manifest.get("config") != config:
        log.info("earlier shard set has config %s, now %s: every row is packed again", manifest.get("config"), config)
        return False
    if manifest.get("pack_order") != PACK_ORDER:
        log.info(
            "earlier shard set was packed in order %s, now %s: every row is packed again",
            manifest.get("pack_order"),
            PACK_ORDER,
        )
        return False
    return True


def _why_not_reusable(
    path: Path, entry: dict[str, Any], expected: dict[str, tuple[str, dict[str, Any]]], claimed: set[str]
) -> str:
    """ "" when the shard can be carried over (its keys are then added to `claimed`), else the reason."""
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

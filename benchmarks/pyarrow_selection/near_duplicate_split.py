"""The split by near-duplicate groups: an image and its near-identical copies, in any group or source, take one split.

Validation gives each group (a source's lot, session) one split; a re-encoded, resized or cropped
copy of an image in another group or source could still land on the other side. Here the selected
rows' perceptual hashes (the accepted table's `phash`) are grouped (`near_duplicates`), and every
(source, group) linked to another through a near-duplicate group joins it: each such set of groups
takes the split validation gave the (source, group) that sorts first in it, so a near-duplicate
group is never split and neither is a validation group. Rows linked to nothing keep their split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training_code.lib.perceptual_hash import as_unsigned

from .near_duplicates import NearDuplicateSettings, connected_components, near_duplicate_groups

PHASH = "phash"  # the accepted table's column of perceptual hashes
# One row per selected image in a near-duplicate group of two or more: the group is named by its first
# image (by source, then key); `validated_split` is validation's, `split` the one it trains in.
NEAR_DUPLICATES_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("near_duplicate_of", pa.string(), nullable=False),
        pa.field("group", pa.string(), nullable=False),
        pa.field("validated_split", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)


@dataclass(frozen=True)
class NearDuplicateSplit:
    split: pa.Array  # per row given, the split it trains in
    members: pa.Table  # NEAR_DUPLICATES_SCHEMA


def near_duplicate_counts(members: pa.Table) -> dict[str, int]:
    """Of NEAR_DUPLICATES_SCHEMA rows: the groups (of two or more), the images in them, those whose split
    changed, and the groups whose images validation had put on both sides."""
    if not members.num_rows:
        return {"near_duplicate_groups": 0, "near_duplicate_images": 0, "moved_split": 0, "groups_were_split": 0}
    per_group = members.group_by("near_duplicate_of").aggregate([("validated_split", "count_distinct")])
    moved = pc.sum(pc.not_equal(members.column("validated_split"), members.column("split"))).as_py() or 0
    return {
        "near_duplicate_groups": per_group.num_rows,
        "near_duplicate_images": members.num_rows,
        "moved_split": moved,
        "groups_were_split": pc.sum(pc.greater(per_group.column("validated_split_count_distinct"), 1)).as_py() or 0,
    }


def split_by_near_duplicates(rows: pa.Table, settings: NearDuplicateSettings) -> NearDuplicateSplit:
    """The split of each of `rows` (sorted by source, key; columns source, key, group, split, phash)
    with near-duplicate groups kept whole."""
    splits = rows.column("split").combine_chunks()
    if not rows.num_rows:
        return NearDuplicateSplit(splits, NEAR_DUPLICATES_SCHEMA.empty_table())
    near = near_duplicate_groups(as_unsigned(rows.column(PHASH).to_numpy()), settings).group
    # Nodes: the (source, group) pairs, numbered in sorted order, so a component's label (its smallest
    # node) is the pair that sorts first in it.
    sources = rows.column("source").to_numpy(zero_copy_only=False).astype(str)
    groups = rows.column("group").to_numpy(zero_copy_only=False).astype(str)
    pairs = np.char.add(np.char.add(sources, "\x00"), groups)
    names, node = np.unique(pairs, return_inverse=True)
    component = connected_components(len(names), node, node[near])
    split_values = splits.to_numpy(zero_copy_only=False).astype(str)
    node_split = np.empty(len(names), dtype=object)
    node_split[node] = split_values  # a group has one split (validation's rule); the last row's if not
    trained = node_split[component[node]]
    sizes = np.bincount(near, minlength=rows.num_rows)
    in_group = sizes[near] > 1
    keys = rows.column("key")
    members = pa.table(
        {
            "source": rows.column("source").filter(pa.array(in_group)),
            "key": keys.filter(pa.array(in_group)),
            "near_duplicate_of": pc.take(keys, pa.array(near[in_group])),
            "group": rows.column("group").filter(pa.array(in_group)),
            "validated_split": splits.filter(pa.array(in_group)),
            "split": pa.array(trained[in_group].tolist(), pa.string()),
        },
        schema=NEAR_DUPLICATES_SCHEMA,
    )
    return NearDuplicateSplit(pa.array(trained.tolist(), pa.string()), members)

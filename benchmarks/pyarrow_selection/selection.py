"""The training set's policy: which accepted images of the chosen sources are selected for training.

The rules, in this order, decided on the validated tables' columns with pyarrow (never image bytes,
never a Python object per row):
0. labels: an image that is not annotated (no entry in its source's annotations.json, or a source
   configured unlabelled: the accepted table's `annotation`, see label_policy) is excluded, unless its
   source's validation treats such images as negatives; then it is a negative like any other.
1. categories: with `categories` set, a row keeps only its boxes of those categories; an image that
   had boxes but none of them is excluded (it shows objects no label would name). An image with no
   boxes at all (a negative) is selected unless `negatives` is off.
2. exact duplicates across sources: an image whose sha256 is also selected in a source whose name
   sorts first is excluded here, kept there.
3. caps: a source keeps at most `source_caps[source]` images (else `max_images_per_source`); with
   `max_images` the sources share that total in proportion to `source_weights` (1 each unless given;
   a source with fewer images than its share leaves the rest to the others). The images a source
   keeps are those whose sha256 sorts lowest: a function of the content alone, the same on every
   machine, and stable as a source grows (a new image displaces a kept one only by hashing lower).
4. the split: as validation assigned it, a pure function of the group, so a group is never split
   across train and val and agrees across sources; then near-duplicates (the accepted table's `phash`,
   see near_duplicate_split): groups linked by near-identical images, in any group or source, take
   one split, that of the (source, group) that sorts first among them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from training_code.lib.label_policy import EXCLUDED_BECAUSE, TRAINING_STATES
from training_code.lib.training_set import SELECTION_SCHEMA

from .near_duplicate_split import NEAR_DUPLICATES_SCHEMA, PHASH, split_by_near_duplicates
from .near_duplicates import NearDuplicateSettings

EXCLUDED_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("key", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
    ]
)

ANNOTATION = "annotation"  # the accepted table's column that says whether an image has labels to train on


@dataclass(frozen=True)
class SelectionPolicy:
    max_images_per_source: int | None = None
    source_caps: Mapping[str, int] = field(default_factory=dict)
    max_images: int | None = None
    source_weights: Mapping[str, float] = field(default_factory=dict)
    categories: tuple[str, ...] = ()
    negatives: bool = True
    near_duplicate_max_distance: int = NearDuplicateSettings.max_distance  # bits between perceptual hashes

    def __post_init__(self) -> None:
        self.near_duplicates()  # checks the distance
        caps = {"max_images_per_source": self.max_images_per_source, "max_images": self.max_images}
        caps |= {f"source_caps[{s}]": cap for s, cap in self.source_caps.items()}
        for name, cap in caps.items():
            if cap is not None and cap < 0:
                raise ValueError(f"{name} must be 0 or more, got {cap}")
        for source, weight in self.source_weights.items():
            if not math.isfinite(weight) or weight < 0:
                raise ValueError(f"source_weights[{source}] must be a finite number >= 0, got {weight}")

    def near_duplicates(self) -> NearDuplicateSettings:
        return NearDuplicateSettings(max_distance=self.near_duplicate_max_distance)

    def as_config(self) -> dict[str, Any]:
        """The policy as the manifest records it (part of the data version)."""
        return {
            "max_images_per_source": self.max_images_per_source,
            "source_caps": dict(sorted(self.source_caps.items())),
            "max_images": self.max_images,
            "source_weights": dict(sorted(self.source_weights.items())),
            "categories": sorted(self.categories),
            "negatives": self.negatives,
            "not_annotated": "an image with no entry in its source's annotations.json is excluded, unless the "
            "source's validation treats such images as negatives (unlabelled_are_negatives)",
            "duplicates": "an exact duplicate (same sha256) is kept in the source whose name sorts first",
            "over_cap": "a source keeps the images whose sha256 sorts lowest",
            "near_duplicates": {
                **vars(self.near_duplicates()),
                "rule": "images whose perceptual hashes are at most max_distance bits apart, and the groups they "
                "link, take the split of the (source, group) that sorts first among them",
            },
        }


@dataclass(frozen=True)
class Selection:
    selected: pa.Table  # SELECTION_SCHEMA, sorted by (source, key)
    excluded: pa.Table  # EXCLUDED_SCHEMA, sorted by (source, key)
    near_duplicates: pa.Table = field(default_factory=NEAR_DUPLICATES_SCHEMA.empty_table)  # near_duplicate_split's


def select_rows(rows: pa.Table, policy: SelectionPolicy) -> Selection:
    """Apply the policy to the accepted rows of every chosen source (SELECTION_SCHEMA columns, and
    the accepted table's `annotation` and `phash` where the rows come from validated sets)."""
    rows = rows.sort_by([("source", "ascending"), ("key", "ascending")])
    hashes = rows.select(["key", PHASH]) if PHASH in rows.column_names else None
    rows, not_annotated = _annotated_only(rows.drop_columns([PHASH]) if hashes is not None else rows)
    rows, had_boxes, has_boxes = _keep_chosen_boxes(rows.cast(SELECTION_SCHEMA), set(policy.categories))
    outside = (had_boxes > 0) & (has_boxes == 0)
    negative_off = (had_boxes == 0) & (not policy.negatives)
    excluded = [
        not_annotated,
        _reasons(rows.filter(pa.array(outside)), "no box of the chosen categories"),
        _reasons(rows.filter(pa.array(negative_off)), "a negative (no boxes), and negatives are off"),
    ]
    candidates = rows.filter(pa.array(~(outside | negative_off)))
    duplicate, owner = _later_duplicates(candidates)
    excluded.append(
        _reasons(
            candidates.filter(pa.array(duplicate)),
            pc.binary_join_element_wise("duplicate of an image kept in source ", owner, ""),
        )
    )
    unique = candidates.filter(pa.array(~duplicate))
    over, over_reasons = _over_quota(unique, policy)
    excluded.append(_reasons(unique.filter(pa.array(over)), over_reasons))
    selected = unique.filter(pa.array(~over))
    left_out = pa.concat_tables(excluded).sort_by([("source", "ascending"), ("key", "ascending")])
    if hashes is None:
        return Selection(selected, left_out)
    at = pc.index_in(selected.column("key"), value_set=hashes.column("key"))
    with_hashes = selected.append_column(PHASH, pc.take(hashes.column(PHASH), at))
    near = split_by_near_duplicates(with_hashes, policy.near_duplicates())
    selected = selected.set_column(selected.schema.get_field_index("split"), "split", near.split)
    return Selection(selected.cast(SELECTION_SCHEMA), left_out, near.members)


def _annotated_only(rows: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows that have labels to train on (without the `annotation` column), and the excluded rows
    of those that do not, each with why. Rows without the column (a selection's own) all have labels."""
    if ANNOTATION not in rows.column_names:
        return rows, _reasons(rows.slice(0, 0), "")
    states = rows.column(ANNOTATION)
    trains = pc.is_in(states, value_set=pa.array(TRAINING_STATES, pa.string()))
    kept, left_out = rows.filter(trains), rows.filter(pc.invert(trains))
    known = pc.index_in(left_out.column(ANNOTATION), value_set=pa.array(list(EXCLUDED_BECAUSE), pa.string()))
    if known.null_count:
        bad = left_out.filter(pc.is_null(known)).slice(0, 1).to_pylist()[0]
        raise ValueError(
            f"accepted row {bad['key']!r}: annotation {bad[ANNOTATION]!r} is none of "
            f"{[*TRAINING_STATES, *EXCLUDED_BECAUSE]}; rematerialize validated_images of its source"
        )
    reasons = pc.take(pa.array(list(EXCLUDED_BECAUSE.values()), pa.string()), known)
    return kept.drop_columns([ANNOTATION]), _reasons(left_out, reasons)


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def _keep_chosen_boxes(rows: pa.Table, chosen: set[str]) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """The rows with only their boxes of `chosen` categories (all when empty), and each row's box
    count before and after."""
    names, boxes = _one_chunk(rows.column("category_names")), _one_chunk(rows.column("boxes"))
    before = pc.list_value_length(names).to_numpy(zero_copy_only=False).astype(np.int64)
    if rows.num_rows and not np.array_equal(before, pc.list_value_length(boxes).to_numpy(zero_copy_only=False)):
        bad = int(np.flatnonzero(before != pc.list_value_length(boxes).to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"accepted row {rows.column('key')[bad].as_py()!r}: {before[bad]} category names for a different "
            "number of boxes; rematerialize validated_images of its source"
        )
    if not chosen:
        return rows, before, before
    flat_names = pc.list_flatten(names)
    keep = pc.is_in(flat_names, value_set=pa.array(sorted(chosen), pa.string()))
    parents = pc.list_parent_indices(names).to_numpy(zero_copy_only=False)
    after = np.bincount(parents[keep.to_numpy(zero_copy_only=False)], minlength=rows.num_rows).astype(np.int64)
    offsets = pa.array(np.concatenate([[0], np.cumsum(after)]).astype(np.int32))
    kept_names = pa.ListArray.from_arrays(offsets, flat_names.filter(keep))
    kept_boxes = pa.ListArray.from_arrays(offsets, pc.list_flatten(boxes).filter(keep))
    rows = rows.set_column(rows.schema.get_field_index("category_names"), "category_names", kept_names)
    rows = rows.set_column(rows.schema.get_field_index("boxes"), "boxes", kept_boxes)
    return rows.cast(SELECTION_SCHEMA), before, after


def _later_duplicates(rows: pa.Table) -> tuple[np.ndarray, pa.Array]:
    """Which rows (sorted by source, key) repeat an earlier row's sha256, and for those the source of
    the first one: the source whose name sorts first keeps an image."""
    position = np.arange(rows.num_rows)
    if not rows.num_rows:
        return position.astype(bool), pa.array([], pa.string())
    firsts = pa.table({"sha256": rows.column("sha256"), "at": position}).group_by("sha256").aggregate([("at", "min")])
    first = pc.take(firsts.column("at_min"), pc.index_in(rows.column("sha256"), value_set=firsts.column("sha256")))
    first = first.to_numpy(zero_copy_only=False)
    duplicate = first != position
    return duplicate, pc.take(rows.column("source"), pa.array(first[duplicate]))


def _over_quota(rows: pa.Table, policy: SelectionPolicy) -> tuple[np.ndarray, pa.Array]:
    """Which rows (sorted by source, key) are over their source's quota, and the reason of each."""
    over = np.zeros(rows.num_rows, dtype=bool)
    if not rows.num_rows:
        return over, pa.array([], pa.string())
    sources = rows.column("source").to_numpy(zero_copy_only=False)
    names, starts, counts = np.unique(sources, return_index=True, return_counts=True)
    quotas = source_quotas(dict(zip(names.tolist(), counts.tolist())), policy)
    # Within each source (a contiguous run of rows), rank by sha256 then key: the lowest are kept.
    order = pc.sort_indices(rows, sort_keys=[("source", "ascending"), ("sha256", "ascending"), ("key", "ascending")])
    order = order.to_numpy(zero_copy_only=False)
    source_at = np.repeat(np.arange(len(names)), counts)  # sorted by source, as `order` is
    rank = np.arange(rows.num_rows) - starts[source_at]
    limit = np.array([quotas[name][0] for name in names.tolist()], dtype=np.int64)
    over[order[rank >= limit[source_at]]] = True
    why = pa.array([quotas[name][1] for name in names.tolist()], pa.string())
    return over, pc.take(why, pa.array(np.searchsorted(names, sources[over])))


def source_quotas(available: dict[str, int], policy: SelectionPolicy) -> dict[str, tuple[int, str]]:
    """Source -> (how many of its images are selected, the reason given to the rest)."""
    quotas = {}
    for source, count in available.items():
        cap = policy.source_caps.get(source, policy.max_images_per_source)
        if cap is None:
            quotas[source] = (count, "")
        elif source in policy.source_caps:
            quotas[source] = (min(count, cap), f"over the cap of {cap} images for source {source}")
        else:
            quotas[source] = (min(count, cap), f"over the cap of {cap} images per source")
    if policy.max_images is None:
        return quotas
    limits = {source: quota for source, (quota, _) in quotas.items()}
    shares = weighted_shares(limits, {s: policy.source_weights.get(s, 1.0) for s in limits}, policy.max_images)
    return {
        source: (shares[source], f"over source {source}'s share of max_images {policy.max_images}: {shares[source]}")
        if shares[source] < limits[source]
        else quotas[source]
        for source in quotas
    }


def weighted_shares(limits: dict[str, int], weights: dict[str, float], total: int) -> dict[str, int]:
    """`total` images divided among sources in proportion to their weights, none given more than its
    limit (what it has, or its cap): a source at its limit leaves the rest of its share to the
    others. Whole images; the last few go to the largest remainders (ties: the name that sorts first)."""
    shares = dict.fromkeys(limits, 0)
    open_sources = {s for s in limits if weights[s] > 0 and limits[s] > 0}
    left = min(total, sum(limits[s] for s in open_sources))
    while open_sources and left > 0:
        weight = sum(weights[s] for s in open_sources)
        ideal = {s: left * weights[s] / weight for s in open_sources}
        full = {s for s in open_sources if limits[s] - shares[s] <= ideal[s]}
        if full:  # these reach their limit: give it, and divide the rest again among the others
            for source in full:
                left -= limits[source] - shares[source]
                shares[source] = limits[source]
            open_sources -= full
            continue
        whole = {s: math.floor(ideal[s]) for s in open_sources}
        for source in open_sources:
            shares[source] += whole[source]
        remainder = left - sum(whole.values())
        by_fraction = sorted(open_sources, key=lambda s: (-(ideal[s] - whole[s]), s))
        for source in by_fraction[:remainder]:
            shares[source] += 1
        left = 0
    return shares


def _reasons(rows: pa.Table, reason: str | pa.Array) -> pa.Table:
    """EXCLUDED_SCHEMA rows for `rows`, each with `reason` (one text for all, or one per row)."""
    if isinstance(reason, str):
        reason = pa.array([reason] * rows.num_rows, pa.string())
    return pa.table([rows.column("source"), rows.column("key"), reason], schema=EXCLUDED_SCHEMA)


def vocabulary(names: set[str] | list[str]) -> list[dict[str, Any]]:
    """Category names as the ids 1..K in name order (0 is the detector's background)."""
    return [{"id": index, "name": name} for index, name in enumerate(sorted(set(names)), start=1)]

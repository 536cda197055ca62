"""Which accepted images train and which validate: exact duplicates out, then a split by group.

A group (a lot, a session: images that look alike) goes wholly to one split, decided by a hash of
the seed and the group name alone, so adding data never moves an existing group across splits.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc


def split_of_group(group: str, seed: int, val_fraction: float) -> str:
    """ "val" when the group's hash point falls under `val_fraction`, else "train"."""
    point = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:8], 16) / 2**32
    return "val" if point < val_fraction else "train"


def assign_splits(groups: pa.Array | pa.ChunkedArray, seed: int, val_fraction: float) -> pa.Array:
    """Each row's split: one hash a distinct group, taken back to the rows by column."""
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"--val-fraction must be within [0, 1], got {val_fraction}")
    distinct = pc.unique(groups)
    splits = pa.array([split_of_group(group, seed, val_fraction) for group in distinct.to_pylist()], pa.string())
    return splits.take(pc.index_in(groups, value_set=distinct)) if len(groups) else pa.array([], pa.string())


def find_exact_duplicates(rows: pa.Table) -> pa.Table:
    """Rows (key, sha256, duplicate_of) of `rows` (key, sha256) for every image whose bytes equal an
    earlier key's, in key order. The first key in sorted order is kept, so the choice does not depend on
    listing or worker order."""
    first = rows.group_by("sha256").aggregate([("key", "min")]).rename_columns(["sha256", "duplicate_of"])
    joined = rows.select(["key", "sha256"]).join(first, keys="sha256")
    return joined.filter(pc.not_equal(joined["key"], joined["duplicate_of"])).sort_by("key")

"""Which accepted images train and which validate: exact duplicates out, then a split by group.

A group (a lot, a session: images that look alike) goes wholly to one split, decided by a hash of
the seed and the group name alone, so adding data never moves an existing group across splits.
"""

from __future__ import annotations

import hashlib

import pandas as pd


def split_of_group(group: str, seed: int, val_fraction: float) -> str:
    """ "val" when the group's hash point falls under `val_fraction`, else "train"."""
    point = int(hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()[:8], 16) / 2**32
    return "val" if point < val_fraction else "train"


def assign_splits(groups: pd.Series, seed: int, val_fraction: float) -> pd.Series:
    if not 0.0 <= val_fraction <= 1.0:
        raise ValueError(f"--val-fraction must be within [0, 1], got {val_fraction}")
    by_group = {group: split_of_group(group, seed, val_fraction) for group in groups.unique()}
    return groups.map(by_group)


def find_exact_duplicates(keys: pd.Series, sha256s: pd.Series) -> pd.DataFrame:
    """Rows (key, sha256, duplicate_of) for every image whose bytes equal an earlier key's, in key order.

    The first key in sorted order is kept, so the choice does not depend on listing or worker order.
    """
    frame = pd.DataFrame({"key": keys.values, "sha256": sha256s.values}).sort_values("key", kind="stable")
    kept = frame.groupby("sha256", sort=False)["key"].transform("first")
    duplicates = frame[frame["key"] != kept].assign(duplicate_of=kept[frame["key"] != kept])
    return duplicates.reset_index(drop=True)

"""List ONE source of the raw root as a stream sorted by key: local folders walked, S3 paged with
StartAfter, or an S3 Inventory report read (a listing and an inventory of the same objects agree);
and the split groups of what it lists, counted by the first 8 bytes of their name's sha256 (big-endian)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from .raw_index_inventory import inventory_objects
from .storage import ObjectInfo, is_s3, key_problem, s3_call, s3_client, split_s3, walk_local

S3_PAGE_KEYS = 1000


def check_source(source: str) -> str:
    """`source` when it names one folder of the raw root; a ValueError saying why otherwise."""
    problem = key_problem(source) or ("a '/' (a source is one top-level folder)" if "/" in source else None)
    if problem:
        raise ValueError(
            f"source {source!r} has {problem}; a source is the name of one top-level folder of the raw root"
        )
    return source


def list_source(raw_uri: str, source: str, inventory_manifest_uri: str | None = None) -> Iterator[ObjectInfo]:
    """Every object of `source` (folder markers left out), sorted by key, keys relative to `raw_uri`."""
    check_source(source)
    if inventory_manifest_uri:
        return inventory_objects(inventory_manifest_uri, raw_uri, under=f"{source}/")
    if is_s3(raw_uri):
        return _list_s3_source(raw_uri, source)
    raw = Path(raw_uri)
    if (raw / source).is_symlink() or not (raw / source).is_dir():
        raise FileNotFoundError(
            f"{raw / source} is not a folder of the raw root {raw} (a symlinked source folder is not followed)"
        )
    return walk_local(raw, source)


def _list_s3_source(raw_uri: str, source: str) -> Iterator[ObjectInfo]:
    bucket, prefix = split_s3(raw_uri)
    base = f"{prefix}/" if prefix else ""
    page_prefix = f"{base}{source}/"
    client, after = s3_client(), ""
    while True:
        request = {
            "Bucket": bucket,
            "Prefix": page_prefix,
            "MaxKeys": S3_PAGE_KEYS,
            **({"StartAfter": after} if after else {}),
        }
        page = s3_call(
            lambda request=request: client.list_objects_v2(**request),
            f"LIST s3://{bucket}/{page_prefix} after {after!r}",
        )
        contents = page.get("Contents", [])
        for listed in contents:
            if not (listed["Key"].endswith("/") and int(listed["Size"]) == 0):  # a folder marker, not an object
                yield ObjectInfo(listed["Key"][len(base) :], int(listed["Size"]), listed["ETag"].strip('"'))
        if not page.get("IsTruncated") or not contents:
            return
        after = contents[-1]["Key"]


def group_of(key: str, pattern: re.Pattern[str] | None = None) -> str:
    """An image's split group: its folder, or with `pattern` its first match (group 1 if it has one)."""
    if pattern is None:
        return str(PurePosixPath(key).parent)
    match = pattern.search(key)
    if match is None:
        raise ValueError(f"group pattern {pattern.pattern!r} does not match key {key!r}; fix the pattern or the key")
    return match.group(1) if pattern.groups else match.group(0)


def group_hash(group: str) -> int:
    return int.from_bytes(hashlib.sha256(group.encode()).digest()[:8], "big")


class GroupCounts:
    """Images per distinct group hash, fed a batch of row hashes at a time."""

    def __init__(self) -> None:
        self.hashes = np.empty(0, dtype=np.uint64)  # sorted, distinct
        self.counts = np.empty(0, dtype=np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_rows = 0

    def add(self, row_hashes: np.ndarray) -> None:
        hashes, counts = np.unique(row_hashes, return_counts=True)
        self._pending.append((hashes, counts.astype(np.int64)))
        self._pending_rows += len(hashes)
        if self._pending_rows > max(len(self.hashes), 1 << 16):  # merge when the pending part outgrows the merged one
            self._merge()

    def _merge(self) -> None:
        if not self._pending:
            return
        hashes = np.concatenate([self.hashes, *(h for h, _ in self._pending)])
        counts = np.concatenate([self.counts, *(c for _, c in self._pending)])
        self.hashes, inverse = np.unique(hashes, return_inverse=True)
        self.counts = np.bincount(inverse, weights=counts, minlength=len(self.hashes)).astype(np.int64)
        self._pending, self._pending_rows = [], 0

    def __len__(self) -> int:
        self._merge()
        return len(self.hashes)

    def sample_limit(self, images: int) -> int | None:
        """The largest group hash of a sample of about `images` rows; None when all fit."""
        self._merge()
        if int(self.counts.sum()) <= images:
            return None
        before = np.cumsum(self.counts) - self.counts  # rows taken before each group
        return int(self.hashes[before < images][-1])

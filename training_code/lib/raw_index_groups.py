"""Split groups of a streamed index: how to name them, how many there are, and the rehearsal sample.

A group is counted by the first 8 bytes of its name's sha256 (big-endian), never by name; sorting by it
is sorting by hex digest, the order the rehearsal sample takes groups in. Collisions are negligible.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import PurePosixPath

import numpy as np


def group_of(key: str, pattern: re.Pattern[str] | None = None) -> str:
    """The split group of an image: by default the folder it sits in (`source/lot_003` for
    `source/lot_003/part_1.jpg`); with `pattern`, the text its first match covers (group 1 if it has one)."""
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
        """The largest group hash of the rehearsal sample: groups are taken in hash order until about
        `images` rows are in (the last group whole). None when every row fits."""
        self._merge()
        if int(self.counts.sum()) <= images:
            return None
        before = np.cumsum(self.counts) - self.counts  # rows taken before each group
        return int(self.hashes[before < images][-1])

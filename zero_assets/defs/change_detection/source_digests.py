"""Per-source digests of a listing or an inventory report, and the sources whose digest moved.

A digest is the sha256 of the sorted 16-byte hashes of its rows (key, size, etag), so row order does not matter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from training_code.lib.storage import ObjectInfo, printable_key
from zero_assets.defs.change_detection.sources import SourceFilter

DIGEST_CHARS = 16  # hex characters kept per source in a cursor: 64 bits, plenty to tell versions apart
ABSENT = "absent"  # the version of a source whose last object went away


class SourceDigests:
    """Accumulates rows by source; `digests()` gives each source's digest."""

    def __init__(self) -> None:
        self._rows: dict[str, bytearray] = {}
        self._sources = SourceFilter()
        self.keys = 0  # every key seen, read by the index or not: for the tick's summary

    @classmethod
    def of(cls, objects: Iterable[ObjectInfo]) -> SourceDigests:
        """The digests of a whole listing or inventory report, read once as a stream."""
        accumulator = cls()
        for obj in objects:
            accumulator.add(obj)
        return accumulator

    def add(self, obj: ObjectInfo) -> None:
        self.keys += 1
        source = self._sources.source(obj.key)
        if source is None:
            return
        row = f"{printable_key(obj.key)}\0{obj.size}\0{obj.etag}".encode()
        self._rows.setdefault(source, bytearray()).extend(hashlib.blake2b(row, digest_size=16).digest())

    def digests(self) -> dict[str, str]:
        out = {}
        for source, rows in self._rows.items():
            ordered = np.sort(np.frombuffer(bytes(rows), dtype="S16"))
            out[source] = hashlib.sha256(ordered.tobytes()).hexdigest()[:DIGEST_CHARS]
        return out

    def problem_lines(self) -> list[str]:
        return self._sources.problem_lines()


def changed_sources(previous: dict[str, str], current: dict[str, str]) -> dict[str, str]:
    """Sources whose digest differs, new ones included; a source that vanished gets `ABSENT`."""
    changed = {source: digest for source, digest in current.items() if previous.get(source) != digest}
    changed.update({source: ABSENT for source in previous if source not in current})
    return changed


def previous_digests(state, tick: int) -> tuple[dict[str, str], list[str]]:
    """The digests tick `tick` kept, and a problem line when they are gone (every source then counts as changed)."""
    if tick == 0:
        return {}, []
    kept = state.read(tick)
    if kept is None:
        return {}, [f"the per-source digests of tick {tick} are not in the instance: every source counts as changed"]
    return kept, []

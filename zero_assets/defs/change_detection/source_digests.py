"""Per-source digests of a listing or an inventory report (sha256 of the sorted 16-byte hashes of its rows: key,
size, etag), the sources whose digest moved, and change detection by listing."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np

from training_code.lib.storage import ObjectInfo, is_s3, list_objects, printable_key
from zero_assets.defs.change_detection import Detection, TickState
from zero_assets.defs.change_detection.sources import SourceFilter

DIGEST_CHARS = 16  # hex characters kept per source in a cursor: 64 bits, plenty to tell versions apart
ABSENT = "absent"  # the version of a source whose last object went away
LISTING = "listing"


class SourceDigests:
    """The rows of a whole listing or inventory report, read once as a stream, by source; `digests()` of each."""

    def __init__(self, objects: Iterable[ObjectInfo]) -> None:
        self._rows: dict[str, bytearray] = {}
        self._sources = SourceFilter()
        self.keys = 0  # every key seen, read by the index or not: for the tick's summary
        for obj in objects:
            self.keys += 1
            source = self._sources.source(obj.key)
            if source is not None:
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


def detect_from_listing(raw_uri: str, cursor: dict | None, store) -> Detection:
    """One digest per source from a listing of the raw root (local roots, or S3 without queue or inventory)."""
    previous = cursor if cursor and cursor.get("kind") == LISTING and cursor.get("raw") == raw_uri else {}
    state, tick = TickState(store, f"{LISTING} {raw_uri}"), previous.get("tick", 0)
    accumulator = SourceDigests(list_objects(raw_uri, include_unsafe=True))
    digests = accumulator.digests()
    before, problems = previous_digests(state, tick)
    changed = changed_sources(before, digests)
    summary = f"listed {accumulator.keys} keys in {len(digests)} sources under {raw_uri}"
    if not accumulator.keys:  # a missing s3:// prefix lists as empty rather than raising
        summary += f": raw root {raw_uri} holds no files (does it exist? check ZERO_RAW_URI)"
    elif is_s3(raw_uri):
        summary += " (the whole prefix, every tick: set ZERO_RAW_EVENTS_QUEUE_URL or ZERO_RAW_INVENTORY_MANIFEST_URI)"
    if not changed:
        return Detection({}, previous, summary, accumulator.problem_lines(), previous.get("changes", 0))
    state.write(tick + 1, digests)
    change_number = previous.get("changes", 0) + 1
    cursor = {"kind": LISTING, "raw": raw_uri, "tick": tick + 1, "changes": change_number, "sources": len(digests)}
    return Detection(
        changed, cursor, summary, problems + accumulator.problem_lines(), change_number, baseline=not before
    )

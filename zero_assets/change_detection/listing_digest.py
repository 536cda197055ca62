"""Change detection by listing: one digest per source of the raw root's image files and annotations.json.

For local raw roots, where a listing costs in proportion to the root (fine on one machine). An s3://
root without an event queue or an inventory falls back to this too, and then lists the whole bucket
prefix every tick: the tick's summary says so. The cursor keeps one digest per source, not per key.
"""

from __future__ import annotations

from training_code.lib.storage import is_s3, list_objects

from . import Detection
from .source_digests import SourceDigests, changed_sources

KIND = "listing"


def detect_from_listing(raw_uri: str, cursor: dict | None) -> Detection:
    previous = cursor if cursor and cursor.get("kind") == KIND and cursor.get("raw") == raw_uri else None
    accumulator = SourceDigests()
    keys = 0
    for obj in list_objects(raw_uri, include_unsafe=True):
        keys += 1
        accumulator.add(obj)
    digests = accumulator.digests()
    changed = changed_sources(previous["sources"] if previous else {}, digests)
    change_number = (previous or {}).get("changes", 0) + (1 if changed else 0)
    summary = f"listed {keys} keys in {len(digests)} sources under {raw_uri}"
    if is_s3(raw_uri):
        summary += " (the whole prefix, every tick: set ZERO_RAW_EVENTS_QUEUE_URL or ZERO_RAW_INVENTORY_MANIFEST_URI)"
    return Detection(changed, {"kind": KIND, "raw": raw_uri, "sources": digests, "changes": change_number},
                     summary, accumulator.problem_lines(), change_number)

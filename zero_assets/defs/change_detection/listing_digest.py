"""Change detection by listing: one digest per source of the raw root's image files and annotations.json.

Meant for local roots; an s3:// root without a queue or inventory falls back to it, and the summary says so.
"""

from __future__ import annotations

from training_code.lib.storage import is_s3, list_objects
from zero_assets.defs.change_detection import Detection
from zero_assets.defs.change_detection.source_digests import SourceDigests, changed_sources, previous_digests
from zero_assets.defs.change_detection.tick_state import TickState

KIND = "listing"


def detect_from_listing(raw_uri: str, cursor: dict | None, store) -> Detection:
    """`store`: the instance's run storage, where the per-source digests wait between ticks."""
    previous = cursor if cursor and cursor.get("kind") == KIND and cursor.get("raw") == raw_uri else {}
    state, tick = TickState(store, f"{KIND} {raw_uri}"), previous.get("tick", 0)
    accumulator = SourceDigests.of(list_objects(raw_uri, include_unsafe=True))
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
    cursor = {"kind": KIND, "raw": raw_uri, "tick": tick + 1, "changes": change_number, "sources": len(digests)}
    return Detection(
        changed, cursor, summary, problems + accumulator.problem_lines(), change_number, baseline=not before
    )

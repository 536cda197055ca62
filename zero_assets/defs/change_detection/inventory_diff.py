"""Change detection from S3 Inventory reports: `ZERO_RAW_INVENTORY_MANIFEST_URI` names one report's manifest.json
or the configuration's folder (the newest dated report wins); each new report is digested per source, once."""

from __future__ import annotations

import hashlib
import json
import re

from training_code.lib.raw_index_inventory import inventory_objects
from training_code.lib.storage import read_bytes
from zero_assets.defs.change_detection import Detection, TickState
from zero_assets.defs.change_detection.raw_sources import list_sources
from zero_assets.defs.change_detection.source_digests import SourceDigests, changed_sources, previous_digests

KIND = "inventory"
MANIFEST = "manifest.json"
_REPORT_FOLDER = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}-\d{2}Z$")


def current_manifest(location: str) -> tuple[str, bytes]:
    """The URI and bytes of the newest report's manifest.json at `location` (a manifest or a configuration's folder)."""
    if location.endswith(MANIFEST):
        return location, read_bytes(location)
    # The dated report folders are top-level folders, listed as a raw root's sources are.
    dated = sorted((f for f in list_sources(location) if _REPORT_FOLDER.match(f)), reverse=True)
    for folder in dated[:3]:  # a report being written has no manifest yet: the one before it is current
        uri = f"{location.rstrip('/')}/{folder}/{MANIFEST}"
        try:
            return uri, read_bytes(uri)
        except FileNotFoundError:
            continue
    raise FileNotFoundError(
        f"no S3 Inventory report under {location}: expected dated folders holding {MANIFEST} "
        "(or set ZERO_RAW_INVENTORY_MANIFEST_URI to one report's manifest.json)"
    )


def detect_from_inventory(location: str, raw_uri: str, cursor: dict | None, store) -> Detection:
    """`store`: the instance's run storage, where the per-source digests wait between ticks."""
    manifest_uri, raw_manifest = current_manifest(location)
    checksum = hashlib.sha256(raw_manifest).hexdigest()[:16]
    try:
        created = str(json.loads(raw_manifest).get("creationTimestamp", ""))
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"{manifest_uri} is not an S3 Inventory manifest (not a JSON object)") from None
    previous = cursor if cursor and cursor.get("kind") == KIND and cursor.get("raw") == raw_uri else {}
    if (previous.get("created"), previous.get("checksum")) == (created, checksum):
        return Detection(
            {},
            previous,
            f"no new inventory report ({manifest_uri}, created {created}, already diffed)",
            change_number=previous.get("changes", 0),
        )
    state, tick = TickState(store, f"{KIND} {raw_uri}"), previous.get("tick", 0)
    accumulator = SourceDigests(inventory_objects(manifest_uri, raw_uri))
    digests = accumulator.digests()
    before, problems = previous_digests(state, tick)
    changed = changed_sources(before, digests)
    state.write(tick + 1, digests)
    change_number = previous.get("changes", 0) + (1 if changed else 0)
    cursor = {
        "kind": KIND,
        "raw": raw_uri,
        "manifest": manifest_uri,
        "created": created,
        "checksum": checksum,
        "tick": tick + 1,
        "changes": change_number,
        "sources": len(digests),
    }
    summary = (
        f"diffed inventory report {manifest_uri} (created {created}): {accumulator.keys} keys in {len(digests)} sources"
    )
    return Detection(changed, cursor, summary, problems + accumulator.problem_lines(), change_number)

"""Skip work whose inputs did not change, after checking that the earlier output is still there.

A materialization records its input fingerprint and the parts it was built from (code version,
config, upstream data versions). Asked to materialize again, an asset looks for an earlier
materialization with the same fingerprint whose output still holds every file its completion
marker lists (names and sizes only: no output bytes or image bytes are read). If there is one, no
job is launched and the earlier output and data version are reported as a `cache: hit`; if not,
the metadata says what changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue

from training_code.lib.storage import is_s3, join, list_objects, read_bytes, write_bytes_atomic

from .fingerprints import DATA_VERSION_TAG, FingerprintInputs

OUTPUT_MARKER = "_output.json"  # written last, after the job's own manifest
SEARCH_LIMIT = 100  # earlier materializations examined for a matching fingerprint


@dataclass(frozen=True)
class CacheDecision:
    hit: MaterializeResult | None
    reason: str


def mark_output_complete(uri: str, fingerprint: str) -> None:
    """List what the output holds (names and sizes), as the last write of a materialization."""
    files = {o.key: o.size for o in list_objects(uri) if o.key != OUTPUT_MARKER}
    write_bytes_atomic(join(uri, OUTPUT_MARKER), json.dumps({"fingerprint": fingerprint, "files": files}, indent=1).encode())


def output_is_checkable(uri: str) -> bool:
    """Local paths and s3:// are; fsx:// locations are not visible from the Dagster process."""
    return "://" not in uri or is_s3(uri)


def output_is_complete(uri: str) -> bool:
    if not output_is_checkable(uri):
        return False  # rebuild rather than trust what cannot be checked
    try:
        marker = json.loads(read_bytes(join(uri, OUTPUT_MARKER)))
    except (FileNotFoundError, OSError, ValueError):
        return False
    present = {o.key: o.size for o in list_objects(uri)}
    return all(present.get(name) == size for name, size in marker["files"].items())


def decide(context: AssetExecutionContext, inputs: FingerprintInputs) -> CacheDecision:
    """A hit (the earlier result to report again) or a miss with the reason, in words."""
    fingerprint = inputs.fingerprint
    records = context.instance.fetch_materializations(context.asset_key, limit=SEARCH_LIMIT).records
    if not records:
        return CacheDecision(None, "first materialization of this asset")
    for record in records:
        event = record.asset_materialization
        metadata = {k: v.value for k, v in event.metadata.items()}
        if metadata.get("fingerprint") != fingerprint:
            continue
        uri = str(metadata.get("uri", ""))
        if not output_is_complete(uri):
            return CacheDecision(None, f"same inputs as run {record.run_id}, but its output at {uri} is missing or incomplete: rebuilding")
        reason = f"same input fingerprint as run {record.run_id}; its output at {uri} is complete"
        reused = {**event.metadata, "cache": "hit", "cache_reason": reason, "reused_run_id": record.run_id}
        version = event.tags.get(DATA_VERSION_TAG) if event.tags else None
        return CacheDecision(MaterializeResult(metadata=reused, data_version=DataVersion(version) if version else None), reason)
    latest = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
    return CacheDecision(None, what_changed(latest.get("fingerprint_inputs") or {}, inputs))


def what_changed(before: dict[str, Any], now: FingerprintInputs) -> str:
    changes = []
    if before.get("code") != now.code:
        changes.append(f"code version {before.get('code')} -> {now.code}")
    old_config = before.get("config") or {}
    keys = sorted(k for k in set(old_config) | set(now.config) if old_config.get(k) != now.config.get(k))
    changes += [f"config {k}: {old_config.get(k)!r} -> {now.config.get(k)!r}" for k in keys]
    old_upstream = before.get("upstream") or {}
    changes += [f"upstream {a} changed" for a in sorted(set(old_upstream) | set(now.upstream)) if old_upstream.get(a) != now.upstream.get(a)]
    return "changed since the latest materialization: " + ("; ".join(changes) if changes else "output location")


def miss_metadata(inputs: FingerprintInputs, reason: str) -> dict[str, Any]:
    return {
        "cache": "miss",
        "cache_reason": reason,
        "fingerprint": inputs.fingerprint,
        "fingerprint_inputs": MetadataValue.json(inputs.as_metadata()),
        "code_version": inputs.code,
    }

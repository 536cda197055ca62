"""Skip work whose inputs did not change: a hit is an earlier materialization of the same fingerprint whose output
the marker still proves complete (and whose manifest has no `retry_next_time`); a miss says what changed."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue

from training_code.lib.output_manifest import MANIFEST, RETRY_NEXT_TIME
from training_code.lib.storage import join, read_bytes
from zero_assets.core.fingerprints import DATA_VERSION_TAG, FingerprintInputs
from zero_assets.core.output_marker import output_is_complete
from zero_assets.launch.metadata import hit_metadata
from zero_assets.launch.upstream import context_partition, latest_materializations

SEARCH_LIMIT = 100  # earlier materializations examined for a matching fingerprint


@dataclass(frozen=True)
class CacheDecision:
    hit: MaterializeResult | None
    reason: str


def cache_decision(context: AssetExecutionContext, inputs: FingerprintInputs) -> CacheDecision:
    """A hit (the earlier result to report again) or a miss with its reason, from earlier materializations."""
    fingerprint = inputs.fingerprint
    partition = context_partition(context)  # a per-source asset hits only on its own source's outputs
    records = latest_materializations(context.instance, context.asset_key, partition, limit=SEARCH_LIMIT)
    if not records:
        return CacheDecision(
            None, f"first materialization of this asset{f' for source {partition}' if partition else ''}"
        )
    for record in records:
        event = record.asset_materialization
        metadata = {k: v.value for k, v in event.metadata.items()}
        if metadata.get("fingerprint") != fingerprint:
            continue
        uri = str(metadata.get("dagster/uri", ""))
        if not output_is_complete(uri, fingerprint):
            return CacheDecision(
                None,
                f"same inputs as run {record.run_id}, but its output at {uri} is missing or incomplete: rebuilding",
            )
        refusal = reuse_refusal(uri)
        if refusal is not None:
            return CacheDecision(None, f"same inputs as run {record.run_id}, but {refusal}")
        reason = f"same input fingerprint as run {record.run_id}; its output at {uri} is complete"
        reused = hit_metadata(event.metadata, reason, record.run_id)
        version = event.tags.get(DATA_VERSION_TAG) if event.tags else None
        return CacheDecision(
            MaterializeResult(metadata=reused, data_version=DataVersion(version) if version else None), reason
        )
    latest = {k: v.value for k, v in records[0].asset_materialization.metadata.items()}
    return CacheDecision(None, what_changed(latest.get("fingerprint_inputs") or {}, inputs))


def reuse_refusal(uri: str) -> str | None:
    """Why the complete output at `uri` must not be reused (its manifest's `retry_next_time`), or None."""
    manifest = json.loads(read_bytes(join(uri, MANIFEST)))
    retry = manifest.get(RETRY_NEXT_TIME) if isinstance(manifest, dict) else None
    if not retry:
        return None
    return (
        f"its output at {uri} holds {retry['count']} results that were not their input's fault "
        f"({retry['why']}): rebuilding, which redoes only those"
    )


def published_hit(
    uri: str, marker: dict[str, Any] | None, inputs: FingerprintInputs, reason: str, built_by_run: str | None = None
) -> MaterializeResult | None:
    """A hit on an output another run published, from its marker alone; None without a data version for it."""
    version = None if marker is None else marker["data_versions"].get(inputs.fingerprint)
    if version is None:
        return None
    proven = {"dagster/uri": MetadataValue.path(uri), **standard_metadata(marker), **miss_metadata(inputs, reason)}
    metadata = hit_metadata(proven, reason, built_by_run, recorded=False)
    return MaterializeResult(metadata=metadata, data_version=DataVersion(version))


def standard_metadata(marker: dict[str, Any]) -> dict[str, Any]:
    """`dagster/size_bytes` (the marker's recorded size, else its files) and `dagster/row_count` if recorded."""
    listed = sum(int(facts["bytes"]) for facts in marker["files"].values())
    metadata: dict[str, Any] = {"dagster/size_bytes": int(marker.get("size_bytes", listed))}
    if marker.get("row_count") is not None:
        metadata["dagster/row_count"] = int(marker["row_count"])
    return metadata


def reported_int(metadata: Any, key: str) -> int | None:
    """The number under `key` in a build's metadata (a plain int or an IntMetadataValue), or None."""
    value = (metadata or {}).get(key)
    return None if value is None else int(getattr(value, "value", value))


def what_changed(before: dict[str, Any], now: FingerprintInputs) -> str:
    changes = []
    if before.get("code") != now.code:
        changes.append(f"code version {before.get('code')} -> {now.code}")
    old_config = before.get("config") or {}
    keys = sorted(k for k in set(old_config) | set(now.config) if old_config.get(k) != now.config.get(k))
    changes += [f"config {k}: {old_config.get(k)!r} -> {now.config.get(k)!r}" for k in keys]
    old_upstream = before.get("upstream") or {}
    changes += [
        f"upstream {a} changed"
        for a in sorted(set(old_upstream) | set(now.upstream))
        if old_upstream.get(a) != now.upstream.get(a)
    ]
    return "changed since the latest materialization: " + ("; ".join(changes) if changes else "output location")


def miss_metadata(inputs: FingerprintInputs, reason: str) -> dict[str, Any]:
    return {
        "cache": "miss",
        "cache_reason": reason,
        "fingerprint": inputs.fingerprint,
        "fingerprint_inputs": MetadataValue.json(inputs.as_metadata()),
        "code_version": inputs.code,
    }

"""Asset checks: the quarantine rate and the shard manifest block downstream work; mAP is watched.

Limits come from the environment (`ZERO_MAX_QUARANTINE_RATE`, `ZERO_MAP_REGRESSION_MARGIN`) into the
`CheckLimits` resource, so operators tune them without a code change.
"""

import os
from pathlib import Path

from dagster import AssetCheckExecutionContext, AssetCheckResult, AssetCheckSeverity, AssetKey, ConfigurableResource, asset_check

from training_code.lib.shard_format import ShardIntegrityError, read_manifest, verify_shard
from training_code.lib.storage import is_s3

from .assets import arrow_shards, map_report, validated_images
from .fingerprints import latest_materializations

PARTITION_TAG = "dagster/partition"


class CheckLimits(ConfigurableResource):
    max_quarantine_rate: float = 0.2  # share of images_in quarantined as corrupt or unreadable
    map_regression_margin: float = 0.02  # how far mAP may fall below the previous report


def _latest_metadata(context: AssetCheckExecutionContext, asset: str, nth: int = 0) -> "dict | None":
    """The metadata of the asset's latest materialization (nth before it); for a per-source asset, of
    the source this run materialized (the check runs in the same run as its asset)."""
    partition = context.run.tags.get(PARTITION_TAG)
    records = latest_materializations(context.instance, AssetKey(asset), partition, limit=nth + 1)
    if len(records) <= nth:
        return None
    return {k: v.value for k, v in records[nth].asset_materialization.metadata.items()}


@asset_check(asset=validated_images, blocking=True, description="quarantined / images_in stays under the limit")
def quarantine_rate_under_limit(context: AssetCheckExecutionContext, limits: CheckLimits) -> AssetCheckResult:
    metadata = _latest_metadata(context, "validated_images")
    rate = metadata["quarantined"] / max(1, metadata["images_in"])
    return AssetCheckResult(
        passed=rate <= limits.max_quarantine_rate,
        metadata={"quarantine_rate": rate, "limit": limits.max_quarantine_rate, "quarantined": metadata["quarantined"]},
        description=f"{rate:.1%} of images quarantined (limit {limits.max_quarantine_rate:.1%})",
    )


@asset_check(asset=arrow_shards, blocking=True, description="every shard matches its manifest: bytes, sha256, rows")
def shard_manifest_integrity(context: AssetCheckExecutionContext) -> AssetCheckResult:
    uri = str(_latest_metadata(context, "arrow_shards")["uri"])
    if is_s3(uri):  # checked where it is read instead: fsx_warm_state verifies every shard it warms
        return AssetCheckResult(passed=True, description=f"{uri} is on S3: shards are verified on the warm mount")
    folder = Path(uri)
    manifest = read_manifest(folder)
    broken = []
    for entry in manifest["shards"]:
        try:
            verify_shard(folder, entry)
        except ShardIntegrityError as error:
            broken.append(str(error))
    return AssetCheckResult(passed=not broken, metadata={"shards": len(manifest["shards"]), "broken": len(broken)},
                            description="; ".join(broken) or f"{len(manifest['shards'])} shards intact")


@asset_check(asset=map_report, description="mAP does not fall more than the margin below the previous report")
def map_not_regressed(context: AssetCheckExecutionContext, limits: CheckLimits) -> AssetCheckResult:
    current, previous = _latest_metadata(context, "map_report"), _latest_metadata(context, "map_report", nth=1)
    if previous is None or previous.get("uri") == current.get("uri"):
        return AssetCheckResult(passed=True, description="no earlier, different report to compare with")
    drop = previous["mAP"] - current["mAP"]
    return AssetCheckResult(
        passed=drop <= limits.map_regression_margin,
        severity=AssetCheckSeverity.WARN,
        metadata={"mAP": current["mAP"], "previous_mAP": previous["mAP"], "margin": limits.map_regression_margin},
        description=f"mAP {current['mAP']:.4f} vs previous {previous['mAP']:.4f} (allowed drop {limits.map_regression_margin})",
    )


def limits_from_env() -> CheckLimits:
    fields = {"max_quarantine_rate": "ZERO_MAX_QUARANTINE_RATE", "map_regression_margin": "ZERO_MAP_REGRESSION_MARGIN"}
    return CheckLimits(**{field: float(os.environ[var]) for field, var in fields.items() if os.environ.get(var)})


ALL_CHECKS = [quarantine_rate_under_limit, shard_manifest_integrity, map_not_regressed]

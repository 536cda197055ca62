"""Asset checks: quarantine rate, val share and shard manifest block; mAP regression, map_report freshness and
GPU utilisation warn. A check that cannot check fails as a WARN with `skipped` in its metadata, never blocking."""

import datetime
import json
import warnings
from pathlib import Path
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    ConfigurableResource,
    PreviewWarning,
    asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)
from dagster._utils.schedules import cron_string_iterator  # no public cron iterator in dagster

from training_code.lib.relative_paths import resolve
from training_code.lib.shard_format import FORMAT, MANIFEST, ShardIntegrityError, read_manifest, verify_shard
from training_code.lib.storage import is_s3, join, list_objects, read_bytes
from zero_assets.defs.assets import arrow_shards, map_report, trained_checkpoint, training_set, validated_images
from zero_assets.defs.assets.training_set import TrainingSetConfig
from zero_assets.defs.automation import train_cron
from zero_assets.defs.limits import max_quarantine_rate, rate_from_env
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.upstream import latest_materializations

PARTITION_TAG = "dagster/partition"
DEFAULT_MAP_REGRESSION_MARGIN = 0.02  # how far mAP may fall below the previous report
DEFAULT_MIN_GPU_UTILIZATION = 0.8  # under it the data pipeline or the model is the bottleneck
DATA_BOUND_WAIT = 0.1  # a loop waiting for batches this share of its time is fed too slowly


class CheckLimits(ConfigurableResource):
    map_regression_margin: float = DEFAULT_MAP_REGRESSION_MARGIN
    min_gpu_utilization: float = DEFAULT_MIN_GPU_UTILIZATION


def _latest_metadata(context: AssetCheckExecutionContext, asset: str, nth: int = 0) -> "dict | None":
    """The metadata of the asset's latest materialization (nth before it), of this run's source if any."""
    partition = context.run.tags.get(PARTITION_TAG)
    records = latest_materializations(context.instance, AssetKey(asset), partition, limit=nth + 1)
    if len(records) <= nth:
        return None
    return {k: v.value for k, v in records[nth].asset_materialization.metadata.items()}


def _skipped(context: AssetCheckExecutionContext, why: str) -> AssetCheckResult:
    partition = context.run.tags.get(PARTITION_TAG)
    return AssetCheckResult(
        passed=False,
        severity=AssetCheckSeverity.WARN,
        description=f"skipped: {why}",
        metadata={"skipped": why, **({"source": partition} if partition else {})},
    )


def _never_materialized(context: AssetCheckExecutionContext, asset: str) -> AssetCheckResult:
    partition = context.run.tags.get(PARTITION_TAG)
    where = f" for source {partition}" if partition else ""
    return _skipped(context, f"{asset} has no materialization{where} yet; materialize it first, then run the check")


def recorded_quarantine_limit(metadata: dict[str, Any]) -> "tuple[float, str]":
    """The limit this materialization ran under and where it came from (today's default for older records)."""
    config = (metadata.get("fingerprint_inputs") or {}).get("config") or {}
    if "max_quarantine_rate" in config:
        return float(config["max_quarantine_rate"]), "the materialization's config"
    return max_quarantine_rate(), "the default (the materialization recorded no config)"


def _quarantine_rate(context: AssetCheckExecutionContext) -> AssetCheckResult:
    metadata = _latest_metadata(context, "validated_images")
    if metadata is None:
        return _never_materialized(context, "validated_images")
    if "quarantined" not in metadata or "images_in" not in metadata:
        return _skipped(
            context, "the latest validated_images materialization records no quarantined / images_in counts"
        )
    limit, limit_source = recorded_quarantine_limit(metadata)
    rate = metadata["quarantined"] / max(1, metadata["images_in"])
    return AssetCheckResult(
        passed=rate <= limit,
        metadata={
            "quarantine_rate": rate,
            "limit": limit,
            "limit_from": limit_source,
            "quarantined": metadata["quarantined"],
        },
        description=f"{rate:.1%} of images quarantined (limit {limit:.1%})",
    )


# Partitioned, so each source shows its own verdict in the UI; Dagster marks partitioned checks as preview.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", PreviewWarning)
    quarantine_rate_under_limit = asset_check(
        asset=validated_images,
        name="quarantine_rate_under_limit",
        blocking=True,
        description="quarantined / images_in stays under the limit the asset ran with",
        partitions_def=RAW_SOURCES,
    )(_quarantine_rate)


@asset_check(
    asset=training_set,
    blocking=True,
    description="the near-duplicate rule moved the val share by no more than the config's max_val_share_shift",
)
def val_share_held(context: AssetCheckExecutionContext) -> AssetCheckResult:
    metadata = _latest_metadata(context, "training_set")
    if metadata is None:
        return _never_materialized(context, "training_set")
    if "val_share_moved" not in metadata:
        return _skipped(context, "the latest training_set materialization records no val shares")
    config = (metadata.get("fingerprint_inputs") or {}).get("config") or {}
    limit = float(config.get("max_val_share_shift", TrainingSetConfig().max_val_share_shift))
    before, after, moved = metadata["val_share_before"], metadata["val_share_after"], metadata["val_share_moved"]
    return AssetCheckResult(
        passed=abs(moved) <= limit,
        metadata={
            "val_share_before": before,
            "val_share_after": after,
            "val_share_moved": moved,
            "limit": limit,
            "near_duplicate_images_left_val": metadata.get("near_duplicate_images_left_val", 0),
            "largest_near_duplicate_cluster": metadata.get("largest_near_duplicate_cluster", 0),
        },
        description=(
            f"val share {before:.4f} -> {after:.4f} ({moved:+.4f}, limit {limit:g}): "
            f"{metadata.get('near_duplicate_images_left_val', 0)} near-duplicates of train images left val"
        ),
    )


@asset_check(
    asset=arrow_shards,
    blocking=True,
    description=(
        "every shard the manifest lists, kept ones in earlier folders too, matches it: bytes, sha256 and rows "
        "locally; bytes from the listing on S3"
    ),
)
def shard_manifest_integrity(context: AssetCheckExecutionContext) -> AssetCheckResult:
    records = latest_materializations(context.instance, AssetKey("arrow_shards"))
    if not records:
        return _never_materialized(context, "arrow_shards")
    uri = str(getattr(records[0].asset_materialization.metadata.get("dagster/uri"), "value", ""))
    if is_s3(uri):
        return _check_s3_shards(uri.rstrip("/"))
    if "://" in uri or not uri:  # fsx:// and the like: not visible from the Dagster process
        return _skipped(
            context,
            f"shards at {uri or '(no uri recorded)'} cannot be read from the Dagster process; "
            "fsx_warm_state verifies each shard it warms",
        )
    return _check_local_shards(Path(uri))


def _check_local_shards(folder: Path) -> AssetCheckResult:
    manifest = read_manifest(folder)
    broken = []
    for entry in manifest["shards"]:
        try:
            verify_shard(folder, entry, root=folder.parent)  # kept shards are in sibling folders
        except (ShardIntegrityError, ValueError) as error:
            broken.append(str(error))
    return _integrity_result(manifest, broken, checked="bytes, sha256, rows")


def _check_s3_shards(uri: str) -> AssetCheckResult:
    """Listed sizes against the manifest: catches missing and truncated shards without downloading them."""
    manifest = json.loads(read_bytes(join(uri, MANIFEST)))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{join(uri, MANIFEST)}: format {manifest.get('format')!r} is not {FORMAT!r}")
    listings: dict[str, dict[str, int]] = {}
    broken = []
    for entry in manifest["shards"]:
        where = resolve(uri, entry["path"], root=uri.rpartition("/")[0])
        folder, _, name = where.rpartition("/")
        if folder not in listings:
            listings[folder] = {o.key: o.size for o in list_objects(folder)}
        size = listings[folder].get(name)
        if size is None:
            broken.append(f"{where}: listed in the manifest but missing")
        elif size != entry["bytes"]:
            broken.append(f"{where}: {size} bytes in the listing, manifest says {entry['bytes']}")
    return _integrity_result(manifest, broken, checked="bytes (from the S3 listing)")


def _integrity_result(manifest: dict[str, Any], broken: list[str], checked: str) -> AssetCheckResult:
    shards = len(manifest["shards"])
    return AssetCheckResult(
        passed=not broken,
        metadata={"shards": shards, "broken": len(broken), "checked": checked},
        description="; ".join(broken) or f"{shards} shards intact ({checked})",
    )


@asset_check(asset=map_report, description="mAP does not fall more than the margin below the previous report")
def map_not_regressed(context: AssetCheckExecutionContext, limits: CheckLimits) -> AssetCheckResult:
    current, previous = _latest_metadata(context, "map_report"), _latest_metadata(context, "map_report", nth=1)
    if current is None:
        return _never_materialized(context, "map_report")
    if previous is None or previous.get("dagster/uri") == current.get("dagster/uri"):
        return AssetCheckResult(passed=True, description="no earlier, different report to compare with")
    drop = previous["mAP"] - current["mAP"]
    return AssetCheckResult(
        passed=drop <= limits.map_regression_margin,
        severity=AssetCheckSeverity.WARN,
        metadata={"mAP": current["mAP"], "previous_mAP": previous["mAP"], "margin": limits.map_regression_margin},
        description=(
            f"mAP {current['mAP']:.4f} vs previous {previous['mAP']:.4f} (allowed drop {limits.map_regression_margin})"
        ),
    )


@asset_check(
    asset=trained_checkpoint,
    description="GPU utilisation while training is at least the limit; under it, says whether data or model",
)
def gpu_utilization_held(context: AssetCheckExecutionContext, limits: CheckLimits) -> AssetCheckResult:
    metadata = _latest_metadata(context, "trained_checkpoint")
    if metadata is None:
        return _never_materialized(context, "trained_checkpoint")
    minimum = limits.min_gpu_utilization
    if "gpu_utilization" not in metadata:
        why = metadata.get("gpu_utilization_why", "the training recorded no GPU figure")
        return AssetCheckResult(passed=True, description=f"no GPU figure: {why}", metadata={"why": why})
    mean, wait = metadata["gpu_utilization"], metadata.get("data_wait_fraction", 0.0)
    figures = {"gpu_utilization": mean, "min_gpu_utilization": minimum, "data_wait_fraction": wait}
    if mean >= minimum:
        return AssetCheckResult(passed=True, description=f"mean GPU utilisation {mean:.0%}", metadata=figures)
    culprit = (
        f"the data pipeline: the loop waited for batches {wait:.0%} of its time (more workers, or shards "
        "closer to the GPUs)"
        if wait >= DATA_BOUND_WAIT
        else f"the model: batches were ready ({wait:.0%} of the time waiting), so the GPU idles inside the step "
        "(a batch too small for it, CPU work or synchronisation in the step)"
    )
    return AssetCheckResult(
        passed=False,
        severity=AssetCheckSeverity.WARN,
        description=f"mean GPU utilisation {mean:.0%} is under {minimum:.0%}; it points at {culprit}",
        metadata={**figures, "points_at": "data" if wait >= DATA_BOUND_WAIT else "model"},
    )


def cron_period(cron: str) -> datetime.timedelta:
    """The time between two consecutive ticks of `cron` (from now): how old map_report may be at a tick."""
    ticks = cron_string_iterator(datetime.datetime.now(datetime.UTC).timestamp(), cron, "UTC")
    first = next(ticks)
    return next(ticks) - first


# At each training tick map_report must have materialized since the previous one.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    MAP_REPORT_FRESHNESS = build_last_update_freshness_checks(
        assets=[map_report],
        deadline_cron=train_cron(),
        lower_bound_delta=cron_period(train_cron()),
        severity=AssetCheckSeverity.WARN,
    )
    freshness_sensor = build_sensor_for_freshness_checks(
        freshness_checks=MAP_REPORT_FRESHNESS, name="map_report_freshness_sensor"
    )


def limits_from_env() -> CheckLimits:
    return CheckLimits(
        map_regression_margin=rate_from_env("ZERO_MAP_REGRESSION_MARGIN", DEFAULT_MAP_REGRESSION_MARGIN),
        min_gpu_utilization=rate_from_env("ZERO_MIN_GPU_UTILIZATION", DEFAULT_MIN_GPU_UTILIZATION),
    )


ALL_CHECKS = [
    quarantine_rate_under_limit,
    val_share_held,
    shard_manifest_integrity,
    map_not_regressed,
    gpu_utilization_held,
    *MAP_REPORT_FRESHNESS,
]

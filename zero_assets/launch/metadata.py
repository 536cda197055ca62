"""Metadata helpers of the assets: column schemas, job results, published paths, cache hits, display rounding."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import pyarrow
from dagster import (
    DataVersion,
    FloatMetadataValue,
    JsonMetadataValue,
    MaterializeResult,
    MetadataValue,
    PathMetadataValue,
    PipesClientCompletedInvocation,
    TableColumn,
    TableColumnConstraints,
    TableSchema,
    TableSchemaMetadataValue,
    TextMetadataValue,
)

from training_code.lib.tables import TableSpec
from zero_assets.core.fingerprints import UpstreamOutput, upstream_name


def upstream_metadata(upstream: list[UpstreamOutput]) -> JsonMetadataValue:
    """What a materialization was built from (asset -> uri, data version): the links lineage walks."""
    return MetadataValue.json(
        {upstream_name(u, upstream): {"uri": u.uri, "data_version": u.data_version} for u in upstream}
    )


def table_schema(table: TableSpec | pyarrow.Schema) -> TableSchemaMetadataValue:
    """A table's column schema for the UI: Arrow types, nullability, pandera checks and column descriptions."""
    schema = table.arrow if isinstance(table, TableSpec) else table
    notes = {key.decode(): value.decode() for key, value in (schema.metadata or {}).items()}

    def constraints(field: pyarrow.Field) -> TableColumnConstraints:
        if not isinstance(table, TableSpec):
            return TableColumnConstraints(nullable=field.nullable)
        column = table.checks.columns[field.name]
        return TableColumnConstraints(
            nullable=column.nullable,
            unique=field.name in (table.checks.unique or []),
            other=[check.error or check.name for check in column.checks],
        )

    return MetadataValue.table_schema(
        TableSchema(
            columns=[
                TableColumn(
                    field.name, str(field.type), description=notes.get(field.name), constraints=constraints(field)
                )
                for field in schema
            ]
        )
    )


def job_result(invocation: PipesClientCompletedInvocation, extra: dict[str, Any]) -> MaterializeResult:
    """The script's own report (metadata and data version), plus what the asset knows about the run."""
    reported = invocation.get_materialize_result()
    if reported.data_version is None:
        raise RuntimeError("the job script reported no data version; it must report one through Dagster Pipes")
    return MaterializeResult(
        metadata={**(reported.metadata or {}), **extra}, data_version=DataVersion(reported.data_version.value)
    )


# A job's container output folders; gone once the backend publishes them, so reported paths need mapping.
_STAGED = re.compile(r"^(?:.*/)?opt/ml/(?:model|processing/output/(?P<name>[^/]+))(?:/(?P<rest>.*))?$")


def published_paths(metadata: Mapping[str, Any], outputs: Mapping[str, str]) -> dict[str, Any]:
    """`metadata` with each container output path replaced by where it was published (`outputs`: name -> uri)."""
    return {key: _published(value, outputs) for key, value in metadata.items()}


def _published(value: Any, outputs: Mapping[str, str]) -> Any:
    text = value.value if isinstance(value, (TextMetadataValue, PathMetadataValue)) else value
    match = _STAGED.match(text) if isinstance(text, str) else None
    if match is None:
        return value
    name = match["name"] or (next(iter(outputs)) if len(outputs) == 1 else None)
    if name not in outputs:
        return value
    destination = outputs[name].rstrip("/")
    return MetadataValue.path(f"{destination}/{match['rest']}" if match["rest"] else destination)


# Keys about the build rather than the output; a cache hit renames them `built_<key>`, as this run built nothing.
BUILD_KEYS = frozenset(
    """
    job_name job_status backend instance_type instance_count job_wall_s wall_s validate_wall_s select_wall_s
    instance_seconds billable_instance_seconds estimated_cost_usd spot_savings_usd spot_savings_pct
    managed_spot on_demand_usd_per_instance_hour spot_usd_per_instance_hour price_source cost_note job_logs
    console_url logs_url status_history code_package model_artifact
    """.split()
)
BUILD_PREFIXES = ("map_", "training_plan")  # a map stage's launch; the Training Plan the job ran on
CACHE_FIRST = ("cache", "cache_reason", "built_by_run", "built_by_job", "step_wall_s")
BUILT = "built_"


def hit_metadata(
    earlier: Mapping[str, Any], reason: str, built_by_run: str | None, recorded: bool = True
) -> dict[str, Any]:
    """A cache hit's metadata: verdict, first builder, then `earlier`'s entries with build keys as `built_<key>`."""
    carried = {key: value for key, value in earlier.items() if key not in CACHE_FIRST}
    run = _plain(earlier.get("built_by_run")) or built_by_run
    job = _plain(earlier.get("built_by_job")) or _plain(earlier.get("job_name"))
    if job is None and recorded:
        job = "none: built in the Dagster step"
    built = {
        "cache": "hit",
        "cache_reason": reason,
        **({"built_by_run": run} if run else {}),
        **({"built_by_job": job} if job else {}),
    }
    for key, value in carried.items():
        is_build_key = key in BUILD_KEYS or key.startswith(BUILD_PREFIXES)
        built[f"{BUILT}{key}" if is_build_key and not key.startswith(BUILT) else key] = value
    return built


def cache_first(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`metadata` with the cache verdict and builder first, as the UI lists entries in order."""
    head = {key: metadata[key] for key in CACHE_FIRST if key in metadata}
    return {**head, **{key: value for key, value in metadata.items() if key not in head}}


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


DISPLAY_DIGITS = 4  # significant digits a number shows in the UI (mAP 0.6325, a loss 0.0001234)


def rounded_for_display(metadata: Mapping[str, Any], digits: int = DISPLAY_DIGITS) -> dict[str, Any]:
    """`metadata` with every float rounded to `digits` significant digits; output files keep full values."""
    return {key: _rounded(value, digits) for key, value in metadata.items()}


def _rounded(value: Any, digits: int) -> Any:
    number = value.value if isinstance(value, FloatMetadataValue) else value
    if not isinstance(number, float) or isinstance(number, bool) or not math.isfinite(number):
        return value
    return MetadataValue.float(float(f"{number:.{digits}g}"))

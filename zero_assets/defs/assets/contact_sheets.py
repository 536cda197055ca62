"""Which sources show quarantined images: a metadata entry on every validated_images materialization."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import DagsterInstance, MetadataValue

from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.upstream import latest_by_partition

ENTRY = "quarantine_contact_sheets"


def contact_sheets_entry(instance: DagsterInstance, source: str, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """`{ENTRY: a Markdown table}` of each source's quarantined images and how many its sheet shows.

    `source`'s own row comes from `metadata`, the one being reported."""
    rows, others = [], set(instance.get_dynamic_partitions(RAW_SOURCES.name)) - {source}
    latest = latest_by_partition(instance, "validated_images", others)
    for name in sorted(others | {source}):
        if name == source:
            found: Mapping[str, Any] | None = metadata
        else:
            record = latest.get(name)
            found = dict(record.asset_materialization.metadata) if record and record.asset_materialization else None
        rows.append(f"| {name}{' (this source)' if name == source else ''} | {_sheet(found)} |")
    table = "\n".join(["| source | quarantined images shown |", "| --- | --- |", *rows])
    return {ENTRY: MetadataValue.md(table)}


def _sheet(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "not validated yet"
    quarantined, shown = _int(metadata.get("quarantined")), _int(metadata.get("quarantined_images_shown"))
    if not quarantined:
        return "none quarantined"
    if not shown:
        return f"{quarantined} quarantined, none that still decodes: no sheet"
    return f"{shown} of {quarantined} on its contact sheet"


def _int(value: Any) -> int:
    return int(getattr(value, "value", value) or 0)

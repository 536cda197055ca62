"""The materializations Dagster holds, and the upstream event each one recorded reading (Dagster's own input
tags, never a copy in metadata): what lineage walks.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, DataProvenance, EventLogRecord

from zero_assets.core.fingerprints import DATA_VERSION_TAG

PAGE = 1000


@dataclass(frozen=True)
class Materialization:
    asset: str
    partition: str | None
    storage_id: int
    run_id: str
    metadata: dict[str, Any]
    tags: dict[str, str]

    @classmethod
    def of(cls, record: EventLogRecord) -> Materialization:
        event = record.asset_materialization
        return cls(
            event.asset_key.to_user_string(),
            record.partition_key,
            record.storage_id,
            record.run_id,
            {k: v.value for k, v in event.metadata.items()},
            dict(event.tags or {}),
        )

    @property
    def name(self) -> str:
        return f"{self.asset}[{self.partition}]" if self.partition else self.asset

    @property
    def uri(self) -> str:
        return str(self.metadata.get("dagster/uri", ""))

    @property
    def data_version(self) -> str | None:
        return self.tags.get(DATA_VERSION_TAG)

    def _recorded(self, upstream: str) -> tuple[str, int] | None:
        provenance, key = DataProvenance.from_tags(self.tags), AssetKey(upstream)
        if provenance is None or not provenance.has_input_asset(key) or provenance.input_storage_ids[key] is None:
            return None
        return provenance.input_data_versions[key].value, provenance.input_storage_ids[key]

    def pointer(self, upstream: str) -> int | None:
        """The storage id of the `upstream` event Dagster recorded this materialization read, if any."""
        recorded = self._recorded(upstream)
        return recorded[1] if recorded else None

    def read_from(self, upstream: str) -> tuple[str, int]:
        """The data version and the event storage id of `upstream` that Dagster recorded this materialization read."""
        recorded = self._recorded(upstream)
        if recorded is None:
            raise LookupError(
                f"materialization {self.storage_id} of {self.name} (run {self.run_id}) has no Dagster provenance for "
                f"its input {upstream} (tag dagster/input_event_pointer/{upstream}); re-materialize it"
            )
        return recorded


def materializations(
    instance: DagsterInstance, asset: str, partition: str | None = None, before_storage_id: int | None = None
) -> Iterator[Materialization]:
    """Every materialization of `asset` (of one source's partition when given), newest first."""
    cursor = None
    records_filter = AssetRecordsFilter(
        asset_key=AssetKey(asset),
        asset_partitions=[partition] if partition else None,
        before_storage_id=before_storage_id,
    )
    while True:
        page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor)
        yield from (Materialization.of(record) for record in page.records)
        if not page.has_more:
            return
        cursor = page.cursor


def upstream_of(instance: DagsterInstance, found: Materialization, asset: str) -> Materialization:
    """The materialization of the unpartitioned `asset` that `found` was built from: the event Dagster points at."""
    version, pointer = found.read_from(asset)
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=AssetKey(asset), storage_ids=[pointer]), limit=1
    ).records
    if not records:
        raise LookupError(
            f"{found.name} (run {found.run_id}) was built from {asset} event {pointer}, which this Dagster instance "
            "no longer holds (wiped?)"
        )
    upstream = Materialization.of(records[0])
    if upstream.data_version != version:
        raise LookupError(
            f"{found.name} (run {found.run_id}) read {asset} at data version {version}, but the event it points at "
            f"({pointer}) has {upstream.data_version}"
        )
    return upstream


def source_upstream_of(
    instance: DagsterInstance, found: Materialization, asset: str, source: str, uri: str
) -> Materialization:
    """The materialization of `asset` for `source` that `found` was built from, which wrote `uri`."""
    _, pointer = found.read_from(asset)
    upstream = next(materializations(instance, asset, source, before_storage_id=pointer + 1), None)
    if upstream is None or upstream.uri != uri:
        held = upstream.uri if upstream else "none"
        raise LookupError(
            f"{found.name} (run {found.run_id}) names {uri} as {asset} of source {source}, but that source's "
            f"materialization current at Dagster's pointer {pointer} wrote {held}"
        )
    return upstream

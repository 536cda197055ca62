"""What the Dagster instance knows of earlier materializations: upstream outputs and this asset's previous one."""

from __future__ import annotations

from dagster import AssetExecutionContext, AssetKey, AssetRecordsFilter, DagsterInstance, EventLogRecord, Failure

from training_code.lib.storage import exists, join
from zero_assets.core.fingerprints import DATA_VERSION_TAG, UpstreamOutput


def latest_materializations(
    instance: DagsterInstance, asset: str | AssetKey, partition: str | None = None, limit: int = 1
) -> list[EventLogRecord]:
    """The newest materializations of `asset` (of its `partition` when given), newest first.

    A per-source asset is looked up in its own partition only: another source's latest
    materialization is never this source's upstream, previous output or cache hit."""
    key = AssetKey.from_user_string(asset) if isinstance(asset, str) else asset
    records_filter = AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    return list(instance.fetch_materializations(records_filter, limit=limit).records)


def context_partition(context: AssetExecutionContext) -> str | None:
    """The source this materialization is for, or None for the unpartitioned assets."""
    return context.partition_key if context.has_partition_key else None


def upstream_output(context: AssetExecutionContext, asset: str, partition: str | None = None) -> UpstreamOutput:
    """The latest materialization of an upstream asset (of `partition` for a per-source one): where its
    output is and its data version."""
    records = latest_materializations(context.instance, asset, partition)
    if not records or records[0].asset_materialization is None:
        which = f"{asset} (source {partition})" if partition else asset
        select = f"--select '{asset}' --partition {partition}" if partition else f"--select '{asset}+'"
        raise Failure(
            f"upstream asset {which} has no materialization in this Dagster instance. Materialize it first "
            f"(for example {select}), and make sure DAGSTER_HOME points at the instance that holds "
            "earlier runs: without it the Dagster CLI uses a throwaway instance."
        )
    return output_of(records[0], asset, partition)


def output_of(record: EventLogRecord, asset: str, partition: str | None = None) -> UpstreamOutput:
    materialization = record.asset_materialization
    uri = materialization.metadata.get("dagster/uri")
    version = materialization.tags.get(DATA_VERSION_TAG) if materialization.tags else None
    if uri is None or version is None:
        which = f"{asset} (source {partition})" if partition else asset
        raise Failure(f"the latest materialization of {which} records no uri or data version; re-materialize it")
    return UpstreamOutput(asset, str(uri.value), version, partition)


def previous_output(context: AssetExecutionContext) -> str | None:
    """Where this asset's latest materialization (of this source, for a per-source asset) wrote its
    output, when that output is still complete.

    Incremental jobs take it as `--previous` to reuse earlier work. It is deliberately not part of the
    input fingerprint: the job must produce the same result with or without it.
    """
    records = latest_materializations(context.instance, context.asset_key, context_partition(context))
    if not records or records[0].asset_materialization is None:
        return None
    uri = records[0].asset_materialization.metadata.get("dagster/uri")
    if uri is None or not exists(join(str(uri.value), "manifest.json")):
        context.log.info(
            f"no complete earlier output of {context.asset_key.to_user_string()} to reuse; doing the full pass"
        )
        return None
    return str(uri.value)

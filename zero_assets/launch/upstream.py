"""What the Dagster instance knows of earlier materializations: upstream outputs and this asset's previous one."""

from __future__ import annotations

import os
from collections.abc import Iterable

from dagster import (
    AssetExecutionContext,
    AssetKey,
    AssetRecordsFilter,
    DagsterEventType,
    DagsterInstance,
    EventLogRecord,
    Failure,
)
from dagster._check import CheckError  # not exported by dagster

from training_code.lib.storage import exists, join
from zero_assets.core.fingerprints import DATA_VERSION_TAG, UpstreamOutput

MATERIALIZE = "dagster asset materialize -m zero_assets.definitions"


def latest_materializations(
    instance: DagsterInstance, asset: str | AssetKey, partition: str | None = None, limit: int = 1
) -> list[EventLogRecord]:
    """The newest materializations of `asset` (only of `partition` when given), newest first."""
    key = _asset_key(asset)
    records_filter = AssetRecordsFilter(asset_key=key, asset_partitions=[partition]) if partition else key
    return list(instance.fetch_materializations(records_filter, limit=limit).records)


def latest_by_partition(
    instance: DagsterInstance, asset: str | AssetKey, partitions: Iterable[str]
) -> dict[str, EventLogRecord]:
    """The newest materialization of each of `partitions` that has one, in two queries however many there are."""
    key, wanted = _asset_key(asset), set(partitions)
    if not wanted:  # Dagster reads no partitions as every partition
        return {}
    newest = instance.event_log_storage.get_latest_storage_id_by_partition(
        key, DagsterEventType.ASSET_MATERIALIZATION, wanted
    )
    if not newest:  # and no storage ids as no filter: none was materialized, so nothing to fetch
        return {}
    found = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=key, storage_ids=list(newest.values())), limit=len(newest)
    ).records
    return {record.partition_key: record for record in found if record.partition_key is not None}


def _asset_key(asset: str | AssetKey) -> AssetKey:
    return AssetKey.from_user_string(asset) if isinstance(asset, str) else asset


def context_partition(context: AssetExecutionContext) -> str | None:
    return context.partition_key if context.has_partition_key else None


def upstream_output(context: AssetExecutionContext, asset: str, partition: str | None = None) -> UpstreamOutput:
    """Where the latest materialization of an upstream asset (of `partition`) put its output, and its data version."""
    records = latest_materializations(context.instance, asset, partition)
    if not records or records[0].asset_materialization is None:
        raise Failure(description=missing_upstream_message(context, asset, partition), allow_retries=False)
    return output_of(records[0], asset, partition)


def missing_upstream_message(context: AssetExecutionContext, asset: str, partition: str | None = None) -> str:
    """The failure text naming every unmaterialized ancestor and the one command that builds them all."""
    try:
        graph = context.repository_def.asset_graph
    except CheckError:  # the Python API's `materialize` has no repository, only the graph it was handed
        graph = context.job_def.asset_layer.asset_graph
    target = context.asset_key.to_user_string()
    upstream = AssetKey.from_user_string(asset)
    wanted = [k for k in graph.toposorted_asset_keys if k == upstream or k in graph.get_ancestor_asset_keys(upstream)]
    missing, per_source, sources, registered = [], [], set(), [partition] if partition else []
    for key in wanted:
        node = graph.get(key)
        if not node.is_materializable:
            continue  # the raw data itself: observed, never built
        name = key.to_user_string()
        if node.is_partitioned:
            registered = registered or sorted(context.instance.get_dynamic_partitions(node.partitions_def.name))
            per_source.append(name)
            materialized = latest_by_partition(context.instance, key, registered)
            lacking = [s for s in registered if s not in materialized]
            if lacking or not registered:
                sources.update(lacking)
                missing.append(
                    f"{name} (sources {', '.join(lacking)})" if lacking else f"{name} (no source registered)"
                )
        elif not latest_materializations(context.instance, key):
            missing.append(name)
    unpartitioned = [m for m in missing if "(" not in m]
    steps = []
    if per_source and (sources or not registered):
        loop_over = " ".join(sorted(sources)) if sources else "$(zero-assets sources)"
        if not registered:
            steps.append("zero-assets sources --register")
        steps.append(
            f"for s in {loop_over}; do {MATERIALIZE} --select '{','.join(per_source)}' --partition \"$s\"; done"
        )
    if partition is None:
        steps.append(f"{MATERIALIZE} --select '{','.join([*unpartitioned, target])}'")
    else:
        steps[-1:] = [
            f"{MATERIALIZE} --select '{','.join(dict.fromkeys([*per_source, target]))}' --partition {partition}"
        ]
    home = os.environ.get("DAGSTER_HOME") or "unset: the Dagster CLI then uses a throwaway instance"
    return (
        f"{target}{f' (source {partition})' if partition else ''} needs upstream outputs that this Dagster "
        f"instance has no materialization of: {'; '.join(missing) or asset}. One command builds them, then "
        f"{target} (from the repo root, finished outputs are cache hits):\n  (set -e; {'; '.join(steps)})\n"
        f"The instance is the one at DAGSTER_HOME ({home}): point it at the one that holds earlier runs."
    )


def output_of(record: EventLogRecord, asset: str, partition: str | None = None) -> UpstreamOutput:
    materialization = record.asset_materialization
    uri = materialization.metadata.get("dagster/uri")
    version = materialization.tags.get(DATA_VERSION_TAG) if materialization.tags else None
    if uri is None or version is None:
        which = f"{asset} (source {partition})" if partition else asset
        raise Failure(f"the latest materialization of {which} records no uri or data version; re-materialize it")
    return UpstreamOutput(asset, str(uri.value), version, partition)


def previous_output(context: AssetExecutionContext) -> str | None:
    """The latest output of this asset, when still complete: incremental jobs' `--previous`."""
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

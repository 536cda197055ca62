"""Materialize the partitioned graph in tests: each source's assets in its own run, then the tail."""

from __future__ import annotations

from pathlib import Path

from dagster import materialize

from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS, TAIL_ASSETS
from zero_assets.defs.partitions import RAW_SOURCES


def sources_of(raw_root: Path) -> list[str]:
    return sorted(p.name for p in Path(raw_root).iterdir() if p.is_dir())


def materialize_source(
    source: str, *, instance, resources, run_config=None, assets=PER_SOURCE_ASSETS, raise_on_error=True
):
    instance.add_dynamic_partitions(RAW_SOURCES.name, [source])
    return materialize(
        [*SOURCE_SPECS, *assets],
        partition_key=source,
        selection=list(assets),
        resources=resources,
        instance=instance,
        run_config=run_config or {},
        raise_on_error=raise_on_error,
    )


def materialize_tail(*, instance, resources, run_config=None, assets=TAIL_ASSETS, raise_on_error=True):
    return materialize(
        [*SOURCE_SPECS, *PER_SOURCE_ASSETS, *assets],
        selection=list(assets),
        resources=resources,
        instance=instance,
        run_config=run_config or {},
        raise_on_error=raise_on_error,
    )


def materialize_graph(raw_root: Path, *, instance, resources, run_config=None, sources=None):
    """Every source (default: every top-level folder of `raw_root`), then the tail. Returns
    ({source: per-source result}, tail result)."""
    config = run_config or {}
    per_source_ops = {
        k: v for k, v in config.get("ops", {}).items() if k in {a.key.to_user_string() for a in PER_SOURCE_ASSETS}
    }
    tail_ops = {k: v for k, v in config.get("ops", {}).items() if k not in per_source_ops}
    results = {
        s: materialize_source(
            s, instance=instance, resources=resources, run_config={"ops": per_source_ops} if per_source_ops else None
        )
        for s in (sources or sources_of(raw_root))
    }
    return results, materialize_tail(
        instance=instance, resources=resources, run_config={"ops": tail_ops} if tail_ops else None
    )


def graph_metadata(per_source: dict, tail) -> dict[str, dict]:
    """`asset[source]` (per-source assets) or `asset` (the tail) -> the metadata of that materialization."""

    def values(result, asset):
        return {k: v.value for k, v in result.asset_materializations_for_node(asset)[0].metadata.items()}

    found = {
        f"{a.key.to_user_string()}[{source}]": values(result, a.key.to_user_string())
        for source, result in per_source.items()
        for a in PER_SOURCE_ASSETS
    }
    return found | {a.key.to_user_string(): values(tail, a.key.to_user_string()) for a in TAIL_ASSETS}

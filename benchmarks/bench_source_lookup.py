"""`source_lookup`: every source's newest validated_images materialization in a 200-source instance,
in the two queries `latest_by_partition` makes, against a lookup per source (goal <= 0.2).

What `training_set` does to find what it selects from, and what each validated_images materialization
does to say which sources show a contact sheet: with a query per source both grew with the number of
sources, on every run. Real SQLite instance (Dagster's default storage); each source materialized
twice, so the newest must be picked out of its history. Both lookups must find the same records.
ratio = batched seconds / per-source seconds, the best of 3 rounds each.
"""

from __future__ import annotations

import time

from dagster import AssetMaterialization, instance_for_test

from zero_assets.launch.upstream import latest_by_partition, latest_materializations

from .report import BenchResult

SOURCES, MATERIALIZATIONS, ROUNDS, ASSET = 200, 2, 3, "validated_images"


def run() -> list[BenchResult]:
    names = [f"source_{n:04d}" for n in range(SOURCES)]
    with instance_for_test() as instance:
        for round_ in range(MATERIALIZATIONS):
            for name in names:
                instance.report_runless_asset_event(
                    AssetMaterialization(asset_key=ASSET, partition=name, metadata={"round": round_})
                )
        per_source_s, batched_s = [], []
        for _ in range(ROUNDS):
            started = time.perf_counter()
            one_by_one = {name: latest_materializations(instance, ASSET, name)[0].storage_id for name in names}
            per_source_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            batched = {name: record.storage_id for name, record in latest_by_partition(instance, ASSET, names).items()}
            batched_s.append(time.perf_counter() - started)
            if batched != one_by_one:
                raise RuntimeError("the batched lookup found other records than the lookup per source")
    return [
        BenchResult(
            "source_lookup",
            min(batched_s) / min(per_source_s),
            "<=0.2",
            {"sources": SOURCES, "per_source_s": min(per_source_s), "batched_s": min(batched_s)},
        )
    ]

"""`source_refresh`: 1% new images land in one of 10 sources; the time until the training set is refreshed,
over the full first run up to the training set (goal <= 0.1).

Both are measured the way automation runs them, through Dagster on a real instance: the first run
materializes every source's partition (index, validation, shards) and then `training_set`; the refresh
materializes the changed source's partition, then `training_set`. The other nine sources are not
touched, and inside the changed source only the new images are decoded and packed.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from dagster import instance_for_test, materialize

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS, TAIL_ASSETS, training_set
from zero_assets.defs.partitions import RAW_SOURCES

from .images import photo_jpeg
from .report import BenchResult
from .small_images import add_small_images

SOURCES, IMAGES_PER_SOURCE, ADDED_FRACTION = 10, 1000, 0.01
EVERYTHING = [*SOURCE_SPECS, *PER_SOURCE_ASSETS, *TAIL_ASSETS]


def _refresh(sources: list[str], resources, instance) -> tuple[float, dict[str, str]]:
    """Materialize the sources' partitions, then the training set; wall seconds and each step's cache verdict."""
    started = time.perf_counter()
    caches = {}
    for source in sources:
        result = materialize(
            EVERYTHING, selection=PER_SOURCE_ASSETS, partition_key=source, resources=resources, instance=instance
        )
        for asset in PER_SOURCE_ASSETS:
            name = asset.key.to_user_string()
            caches[f"{name}[{source}]"] = result.asset_materializations_for_node(name)[0].metadata["cache"].value
    result = materialize(EVERYTHING, selection=[training_set], resources=resources, instance=instance)
    caches["training_set"] = result.asset_materializations_for_node("training_set")[0].metadata["cache"].value
    return time.perf_counter() - started, caches


def _data_version(instance) -> str:
    event = instance.get_latest_materialization_event(training_set.key)
    return event.asset_materialization.tags["dagster/data_version"]


def run() -> list[BenchResult]:
    base = photo_jpeg(seed=3, megapixels=0.3)
    sources = [f"camera_{n:02d}" for n in range(SOURCES)]
    with tempfile.TemporaryDirectory(prefix="zero-bench-refresh-") as tmp, instance_for_test(temp_dir=tmp) as instance:
        root = Path(tmp)
        for source in sources:
            add_small_images(root / "raw", source, 0, IMAGES_PER_SOURCE, pictures=[base])
        (root / "fsx").mkdir()
        settings = ZeroSettings(raw_uri=str(root / "raw"), lake_uri=str(root / "lake"), fsx_mount=str(root / "fsx"))
        resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
        instance.add_dynamic_partitions(RAW_SOURCES.name, sources)
        full_s, _ = _refresh(sources, resources, instance)
        version_before = _data_version(instance)
        added = int(SOURCES * IMAGES_PER_SOURCE * ADDED_FRACTION)
        add_small_images(root / "raw", sources[3], IMAGES_PER_SOURCE, added, pictures=[base])
        refresh_s, caches = _refresh([sources[3]], resources, instance)
        version_after = _data_version(instance)
    if version_before == version_after:
        raise RuntimeError("the training set's data version did not change after new images arrived")
    if "hit" in caches.values():
        raise RuntimeError(f"the changed source was not rebuilt: {caches}")
    return [
        BenchResult(
            "source_refresh",
            refresh_s / full_s,
            "<=0.1",
            {
                "full_s": full_s,
                "refresh_s": refresh_s,
                "sources": SOURCES,
                "images": SOURCES * IMAGES_PER_SOURCE,
                "added": added,
                "refresh_s_per_new_image": refresh_s / added,
            },
        )
    ]

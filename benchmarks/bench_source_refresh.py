"""`source_refresh`: 1% new images land in one of 10 sources; the time until the training set is refreshed,
over the full first run up to the training set (goal <= 0.1).

Both are measured the way automation runs them, through Dagster on a real instance: the first run
materializes every source's partition (index, validation, shards) and then `training_set`; the refresh
materializes the changed source's partition, then `training_set`. The other nine sources are not
touched, and inside the changed source only the new images are decoded and packed.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from dagster import instance_for_test, materialize

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS, TAIL_ASSETS, training_set
from zero_assets.defs.partitions import RAW_SOURCES

from .images import photo_jpeg, unique_copy
from .report import BenchResult

SOURCES, IMAGES_PER_SOURCE, ADDED_FRACTION = 10, 1000, 0.01
EVERYTHING = [*SOURCE_SPECS, *PER_SOURCE_ASSETS, *TAIL_ASSETS]


def _add_images(raw: Path, source: str, base: bytes, start: int, count: int) -> None:
    """`count` unique JPEGs in lots of 50, each with one box, appended to the source's annotations.json."""
    folder = raw / source
    annotations = folder / "annotations.json"
    coco = (
        json.loads(annotations.read_text())
        if annotations.is_file()
        else {"images": [], "annotations": [], "categories": [{"id": 1, "name": "part"}]}
    )
    for n in range(start, start + count):
        name = f"lot_{n // 50:03d}/img_{n:05d}.jpg"
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(unique_copy(base, f"{source} image {n}"))
        image_id = len(coco["images"]) + 1
        coco["images"].append({"id": image_id, "file_name": name, "width": 640, "height": 480})
        coco["annotations"].append({"id": image_id, "image_id": image_id, "category_id": 1, "bbox": [10, 10, 120, 90]})
    annotations.write_text(json.dumps(coco))


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
            _add_images(root / "raw", source, base, 0, IMAGES_PER_SOURCE)
        (root / "fsx").mkdir()
        settings = ZeroSettings(raw_uri=str(root / "raw"), lake_uri=str(root / "lake"), fsx_mount=str(root / "fsx"))
        resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
        instance.add_dynamic_partitions(RAW_SOURCES.name, sources)
        full_s, _ = _refresh(sources, resources, instance)
        version_before = _data_version(instance)
        added = int(SOURCES * IMAGES_PER_SOURCE * ADDED_FRACTION)
        _add_images(root / "raw", sources[3], base, IMAGES_PER_SOURCE, added)
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

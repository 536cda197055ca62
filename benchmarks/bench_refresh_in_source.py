"""`refresh_in_source`: 1% new images in one 10,000-image source, against a full re-run of that same
source (goal <= 0.1).

Both through the real graph on a real Dagster instance, as automation runs a source: its partition's
`raw_image_index` and `validated_images` (local backend: the index in its step, validation as its job
process). The source is 10,000 photo-like 0.3-MP JPEGs (~91 KB, the size `source_refresh` uses; a
strict decode takes a few ms). After a first run, 100 new images land and annotations.json names them:
the refresh runs the source again on the same instance and lake, so its index is rebuilt (it is a
listing) and validation decodes only the new images, reusing the earlier verdicts. The full re-run is
the same source, all 10,100 images, on a fresh instance and lake: nothing to reuse. The page cache is
warm for both (the first run read every file). ratio = refresh seconds / full re-run seconds.

The refresh's seconds are also split by where they go (`refresh_*_s`), from the run's step events and
the job's own timings: Dagster's run around the steps, the index step, the validation step outside its
job, the job's process outside its pass (interpreter, imports, Pipes, exit) and the pass itself. The
first and the fourth are no work of the refresh's: `refresh_fixed_share` is their sum over the full
re-run, a floor no faster pass or index can go under with a fresh job process per step.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from dagster import DagsterEventType, DagsterInstance, instance_for_test, materialize

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS
from zero_assets.defs.partitions import RAW_SOURCES

from .report import BenchResult
from .small_images import add_small_images, linked_source, small_pictures, small_source

IMAGES, ADDED_FRACTION, MEGAPIXELS, SOURCE = 10_000, 0.01, 0.3, "cam"


def _source_run(raw: Path, work: Path, instance: DagsterInstance) -> tuple[float, dict]:
    """Materialize the source's index and validation; wall seconds and validated_images's metadata,
    with the seconds each step took (`<step>_step_s`) added."""
    (work / "fsx").mkdir(parents=True, exist_ok=True)
    settings = ZeroSettings(raw_uri=str(raw), lake_uri=str(work / "lake"), fsx_mount=str(work / "fsx"))
    resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
    if not instance.has_dynamic_partition(RAW_SOURCES.name, SOURCE):
        instance.add_dynamic_partitions(RAW_SOURCES.name, [SOURCE])
    started = time.perf_counter()
    result = materialize(
        [*SOURCE_SPECS, *PER_SOURCE_ASSETS],
        selection=PER_SOURCE_ASSETS,
        partition_key=SOURCE,
        resources=resources,
        instance=instance,
    )
    elapsed = time.perf_counter() - started
    if not result.success:
        raise RuntimeError(f"the run of source {SOURCE!r} in {work} failed")
    metadata = result.asset_materializations_for_node("validated_images")[0].metadata
    return elapsed, {name: value.value for name, value in metadata.items()} | _step_seconds(instance, result.run_id)


def _step_seconds(instance: DagsterInstance, run_id: str) -> dict[str, float]:
    """Each step's seconds, from its STEP_START to its STEP_SUCCESS event."""
    events = instance.all_logs(run_id, of_type={DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS})
    started = {e.step_key: e.timestamp for e in events if e.dagster_event_type == DagsterEventType.STEP_START}
    return {
        f"{e.step_key}_step_s": e.timestamp - started[e.step_key]
        for e in events
        if e.dagster_event_type == DagsterEventType.STEP_SUCCESS
    }


def where_the_refresh_goes(refresh_s: float, refresh: dict) -> dict[str, float]:
    """The refresh's seconds by part (see the module docstring); the parts add up to `refresh_s`."""
    index_s, validation_s = refresh["raw_image_index_step_s"], refresh["validated_images_step_s"]
    job_s, pass_s = refresh["job_wall_s"], refresh["validate_wall_s"]
    return {
        "refresh_dagster_s": refresh_s - index_s - validation_s,
        "refresh_index_step_s": index_s,
        "refresh_step_outside_job_s": validation_s - job_s,
        "refresh_job_outside_pass_s": job_s - pass_s,
        "refresh_pass_s": pass_s,
    }


def _expect(metadata: dict, accepted: int, decoded: int, run: str) -> None:
    got = {name: metadata.get(name) for name in ("cache", "accepted", "decoded")}
    if got != {"cache": "miss", "accepted": accepted, "decoded": decoded}:
        raise RuntimeError(f"the {run} was to decode {decoded} images and accept {accepted}; its validation: {got}")


def run() -> list[BenchResult]:
    cached, _ = small_source(SOURCE, IMAGES, MEGAPIXELS)
    added = int(IMAGES * ADDED_FRACTION)
    with tempfile.TemporaryDirectory(prefix="bench-refresh-in-source-") as tmp:
        raw = Path(tmp) / "raw"
        linked_source(cached, SOURCE, raw)
        for home in ("dagster", "dagster-full"):
            (Path(tmp) / home).mkdir()
        with instance_for_test(temp_dir=str(Path(tmp) / "dagster")) as instance:
            first_s, first = _source_run(raw, Path(tmp) / "refreshed", instance)
            _expect(first, IMAGES, IMAGES, "first run")
            add_small_images(raw, SOURCE, IMAGES, added, small_pictures(MEGAPIXELS))
            refresh_s, refresh = _source_run(raw, Path(tmp) / "refreshed", instance)
            _expect(refresh, IMAGES + added, added, "refresh")
        with instance_for_test(temp_dir=str(Path(tmp) / "dagster-full")) as instance:
            full_s, full = _source_run(raw, Path(tmp) / "full", instance)
            _expect(full, IMAGES + added, IMAGES + added, "full re-run")
    parts = where_the_refresh_goes(refresh_s, refresh)
    fixed_s = parts["refresh_dagster_s"] + parts["refresh_job_outside_pass_s"]
    return [
        BenchResult(
            "refresh_in_source",
            refresh_s / full_s,
            "<=0.1",
            {
                "full_s": full_s,
                "refresh_s": refresh_s,
                "first_run_s": first_s,
                "images": IMAGES,
                "added": added,
                "megapixels": MEGAPIXELS,
                "full_job_s": full["job_wall_s"],
                "refresh_job_s": refresh["job_wall_s"],
                **parts,
                "refresh_fixed_share": fixed_s / full_s,
            },
        )
    ]

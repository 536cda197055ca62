"""`refresh_scaling`: the same refresh (100 new images) of a 40,000-image source against a 10,000-image one.

Through the graph, each after its own full first run; the median of three refreshes a source.
"""

from __future__ import annotations

import statistics
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

SMALL, LARGE, ADDED, REFRESHES, SOURCE = 10_000, 40_000, 100, 3, "cam"


def source_run(raw: Path, work: Path, instance: DagsterInstance) -> tuple[float, dict]:
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
    """The refresh's seconds by part: Dagster's run around the steps, the index step, the validation step
    outside its job, the job's process outside its pass (interpreter, imports, Pipes, exit), the pass."""
    index_s, validation_s = refresh["raw_image_index_step_s"], refresh["validated_images_step_s"]
    job_s, pass_s = refresh["job_wall_s"], refresh["validate_wall_s"]
    return {
        "dagster_s": refresh_s - index_s - validation_s,
        "index_step_s": index_s,
        "step_outside_job_s": validation_s - job_s,
        "job_outside_pass_s": job_s - pass_s,
        "pass_s": pass_s,
    }


def _expect(metadata: dict, accepted: int, decoded: int, run: str) -> None:
    got = {name: metadata.get(name) for name in ("cache", "accepted", "decoded")}
    if got != {"cache": "miss", "accepted": accepted, "decoded": decoded}:
        raise RuntimeError(f"the {run} was to decode {decoded} images and accept {accepted}; its validation: {got}")


def refresh_seconds(images: int) -> tuple[float, dict[str, float]]:
    """The median of REFRESHES refreshes of a source of `images` after its full first run: seconds, and
    where that refresh's seconds went."""
    cached, _ = small_source(SOURCE, images)
    refreshes = []
    with tempfile.TemporaryDirectory(prefix="bench-refresh-scaling-") as tmp:
        raw = Path(tmp) / "raw"
        linked_source(cached, SOURCE, raw)
        with instance_for_test(temp_dir=tmp) as instance:
            _, first = source_run(raw, Path(tmp) / "work", instance)
            _expect(first, images, images, "first run")
            for n in range(REFRESHES):
                add_small_images(raw, SOURCE, images + n * ADDED, ADDED, small_pictures())
                seconds, refresh = source_run(raw, Path(tmp) / "work", instance)
                _expect(refresh, images + (n + 1) * ADDED, ADDED, "refresh")
                refreshes.append((seconds, where_the_refresh_goes(seconds, refresh)))
    return statistics.median_low(refreshes)


def run() -> list[BenchResult]:
    small_s, small_parts = refresh_seconds(SMALL)
    large_s, large_parts = refresh_seconds(LARGE)
    parts = {f"small_{k}": v for k, v in small_parts.items()} | {f"large_{k}": v for k, v in large_parts.items()}
    per_row_us = (large_s - small_s) / (LARGE - SMALL) * 1e6
    return [
        BenchResult(
            "refresh_scaling",
            large_s / small_s,
            "<=1.2",
            {"small_s": small_s, "large_s": large_s, "refresh_per_row_us": per_row_us, **parts},
        )
    ]

"""`noop_rematerialize`: wall time of materializing the whole graph again with nothing changed, over
the first materialization of the same graph on the same raw root (goal <= 0.1).

The second run must launch no job: every asset finds its earlier output by input fingerprint. The
graph runs as `make demo` runs it: each source's assets in a run of their own, then the tail.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from dagster import instance_for_test, materialize

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import PER_SOURCE_ASSETS, SOURCE_SPECS, TAIL_ASSETS
from zero_assets.defs.change_detection.raw_sources import list_sources
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.ops.demo_data import make_demo_raw_root

from .report import BenchResult

TRAINING = {"ops": {"trained_checkpoint": {"config": {"max_steps": 40, "checkpoint_every": 20}}}}


def _caches(result, assets, suffix: str = "") -> dict[str, str]:
    return {
        f"{a.key.to_user_string()}{suffix}": result.asset_materializations_for_node(a.key.to_user_string())[0]
        .metadata["cache"]
        .value
        for a in assets
    }


def _timed(resources, instance) -> tuple[float, dict[str, str]]:
    everything = [*SOURCE_SPECS, *PER_SOURCE_ASSETS, *TAIL_ASSETS]
    sources = list_sources(resources["settings"].raw_uri)
    instance.add_dynamic_partitions(RAW_SOURCES.name, sources)
    started = time.perf_counter()
    caches: dict[str, str] = {}
    for source in sources:
        result = materialize(
            everything, selection=PER_SOURCE_ASSETS, partition_key=source, resources=resources, instance=instance
        )
        caches |= _caches(result, PER_SOURCE_ASSETS, f"[{source}]")
    result = materialize(everything, selection=TAIL_ASSETS, resources=resources, instance=instance, run_config=TRAINING)
    wall = time.perf_counter() - started
    return wall, caches | _caches(result, TAIL_ASSETS)


def run() -> list[BenchResult]:
    with tempfile.TemporaryDirectory(prefix="zero-bench-noop-") as tmp, instance_for_test(temp_dir=tmp) as instance:
        root = Path(tmp)
        make_demo_raw_root(root / "raw", images=120, seed=5)
        (root / "fsx").mkdir()
        settings = ZeroSettings(raw_uri=str(root / "raw"), lake_uri=str(root / "lake"), fsx_mount=str(root / "fsx"))
        resources = {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
        first, _ = _timed(resources, instance)
        second, caches = _timed(resources, instance)
    if set(caches.values()) != {"hit"}:
        raise RuntimeError(f"the second materialization was not all cache hits: {caches}")
    return [BenchResult("noop_rematerialize", second / first, "<=0.1", {"first_s": first, "second_s": second})]

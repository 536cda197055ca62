"""`run_overhead`: the share of a 20,000-image source run spent outside the jobs (goal <= 0.25).

One source of 20,000 small JPEGs, its run as a user or the automation starts it: `dagster asset
materialize --select raw_image_index,validated_images --partition SOURCE -m zero_assets.definitions`
on a fresh instance and lake, through the code location's executor. The run is Dagster's own record of
it (RUN_START to its end, as the UI shows it); the jobs are the validation job's process (its
`job_wall_s`, interpreter start included) and the index, which runs in the step for a source this size
(its step, STEP_START to STEP_SUCCESS). ratio = (run - jobs) / run: Dagster's executor and step
starts, the asset check's step, events, and the project's own launch work (fingerprints, the lease,
the output marker).

The same run is also timed with the executor forced to what a run that cannot take the in-process
path uses (step workers forked from a forkserver with the code location loaded) and to Dagster's
default (`spawn`: a fresh interpreter a step), for the README's "which is better".
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from dagster import AssetKey, DagsterEventType, DagsterInstance, EventRecordsFilter

from zero_assets.defs.executor import step_worker_preload
from zero_assets.defs.partitions import RAW_SOURCES

from .report import BenchResult
from .scripts import REPO, run_script
from .small_images import small_source

IMAGES, SOURCE = 20_000, "cam"
SELECTION = "raw_image_index,validated_images"


def _step_seconds(instance: DagsterInstance, run_id: str, step: str) -> float:
    times = {}
    for kind in (DagsterEventType.STEP_START, DagsterEventType.STEP_SUCCESS):
        records = instance.get_event_records(EventRecordsFilter(event_type=kind))
        (times[kind],) = [
            r.event_log_entry.timestamp
            for r in records
            if r.event_log_entry.run_id == run_id and r.event_log_entry.step_key == step
        ]
    return times[DagsterEventType.STEP_SUCCESS] - times[DagsterEventType.STEP_START]


def source_run(raw: Path, work: Path, name: str, start_method: dict | None) -> dict[str, float]:
    """One run of the source on a fresh instance and lake: its seconds in and outside the jobs."""
    home, lake = work / name / "dagster_home", work / name / "lake"
    home.mkdir(parents=True)
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    (work / name / "fsx").mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("ZERO_", "DAGSTER_"))},
        "DAGSTER_HOME": str(home),
        "ZERO_RAW_URI": str(raw),
        "ZERO_LAKE_URI": str(lake),
        "ZERO_FSX_MOUNT": str(work / name / "fsx"),
        "ZERO_BACKEND": "local",
    }
    with DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(RAW_SOURCES.name, [SOURCE])
        command = [str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "--select", SELECTION]
        command += ["--partition", SOURCE, "-m", "zero_assets.definitions"]
        if start_method is not None:
            forced = {"execution": {"config": {"multiprocess": {"start_method": start_method(instance)}}}}
            command += ["--config-json", json.dumps(forced)]
        started = time.perf_counter()
        run_script(command, f"the source run ({name})", env=env)
        cli_s = time.perf_counter() - started
        (record,) = instance.get_run_records()
        run_s = record.end_time - record.start_time
        validated = instance.get_latest_materialization_event(AssetKey("validated_images")).asset_materialization
        if validated.metadata["accepted"].value != IMAGES or validated.metadata["cache"].value != "miss":
            raise RuntimeError(f"the run ({name}) did not validate every image: {validated.metadata}")
        jobs_s = validated.metadata["job_wall_s"].value + _step_seconds(
            instance, record.dagster_run.run_id, "raw_image_index"
        )
    return {"run_s": run_s, "jobs_s": jobs_s, "outside_s": run_s - jobs_s, "cli_s": cli_s}


def run() -> list[BenchResult]:
    variants = {
        "project": None,
        "forkserver": lambda instance: {"forkserver": {"preload_modules": step_worker_preload(instance)}},
        "spawn": lambda instance: {"spawn": {}},
    }
    with tempfile.TemporaryDirectory(prefix="bench-run-overhead-") as tmp:
        work = Path(tmp)
        raw, _ = small_source(SOURCE, IMAGES)
        runs = {name: source_run(raw, work, name, start_method) for name, start_method in variants.items()}
    project = runs["project"]
    return [
        BenchResult(
            "run_overhead",
            project["outside_s"] / project["run_s"],
            "<=0.25",
            {
                "run_s": project["run_s"],
                "jobs_s": project["jobs_s"],
                "outside_s": project["outside_s"],
                "cli_s": project["cli_s"],
                "images": IMAGES,
                **{f"{name}_outside_s": runs[name]["outside_s"] for name in ("forkserver", "spawn")},
                **{f"{name}_share": runs[name]["outside_s"] / runs[name]["run_s"] for name in ("forkserver", "spawn")},
            },
        )
    ]

"""A run's cost as `zero/*` run tags, when it ends: the cost metadata of its materializations (map stages too,
cache hits not) and final step failures; retried failures keep none, so `zero/cost_note` counts them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    DagsterEventType,
    DagsterRunStatus,
    DefaultSensorStatus,
    EventLogEntry,
    RunStatusSensorContext,
    SensorDefinition,
    run_status_sensor,
)

from zero_assets.backends.job_cost import COST_NOTE, COST_USD, INSTANCE_SECONDS, SPOT_SAVINGS_USD

TAG_PREFIX = "zero/"
STAGES = ("", "map_")  # a fanned-out materialization carries its map job's cost under map_ keys
COUNTED = {DagsterEventType.ASSET_MATERIALIZATION, DagsterEventType.STEP_FAILURE, DagsterEventType.STEP_UP_FOR_RETRY}


@dataclass
class RunCost:
    jobs: int = 0
    instance_seconds: float = 0.0
    usd: float = 0.0
    priced: int = 0
    spot_savings_usd: float = 0.0
    unpriced: dict[str, str] = field(default_factory=dict)  # step or asset -> why it has no price
    retried_failures: int = 0

    def add(self, where: str, metadata: Mapping[str, Any]) -> None:
        if metadata.get("cache") == "hit":
            return  # repeats the metadata of the run that paid for the job
        for stage in STAGES:
            if f"{stage}{INSTANCE_SECONDS}" not in metadata and f"{stage}{COST_NOTE}" not in metadata:
                continue  # no job behind this stage
            self.jobs += 1
            self.instance_seconds += float(metadata.get(f"{stage}{INSTANCE_SECONDS}", 0.0))
            if f"{stage}{COST_USD}" in metadata:
                self.priced += 1
                self.usd += float(metadata[f"{stage}{COST_USD}"])
                self.spot_savings_usd += float(metadata.get(f"{stage}{SPOT_SAVINGS_USD}", 0.0))
            else:
                self.unpriced[f"{where}{' (map)' if stage else ''}"] = str(
                    metadata.get(f"{stage}{COST_NOTE}", "no price recorded")
                )

    def tags(self) -> dict[str, str]:
        tags = {"jobs": str(self.jobs), "instance_seconds": f"{self.instance_seconds:.0f}"}
        if self.priced or not self.jobs:
            tags["estimated_cost_usd"] = f"{self.usd:.2f}"
        if self.spot_savings_usd > 0:
            tags["spot_savings_usd"] = f"{self.spot_savings_usd:.2f}"
        notes = []
        if self.unpriced:
            reasons = "; ".join(sorted(set(self.unpriced.values())))
            unpriced = ", ".join(sorted(self.unpriced))
            notes.append(f"{len(self.unpriced)} of {self.jobs} jobs not priced ({unpriced}): {reasons}")
        if self.retried_failures:
            notes.append(
                f"{self.retried_failures} step attempts failed and were retried: "
                "a retry keeps no metadata, so a job behind one is not counted"
            )
        if notes:
            tags["cost_note"] = " | ".join(notes)[:4000]
        return {f"{TAG_PREFIX}{key}": value for key, value in tags.items()}


def run_cost(entries: Iterable[EventLogEntry]) -> RunCost:
    """The cost of the jobs behind these events of one run."""
    total = RunCost()
    for entry in entries:
        event = entry.dagster_event
        if event is None:
            continue
        if event.event_type == DagsterEventType.ASSET_MATERIALIZATION:
            materialization = event.step_materialization_data.materialization
            where = materialization.asset_key.to_user_string() + (
                f"[{materialization.partition}]" if materialization.partition else ""
            )
            total.add(where, {key: value.value for key, value in materialization.metadata.items()})
        elif event.event_type == DagsterEventType.STEP_FAILURE:
            failure = event.step_failure_data.user_failure_data
            if failure is not None:
                total.add(event.step_key or "?", {key: value.value for key, value in failure.metadata.items()})
        elif event.event_type == DagsterEventType.STEP_UP_FOR_RETRY:
            total.retried_failures += 1
    return total


def _cost_sensor(status: DagsterRunStatus) -> SensorDefinition:
    @run_status_sensor(
        run_status=status,
        name=f"run_cost_on_{status.value.lower()}",
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            f"tags each {status.value.lower()} run with what its jobs cost "
            "(zero/estimated_cost_usd, zero/instance_seconds)"
        ),
    )
    def cost_sensor(context: RunStatusSensorContext) -> None:
        run_id = context.dagster_run.run_id
        tags = run_cost(context.instance.all_logs(run_id, of_type=COUNTED)).tags()
        context.instance.add_run_tags(run_id, tags)
        context.log.info(f"run {run_id}: {tags}")

    return cost_sensor


run_cost_sensors = [
    _cost_sensor(status) for status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED)
]

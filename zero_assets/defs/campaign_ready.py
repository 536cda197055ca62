"""`campaign_ready`: a blocking check on `fsx_warm_state` of what is not ready for the Training Plan (training
set, warm state, rehearsal, preflight), with the time left and the warm lead time; ERROR with a plan, else WARN.
Its sensor runs it every half hour while the plan waits to start."""

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetSelection,
    DagsterEventType,
    DagsterInstance,
    DefaultSensorStatus,
    EventLogRecord,
    MetadataValue,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    asset_check,
    define_asset_job,
    sensor,
)

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.training_plan import WAITING, utc_now
from zero_assets.core.output_marker import output_is_checkable, output_is_complete
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import fsx_warm_state
from zero_assets.defs.assets.trained_checkpoint import TrainConfig
from zero_assets.defs.rehearsal_gate import training_gate
from zero_assets.defs.training_plan_start import chosen_training_set, not_built_from, version_of
from zero_assets.launch.upstream import latest_materializations

READY_CHECK = "campaign_ready"
WARM_STATE = fsx_warm_state.key
MEASURED_LOOK_BACK = 10  # warm materializations searched for one that warmed something, newest first
READINESS_EVERY_S = 1800


@dataclass(frozen=True)
class Item:
    what: str
    ready: bool
    detail: str


@dataclass(frozen=True)
class LeadTime:
    """The time to warm `set_bytes` from cold at the rate measured on one warm materialization."""

    set_bytes: int
    warmed_bytes: int
    wall_s: float
    run_id: str

    @property
    def seconds(self) -> float:
        return self.set_bytes * self.wall_s / self.warmed_bytes

    def text(self) -> str:
        rate = self.warmed_bytes / self.wall_s / 1e6
        return (
            f"warm lead time ~{_duration(self.seconds)}: {self.set_bytes / 1e9:.2f} GB at {rate:.1f} MB/s, measured "
            f"on run {self.run_id} ({self.warmed_bytes / 1e9:.2f} GB warmed in {_duration(self.wall_s)})"
        )


@asset_check(
    asset=fsx_warm_state,
    blocking=True,
    description="ready for the Training Plan: warm state of the chosen training set, a passed rehearsal, the "
    "checks and the preflight; the time left and the warm lead time",
)
def campaign_ready(context: AssetCheckExecutionContext, settings: ZeroSettings, jobs: JobRunner) -> AssetCheckResult:
    instance, now = context.instance, utc_now()
    # The code location's whole graph, not the job's (a run of this check alone holds one asset).
    graph = context.op_execution_context.job_def.asset_layer.asset_graph
    graph = getattr(graph, "source_asset_graph", graph)
    plan = jobs.training_plan()
    chosen, refused = chosen_training_set(instance, graph)
    items = [
        Item(
            "training set",
            chosen is not None,
            f"{version_of(chosen)[:16]}, its blocking checks passed"
            if chosen
            else f"none passed its blocking checks ({'; '.join(refused) or 'training_set has no materialization'})",
        )
    ]
    warm = next(iter(latest_materializations(instance, WARM_STATE)), None)
    items += warm_items(instance, graph, warm, chosen)
    default = TrainConfig()
    tracking = default.tracking("0" * 16)
    gate = training_gate(instance, jobs, default.module, default.hyperparameters(), tracking)
    items.append(Item("rehearsal", gate.passed or not gate.enforced, gate.summary()))
    items += [Item(f"preflight: {f.check}", f.ok, f.detail) for f in jobs.preflight(settings, tracking)]
    lead = lead_time(instance, warm)
    waiting = [item for item in items if not item.ready]
    if plan is None:
        when = "no Training Plan configured (ZERO_SM_TRAINING_PLAN_ARN)"
    elif plan.start is None:
        when = f"training plan {plan.name} is {plan.status}, not scheduled yet"
    else:
        left = (plan.start - now).total_seconds()
        when = (
            f"training plan {plan.name} starts in {_duration(left)} ({plan.window()})"
            if left > 0
            else f"training plan {plan.name} is {plan.status} since {_duration(-left)} ago ({plan.window()})"
        )
        if lead is not None and not all(i.ready for i in items if i.what == "warm state") and lead.seconds > left:
            waiting.append(Item("warm lead time", False, f"{lead.text()}, more than the time left: warm it now"))
    summary = (
        f"{when}; not ready: " + "; ".join(f"{i.what}: {i.detail}" for i in waiting) if waiting else f"{when}; ready"
    )
    metadata: dict[str, Any] = {
        "not_ready": [i.what for i in waiting],
        "items": MetadataValue.md(
            "| | ready | |\n|---|---|---|\n"
            + "\n".join(f"| {i.what} | {'yes' if i.ready else 'NO'} | {i.detail} |" for i in items)
        ),
    }
    if plan is not None and plan.start is not None:
        metadata["time_left_s"] = round((plan.start - now).total_seconds())
    if lead is not None:
        metadata.update(warm_lead_time_s=round(lead.seconds), warm_lead_time=lead.text())
    return AssetCheckResult(
        passed=not waiting,
        severity=AssetCheckSeverity.ERROR if plan is not None else AssetCheckSeverity.WARN,
        description=summary + (f"; {lead.text()}" if lead else "; no measured warm yet for a lead time"),
        metadata=metadata,
    )


def warm_items(instance: DagsterInstance, graph, warm: EventLogRecord | None, chosen: EventLogRecord | None) -> list:
    """Whether all between the chosen set and training was built from it and passed, and the warm output is complete."""
    if warm is None:
        return [Item("warm state", False, "fsx_warm_state has no materialization: materialize it")]
    if chosen is None:
        return [Item("warm state", False, "no training set passed its checks, so none can be warm")]
    stale = not_built_from(instance, _WithoutCheck(graph, READY_CHECK), chosen)
    if stale:
        names = ", ".join(key.to_user_string() for key in stale)
        return [
            Item(
                "warm state",
                False,
                f"{names}: the latest materialization is not built from training set {version_of(chosen)[:16]} or "
                "failed a blocking check; materialize them",
            )
        ]
    uri = str(warm.asset_materialization.metadata["dagster/uri"].value)
    fingerprint = warm.asset_materialization.metadata.get("fingerprint")
    if output_is_checkable(uri) and not (fingerprint and output_is_complete(uri, str(fingerprint.value))):
        return [Item("warm state", False, f"{uri} is missing or incomplete: materialize fsx_warm_state again")]
    seen = "verified" if output_is_checkable(uri) else "verified by its warm job"
    return [
        Item("warm state", True, f"{uri}, {_count(warm, 'shards')} shards, {seen} (run {warm.run_id})"),
        Item("checks", True, "every blocking check from the training set to the warm state passed"),
    ]


def lead_time(instance: DagsterInstance, latest: EventLogRecord | None) -> LeadTime | None:
    """The latest warm state's bytes at the rate of the newest warm that was not a cache hit."""
    if latest is None:
        return None
    set_bytes = _count(latest, "dagster/size_bytes")
    for record in latest_materializations(instance, WARM_STATE, limit=MEASURED_LOOK_BACK):
        metadata = record.asset_materialization.metadata
        if metadata.get("cache") is not None and metadata["cache"].value == "hit":
            continue
        warmed = (
            _count(record, "copied_bytes") or _count(record, "verified_bytes") or _count(record, "dagster/size_bytes")
        )
        started = _step_start(instance, record)
        if warmed and started is not None and record.timestamp > started and set_bytes:
            return LeadTime(set_bytes, warmed, record.timestamp - started, record.run_id)
    return None


class _WithoutCheck:
    """The asset graph less one check, so this check never judges itself."""

    def __init__(self, graph, name: str) -> None:
        self._graph, self._name = graph, name

    def get_check_keys_for_assets(self, keys):
        return {key for key in self._graph.get_check_keys_for_assets(keys) if key.name != self._name}

    def __getattr__(self, name: str):
        return getattr(self._graph, name)


def _step_start(instance: DagsterInstance, record: EventLogRecord) -> float | None:
    starts = [
        entry.timestamp
        for entry in instance.all_logs(record.run_id, of_type=DagsterEventType.STEP_START)
        if entry.step_key == WARM_STATE.to_user_string() and entry.timestamp <= record.timestamp
    ]
    return max(starts) if starts else None


def _count(record: EventLogRecord, key: str) -> int:
    value = record.asset_materialization.metadata.get(key)
    return int(value.value) if value is not None and value.value is not None else 0


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


campaign_readiness_job = define_asset_job(
    "campaign_readiness",
    selection=AssetSelection.checks(campaign_ready),
    description="the readiness check alone (campaign_ready), before a Training Plan starts",
)


@sensor(
    job=campaign_readiness_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="runs campaign_ready every half hour while the Training Plan (ZERO_SM_TRAINING_PLAN_ARN) waits",
)
def campaign_readiness_sensor(context: SensorEvaluationContext, jobs: JobRunner):
    plan = jobs.training_plan()
    if plan is None:
        return SkipReason("no Training Plan configured for trained_checkpoint (ZERO_SM_TRAINING_PLAN_ARN)")
    if plan.status not in WAITING:
        return SkipReason(f"training plan {plan.name} is {plan.status}: readiness is checked before it starts")
    # The run key dedupes ticks within a half hour.
    return RunRequest(
        run_key=f"readiness:{plan.name}:{int(time.time() // READINESS_EVERY_S)}",
        tags={"zero/trigger": "training plan waiting", "zero/training_plan": plan.name},
    )

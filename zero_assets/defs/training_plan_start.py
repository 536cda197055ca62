"""Start `trained_checkpoint` once per Training Plan window (the run key) when the plan turns Active, from the
latest training set whose blocking checks passed, first rebuilding what in between was not built from it."""

from __future__ import annotations

from dagster import (
    AssetCheckSeverity,
    AssetKey,
    AssetSelection,
    DagsterInstance,
    DefaultSensorStatus,
    EventLogRecord,
    RunRequest,
    SensorEvaluationContext,
    SkipReason,
    sensor,
)
from dagster._core.definitions.data_version import get_input_event_pointer_tag  # Dagster's provenance tag

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.training_plan import TrainingPlan
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.launch.upstream import latest_materializations

TRAINING_SET, TRAINED = AssetKey("training_set"), AssetKey("trained_checkpoint")
LOOK_BACK = 10  # training_set materializations looked at, newest first
CHECK_HISTORY = 50  # evaluations of one check searched for the one of a materialization
TICK_INTERVAL_S = 60


def blocking_failure(instance: DagsterInstance, asset_graph, record: EventLogRecord) -> str | None:
    """Why the materialization `record` did not pass its asset's blocking checks (None: it did)."""
    checks = sorted(
        (key for key in asset_graph.get_check_keys_for_assets({record.asset_key}) if asset_graph.get(key).blocking),
        key=lambda key: key.to_user_string(),
    )
    for check in checks:
        evaluation = None
        for execution in instance.event_log_storage.get_asset_check_execution_history(check, limit=CHECK_HISTORY):
            event = execution.event.dagster_event if execution.event else None
            target = getattr(event.event_specific_data, "target_materialization_data", None) if event else None
            if target is not None and target.storage_id == record.storage_id:
                evaluation = event.event_specific_data
                break
        if evaluation is None:
            return f"{check.to_user_string()} has not run on it"
        if not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR:
            return f"{check.to_user_string()} failed: {evaluation.description or 'no description'}"
    return None


def chosen_training_set(instance: DagsterInstance, asset_graph) -> tuple[EventLogRecord | None, list[str]]:
    """The newest training_set materialization whose blocking checks passed, and why each newer one did not."""
    refused = []
    for record in latest_materializations(instance, TRAINING_SET, limit=LOOK_BACK):
        problem = blocking_failure(instance, asset_graph, record)
        if problem is None:
            return record, refused
        refused.append(f"{version_of(record)[:16]}: {problem}")
    return None, refused


def start_request(instance: DagsterInstance, asset_graph, plan: TrainingPlan) -> RunRequest | SkipReason:
    """What a tick does about `plan`, as DescribeTrainingPlan read it."""
    if plan.status != "Active":
        when = f", starting {plan.window()}" if plan.status in ("Scheduled", "Pending") else ""
        return SkipReason(f"training plan {plan.name} is {plan.status}{when}: training starts when it is Active")
    record, refused = chosen_training_set(instance, asset_graph)
    if record is None:
        why = "; ".join(refused) or "training_set has no materialization"
        return SkipReason(
            f"training plan {plan.name} is Active, but no training set passed its blocking checks ({why})"
        )
    version = version_of(record)
    stale = not_built_from(instance, asset_graph, record)
    if stale and refused:  # not the latest
        return SkipReason(
            f"training plan {plan.name} is Active; training set {version[:16]} passed its checks, but it is not "
            f"the latest ({'; '.join(refused)}) and {', '.join(k.to_user_string() for k in stale)} were not "
            "built from it: fix the latest training set, or rebuild from this one"
        )
    return RunRequest(
        run_key=f"training-plan:{plan.name}:{plan.start:%Y%m%dT%H%M%SZ}",
        asset_selection=[*stale, TRAINED],
        tags={
            "zero/trigger": "training plan active",
            "zero/training_plan": plan.name,
            "zero/training_set": version[:16],
            "zero/rebuilt_first": ",".join(k.to_user_string() for k in stale) or "none",
        },
    )


def not_built_from(instance: DagsterInstance, asset_graph, chosen: EventLogRecord) -> list[AssetKey]:
    """The assets from training_set to trained_checkpoint not built from `chosen` or failing a check."""
    between = {
        key
        for key in asset_graph.get_ancestor_asset_keys(TRAINED)
        if TRAINING_SET in asset_graph.get_ancestor_asset_keys(key)
    }
    built_from = {TRAINING_SET: chosen.storage_id}  # asset -> the storage id of its materialization on the path
    stale = []
    for key in (k for k in asset_graph.toposorted_asset_keys if k in between):
        found = latest_materializations(instance, key)
        tags = (found[0].asset_materialization.tags or {}) if found else {}
        on_path = [parent for parent in asset_graph.get(key).parent_keys if parent in built_from or parent in between]
        if (
            found
            and all(tags.get(get_input_event_pointer_tag(p)) == str(built_from.get(p)) for p in on_path)
            and blocking_failure(instance, asset_graph, found[0]) is None
        ):
            built_from[key] = found[0].storage_id
        else:
            stale.append(key)
    return stale


def version_of(record: EventLogRecord) -> str:
    tags = record.asset_materialization.tags or {}
    return tags.get(DATA_VERSION_TAG, "(no data version)")


@sensor(
    target=AssetSelection.assets(TRAINED).upstream() - AssetSelection.assets(TRAINING_SET).upstream(),
    minimum_interval_seconds=TICK_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="starts trained_checkpoint when the Training Plan (ZERO_SM_TRAINING_PLAN_ARN) turns Active",
)
def training_plan_start_sensor(context: SensorEvaluationContext, jobs: JobRunner):
    plan = jobs.training_plan()
    if plan is None:
        return SkipReason("no Training Plan configured for trained_checkpoint (ZERO_SM_TRAINING_PLAN_ARN)")
    decision = start_request(context.instance, context.repository_def.asset_graph, plan)
    if isinstance(decision, RunRequest):
        context.log.info(
            f"training plan {plan.name} is Active ({plan.window()}): requesting "
            f"{', '.join(k.to_user_string() for k in decision.asset_selection)} "
            f"on training set {decision.tags['zero/training_set']}"
        )
    return decision

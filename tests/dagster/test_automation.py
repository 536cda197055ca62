"""Declarative Automation on a real instance: what the daemon's automation sensor would request, evaluated
tick by tick by `evaluate_automation_conditions` over events recorded as the runs would record them."""

import datetime as dt
import uuid

import pytest
from dagster import (
    AssetCheckEvaluation,
    AssetKey,
    AssetMaterialization,
    AssetRecordsFilter,
    evaluate_automation_conditions,
)
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationPlanned,
    AssetCheckEvaluationTargetMaterializationData,
)
from dagster._core.definitions.partitions.context import partition_loading_context
from dagster._core.events import DagsterEvent, DagsterEventType, StepMaterializationData

from zero_assets.definitions import defs
from zero_assets.defs.automation import DEFAULT_TRAIN_CRON, train_cron
from zero_assets.defs.partitions import RAW_SOURCES

PER_SOURCE = ("raw_image_index", "validated_images")
TAIL = ("training_set", "arrow_shards", "fsx_warm_state", "trained_checkpoint", "map_report")
CHECKS = {
    "validated_images": "quarantine_rate_under_limit",
    "arrow_shards": "shard_manifest_integrity",
    "fsx_warm_state": "campaign_ready",
}
DAY = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)


class Ticks:
    """The automation sensor's evaluations, one after another, with the cursor carried over."""

    def __init__(self, instance):
        self.instance, self.cursor = instance, None

    def at(self, when: dt.datetime) -> dict:
        result = evaluate_automation_conditions(
            defs=defs, instance=self.instance, cursor=self.cursor, evaluation_time=when
        )
        self.cursor = result.cursor
        requested = {a: sorted(result.get_requested_partitions(AssetKey(a))) for a in PER_SOURCE}
        return requested | {a: result.get_num_requested(AssetKey(a)) for a in TAIL}


def _materialized(instance, asset, source=None, version="v1", check_passed=True):
    """Record what a run materializing `asset` (of `source`) records: the materialization with its
    data version and, for a checked asset, its check planned and evaluated against that materialization
    in the same run (a per-source check for that source's partition)."""
    run_id = str(uuid.uuid4())
    materialization = AssetMaterialization(asset_key=asset, partition=source, tags={"dagster/data_version": version})
    _report(instance, run_id, DagsterEventType.ASSET_MATERIALIZATION, StepMaterializationData(materialization))
    if asset not in CHECKS:
        return
    with partition_loading_context(dynamic_partitions_store=instance):
        checked = RAW_SOURCES.subset_with_partition_keys([source]) if source else None
    planned = AssetCheckEvaluationPlanned(
        asset_key=AssetKey(asset), check_name=CHECKS[asset], partitions_subset=checked
    )
    _report(instance, run_id, DagsterEventType.ASSET_CHECK_EVALUATION_PLANNED, planned)
    filter_ = AssetRecordsFilter(asset_key=AssetKey(asset), asset_partitions=[source] if source else None)
    [target] = instance.fetch_materializations(filter_, limit=1).records
    evaluation = AssetCheckEvaluation(
        asset_key=AssetKey(asset),
        check_name=CHECKS[asset],
        passed=check_passed,
        partition=source,
        target_materialization_data=AssetCheckEvaluationTargetMaterializationData(
            storage_id=target.storage_id, run_id=target.run_id, timestamp=target.timestamp
        ),
    )
    _report(instance, run_id, DagsterEventType.ASSET_CHECK_EVALUATION, evaluation)


def _report(instance, run_id, event_type, data):
    instance.report_dagster_event(
        DagsterEvent(event_type_value=event_type.value, event_specific_data=data, job_name="zero_whole_graph"),
        run_id=run_id,
    )


@pytest.fixture
def built(instance):
    """Two sources and the tail, all materialized once, every check passed; the first tick has run."""
    instance.add_dynamic_partitions(RAW_SOURCES.name, ["cam_a", "cam_b"])
    for source in ("cam_a", "cam_b"):
        for asset in PER_SOURCE:
            _materialized(instance, asset, source)
    for asset in TAIL:
        _materialized(instance, asset)
    ticks = Ticks(instance)
    assert _nothing(ticks.at(DAY.replace(hour=1)))
    return instance, ticks


def _nothing(requested: dict) -> bool:
    return not any(requested.values())


def test_a_new_index_of_one_source_requests_only_that_sources_validation(built):
    instance, ticks = built
    _materialized(instance, "raw_image_index", "cam_a", "v2")
    requested = ticks.at(DAY.replace(hour=1, minute=1))
    assert requested["validated_images"] == ["cam_a"]
    assert requested["raw_image_index"] == [], "the index itself is requested by the change-detection sensor only"
    assert requested["trained_checkpoint"] == 0 and requested["map_report"] == 0
    assert _nothing(ticks.at(DAY.replace(hour=1, minute=2))), "requested once, not on every tick"


def test_training_set_waits_for_its_sources_blocking_checks(built):
    instance, ticks = built
    _materialized(instance, "validated_images", "cam_a", "v2", check_passed=False)
    assert ticks.at(DAY.replace(hour=1, minute=1))["training_set"] == 0, (
        "a failed blocking check holds the training set"
    )
    _materialized(instance, "validated_images", "cam_a", "v3")
    assert ticks.at(DAY.replace(hour=1, minute=2))["training_set"] == 1


def test_the_shards_follow_the_selection_and_the_warm_state_their_passed_check(built):
    instance, ticks = built
    _materialized(instance, "training_set", version="v2")
    requested = ticks.at(DAY.replace(hour=1, minute=1))
    assert requested["arrow_shards"] == 1 and requested["validated_images"] == []
    _materialized(instance, "arrow_shards", version="v2", check_passed=False)
    assert ticks.at(DAY.replace(hour=1, minute=2))["fsx_warm_state"] == 0, "a failed shard check holds the warm step"
    _materialized(instance, "arrow_shards", version="v3")
    assert ticks.at(DAY.replace(hour=1, minute=3))["fsx_warm_state"] == 1


def test_training_runs_at_a_cron_tick_only_after_its_training_set_changed(built):
    instance, ticks = built
    assert train_cron({}) == DEFAULT_TRAIN_CRON == "0 3 * * *"
    # No change: the 03:00 tick passes without training.
    assert ticks.at(DAY.replace(hour=3, minute=1))["trained_checkpoint"] == 0
    # The training set changes (new shards, a new data version of the warm state): training waits for the next tick.
    _materialized(instance, "training_set", version="v2")
    _materialized(instance, "arrow_shards", version="v2")
    _materialized(instance, "fsx_warm_state", version="v2")
    assert ticks.at(DAY.replace(hour=3, minute=5))["trained_checkpoint"] == 0
    assert ticks.at(DAY.replace(hour=12))["trained_checkpoint"] == 0
    next_day = DAY + dt.timedelta(days=1)
    assert ticks.at(next_day.replace(hour=3, minute=1))["trained_checkpoint"] == 1
    assert ticks.at(next_day.replace(hour=3, minute=2))["trained_checkpoint"] == 0, "one request per change"
    _materialized(instance, "trained_checkpoint", version="v2")
    assert ticks.at(next_day.replace(hour=3, minute=30))["map_report"] == 1, "the report follows a new checkpoint"
    # Warmed again with the same data version: not a change, no training at the next tick.
    _materialized(instance, "fsx_warm_state", version="v2")
    assert ticks.at((next_day + dt.timedelta(days=1)).replace(hour=3, minute=1))["trained_checkpoint"] == 0

"""Manual and scheduled runs beside the automation: the whole graph less the tuning, one source, the training
tail, and a weekly refresh that re-indexes every source (the tail follows by automation)."""

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleEvaluationContext,
    define_asset_job,
    schedule,
)

from zero_assets.defs.assets import PER_SOURCE_ASSETS, TAIL_ASSETS
from zero_assets.defs.partitions import RAW_SOURCES

whole_graph_job = define_asset_job(
    "zero_whole_graph",
    selection=AssetSelection.all() - AssetSelection.assets("tuned_hyperparameters"),
    description="raw images to mAP report",
)
per_source_job = define_asset_job(
    "zero_per_source",
    selection=AssetSelection.assets(*PER_SOURCE_ASSETS),
    description="index and validate one source",
)
tail_job = define_asset_job(
    "zero_training_tail",
    selection=AssetSelection.assets(*TAIL_ASSETS),
    description="training set (the selection), its shards, warm state, training and mAP report",
)


@schedule(job=per_source_job, cron_schedule="0 3 * * 0", default_status=DefaultScheduleStatus.STOPPED)
def weekly_full_refresh(context: ScheduleEvaluationContext):
    """Every Sunday 03:00: every registered source indexed again from a fresh listing, one run each."""
    sources = context.instance.get_dynamic_partitions(RAW_SOURCES.name)
    day = f"{context.scheduled_execution_time:%Y-%m-%d}"
    return [RunRequest(run_key=f"full-refresh-{day}-{source}", partition_key=source) for source in sources]


ALL_JOBS = [whole_graph_job, per_source_job, tail_job]

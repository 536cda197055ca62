"""Stop the SageMaker jobs no run waits on any more (`JobRunner.stop_orphaned_jobs` judges); the cursor keeps
since when each has had no live holder of its output lease. Local jobs die with their process anyway."""

from __future__ import annotations

import json

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from zero_assets.backends.job_runner import JobRunner
from zero_assets.launch.output_lease import live_holder

TICK_INTERVAL_S = 60


@sensor(
    minimum_interval_seconds=TICK_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="stops SageMaker jobs whose output lease no live run has held for ZERO_SM_ORPHANED_JOB_GRACE_S",
)
def orphaned_jobs_sensor(context: SensorEvaluationContext, jobs: JobRunner):
    orphaned_since, summary = jobs.stop_orphaned_jobs(json.loads(context.cursor or "{}"), live_holder, context.log)
    if orphaned_since is not None:
        context.update_cursor(json.dumps(orphaned_since, sort_keys=True))
    return SkipReason(summary)

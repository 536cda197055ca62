"""Runs the readiness check (`campaign_ready`) every half hour while the Training Plan waits to start,
so problems show while there is time to fix them. The run key dedupes ticks within a half hour.
"""

from __future__ import annotations

import time

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.training_plan import WAITING
from zero_assets.defs.campaign_ready import campaign_readiness_job

READINESS_EVERY_S = 1800


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
    slot = int(time.time() // READINESS_EVERY_S)
    return RunRequest(
        run_key=f"readiness:{plan.name}:{slot}",
        tags={"zero/trigger": "training plan waiting", "zero/training_plan": plan.name},
    )

"""Before the Training Plan starts: the readiness check (`campaign_ready`) on its own, every half hour while the
plan is bought but not yet Active, so what is not ready shows, with the time left, while there is time to fix it.

One DescribeTrainingPlan a tick (none without a plan); the run key names the plan and the half hour, so each
half hour checks once however often the sensor ticks. Once the plan is Active the start sensor takes over.
"""

from __future__ import annotations

import time

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.training_plan import WAITING
from zero_assets.defs.campaign_ready import campaign_readiness_job
from zero_assets.defs.training_plan_start import configured_plan

READINESS_EVERY_S = 1800


@sensor(
    job=campaign_readiness_job,
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.RUNNING,
    description="runs campaign_ready every half hour while the Training Plan (ZERO_SM_TRAINING_PLAN_ARN) waits",
)
def campaign_readiness_sensor(context: SensorEvaluationContext, jobs: JobRunner):
    plan = configured_plan(jobs)
    if plan is None:
        return SkipReason("no Training Plan configured for trained_checkpoint (ZERO_SM_TRAINING_PLAN_ARN)")
    if plan.status not in WAITING:
        return SkipReason(f"training plan {plan.name} is {plan.status}: readiness is checked before it starts")
    slot = int(time.time() // READINESS_EVERY_S)
    return RunRequest(
        run_key=f"readiness:{plan.name}:{slot}",
        tags={"zero/trigger": "training plan waiting", "zero/training_plan": plan.name},
    )

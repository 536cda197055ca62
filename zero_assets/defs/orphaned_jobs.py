"""Stop the SageMaker jobs no run waits on any more: a killed Dagster process never leaves a job running.

A job-backed materialization holds its output's lease while its job runs, renewing it every few
seconds (`launch.once`), and the job carries where that lease is as its `zero:lease` tag
(`backends/sagemaker/job_tags`). A step worker, run worker or host killed mid-job leaves the lease
unrenewed; a step that failed on its own side released it; either way SageMaker would bill the job to
its end for no one. Each tick this sensor lists the graph's running jobs and stops every one whose
lease has had no live holder (`launch.output_lease.live_holder`) since at least
`orphaned_job_grace_s` ago (`ZERO_SM_ORPHANED_JOB_GRACE_S`, 600 s; the cursor keeps since when), so a
retry that reattaches within it takes the lease again and keeps its job. A job without the tag (launched
before it existed, by hand, or whose lease is not on S3) is never judged.

Off SageMaker there is nothing to do: a local job process dies with the process that started it
(`backends/local/process`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster import DefaultSensorStatus, SensorEvaluationContext, SkipReason, sensor

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.sagemaker.job_tags import LEASE_TAG
from zero_assets.launch.output_lease import live_holder

TICK_INTERVAL_S = 60


@dataclass(frozen=True)
class Judged:
    stop: list[Any]  # running jobs no live run has waited on for the grace period
    orphaned_since: dict[str, float]  # job name -> since when no live run holds its lease (the new cursor)


def judge(
    running: list[Any],
    orphaned_since: dict[str, float],
    now: float,
    grace_s: float,
    holder: Callable[[str], dict[str, Any] | None] = live_holder,
) -> Judged:
    """Which of the `running` jobs (`running_jobs.RunningJob`) to stop at `now`, given since when each was
    last seen with no live lease holder (`orphaned_since`, the previous tick's answer)."""
    stop, still = [], {}
    for job in running:
        lease = job.tags.get(LEASE_TAG)
        if lease is None or holder(lease) is not None:
            continue  # never judged, or someone waits on it: a job seen orphaned before and adopted starts over
        since = orphaned_since.get(job.name, now)
        if now - since >= grace_s:
            stop.append(job)
        else:
            still[job.name] = since
    return Judged(stop, still)


@sensor(
    minimum_interval_seconds=TICK_INTERVAL_S,
    default_status=DefaultSensorStatus.RUNNING,
    description="stops SageMaker jobs whose output lease no live run has held for ZERO_SM_ORPHANED_JOB_GRACE_S",
)
def orphaned_jobs_sensor(context: SensorEvaluationContext, jobs: JobRunner):
    from zero_assets.backends.sagemaker.runner import SageMakerJobRunner  # boto3 and dagster-aws only when used
    from zero_assets.backends.sagemaker.running_jobs import running_jobs, stop_job

    if not isinstance(jobs, SageMakerJobRunner):
        return SkipReason("local backend: a job process dies with the process that started it")
    sagemaker = jobs.clients().sagemaker
    running = running_jobs(sagemaker)
    judged = judge(running, json.loads(context.cursor or "{}"), time.time(), jobs.aws.orphaned_job_grace_s)
    for job in judged.stop:
        refused = stop_job(sagemaker, job.kind, job.name)
        if refused is None:
            context.log.warning(
                f"stopped SageMaker {job.kind} job {job.name}: no live run has held its output lease "
                f"{job.tags[LEASE_TAG]} for {jobs.aws.orphaned_job_grace_s} s (the run that launched it is gone)"
            )
        else:
            context.log.info(f"could not stop SageMaker {job.kind} job {job.name}: {refused}")
    context.update_cursor(json.dumps(judged.orphaned_since, sort_keys=True))
    return SkipReason(
        f"{len(running)} running jobs of the graph: {len(judged.stop)} stopped as orphaned, "
        f"{len(judged.orphaned_since)} with no live lease holder for less than {jobs.aws.orphaned_job_grace_s} s"
    )

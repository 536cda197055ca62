"""SageMaker's Training and Processing job APIs side by side (operations, keys, log groups), and the
failure text for a job that did not complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["training", "processing"]


@dataclass(frozen=True)
class JobApi:
    create: str
    describe: str
    stop: str
    name_key: str
    status_key: str
    log_group: str


API = {
    "training": JobApi(
        "create_training_job",
        "describe_training_job",
        "stop_training_job",
        "TrainingJobName",
        "TrainingJobStatus",
        "/aws/sagemaker/TrainingJobs",
    ),
    "processing": JobApi(
        "create_processing_job",
        "describe_processing_job",
        "stop_processing_job",
        "ProcessingJobName",
        "ProcessingJobStatus",
        "/aws/sagemaker/ProcessingJobs",
    ),
}
REATTACHABLE = ("InProgress", "Completed")  # Stopping ends as Stopped: the next attempt takes over
LIMIT_STOPS = ("MaxRuntimeExceeded", "MaxWaitTimeExceeded")


def failure_description(kind: Kind, job: dict, last_lines) -> str:
    api = API[kind]
    status = job[api.status_key]
    # Processing jobs put the script's own words in ExitMessage, training jobs in FailureReason.
    reason = (
        " | ".join(filter(None, [job.get("FailureReason"), job.get("ExitMessage")]))
        or "(SageMaker gave no FailureReason)"
    )
    secondary = job.get("SecondaryStatus", "")
    if status == "Stopped":
        limit = next((s for s in LIMIT_STOPS if s in f"{secondary} {reason}"), None)
        reason = (
            stopped_on_plan(job)
            if limit == "MaxRuntimeExceeded" and job.get("ResourceConfig", {}).get("TrainingPlanArn")
            else f"stopped by SageMaker: {limit}; raise max_runtime_s (or max_wait_s for spot)"
            if limit
            else "stopped before completing (StopJob was called)"
        )
    tail = "\n".join(last_lines) or "(no log lines reached CloudWatch)"
    return f"SageMaker {kind} job {job[api.name_key]} {status}: {reason}\nlast log lines:\n{tail}"


def stopped_on_plan(job: dict) -> str:
    """Why a training job on a plan hit MaxRuntimeInSeconds (the plan's end) and how to resume it."""
    plan = job["ResourceConfig"]["TrainingPlanArn"].rsplit("/", 1)[-1]
    checkpoints = job.get("CheckpointConfig", {}).get("S3Uri", "its checkpoint prefix")
    seconds = job.get("StoppingCondition", {}).get("MaxRuntimeInSeconds")
    return (
        f"stopped by SageMaker at the end of its time on training plan {plan} (MaxRuntimeExceeded: "
        f"MaxRuntimeInSeconds={seconds}, bounded by the plan's end less ZERO_SM_PLAN_CHECKPOINT_MARGIN_S). "
        f"Its checkpoints are at {checkpoints}: materialize it again, on a plan with time left "
        "(this one's next window or extension, or another plan in ZERO_SM_TRAINING_PLAN_ARN), to resume from them"
    )

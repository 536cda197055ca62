"""SageMaker's Training and Processing job APIs side by side (operations, keys, log groups), the failure
text for a job that did not complete, the tags on every job the graph launches (operator tags from
`ZERO_SM_TAGS`), and its running jobs (tagged `zero:asset`): those whose `zero:lease` has had no live
holder for the grace period are stopped (the caller keeps since when, the sensor's cursor).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from botocore.exceptions import ClientError

from training_code.lib.storage import is_s3
from zero_assets.core.job_request import JobRequest

Kind = Literal["training", "processing"]


@dataclass(frozen=True)
class JobApi:
    create: str
    describe: str
    stop: str
    name_key: str
    status_key: str
    log_group: str


# create_training_job, TrainingJobName, /aws/sagemaker/TrainingJobs, ... and the same for processing.
API = {
    kind: JobApi(
        f"create_{kind}_job",
        f"describe_{kind}_job",
        f"stop_{kind}_job",
        f"{kind.capitalize()}JobName",
        f"{kind.capitalize()}JobStatus",
        f"/aws/sagemaker/{kind.capitalize()}Jobs",
    )
    for kind in ("training", "processing")
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


ASSET_TAG = "zero:asset"
FINGERPRINT_TAG = "zero:fingerprint"
LEASE_TAG = "zero:lease"  # set only for an S3 lease
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]{0,256}$")  # SageMaker's rule for a tag value


def job_tags(request: JobRequest, operator_tags: dict[str, str]) -> list[dict[str, str]]:
    """The Tags of the request's Create*Job call."""
    tags = {**operator_tags, ASSET_TAG: request.asset, FINGERPRINT_TAG: request.fingerprint[:16]}
    if is_s3(request.lease) and _TAG_VALUE.match(request.lease):
        tags[LEASE_TAG] = request.lease
    return [{"Key": key, "Value": str(value)[:256]} for key, value in tags.items()]


@dataclass(frozen=True)
class RunningJob:
    kind: Kind
    name: str
    tags: dict[str, str]


def running_jobs(sagemaker: Any) -> list[RunningJob]:
    """Every training and processing job of the graph that is InProgress now (one ListTags call per job)."""
    found = []
    for kind in API:
        title = kind.capitalize()
        listing = getattr(sagemaker, f"list_{kind}_jobs")
        for summary in paged(listing, f"{title}JobSummaries", StatusEquals="InProgress", MaxResults=100):
            listed = paged(sagemaker.list_tags, "Tags", ResourceArn=summary[f"{title}JobArn"])
            tags = {tag["Key"]: tag["Value"] for tag in listed}
            if ASSET_TAG in tags:
                found.append(RunningJob(kind, summary[API[kind].name_key], tags))
    return found


def stop_job(sagemaker: Any, kind: Kind, name: str) -> str | None:
    """Stop the job; None once asked, else why it could not be (it is ending already, say)."""
    api = API[kind]
    try:
        getattr(sagemaker, api.stop)(**{api.name_key: name})
    except ClientError as error:
        return str(error)
    return None


@dataclass(frozen=True)
class Judged:
    stop: list[Any]  # running jobs no live run has waited on for the grace period
    orphaned_since: dict[str, float]  # job name -> since when no live run holds its lease (the new cursor)


def judge(
    running: list[Any],
    orphaned_since: dict[str, float],
    now: float,
    grace_s: float,
    holder: Callable[[str], dict[str, Any] | None],
) -> Judged:
    """Which `running` jobs to stop at `now`, given `orphaned_since` from the previous tick."""
    stop, still = [], {}
    for job in running:
        lease = job.tags.get(LEASE_TAG)
        if lease is None or holder(lease) is not None:
            continue  # untagged, or someone waits on it: an adopted job's clock starts over
        since = orphaned_since.get(job.name, now)
        if now - since >= grace_s:
            stop.append(job)
        else:
            still[job.name] = since
    return Judged(stop, still)


def stop_orphaned(
    sagemaker: Any, orphaned_since: dict[str, float], grace_s: float, holder: Callable[[str], Any], log: Any
) -> tuple[dict[str, float], str]:
    """Stop the running jobs `judge` finds orphaned; the new `orphaned_since` and a summary."""
    running = running_jobs(sagemaker)
    judged = judge(running, orphaned_since, time.time(), grace_s, holder)
    for job in judged.stop:
        refused = stop_job(sagemaker, job.kind, job.name)
        if refused is None:
            log.warning(
                f"stopped SageMaker {job.kind} job {job.name}: no live run has held its output lease "
                f"{job.tags[LEASE_TAG]} for {grace_s} s (the run that launched it is gone)"
            )
        else:
            log.info(f"could not stop SageMaker {job.kind} job {job.name}: {refused}")
    return judged.orphaned_since, (
        f"{len(running)} running jobs of the graph: {len(judged.stop)} stopped as orphaned, "
        f"{len(judged.orphaned_since)} with no live lease holder for less than {grace_s} s"
    )


def paged(call: Any, items: str, **request: Any) -> list[dict[str, Any]]:
    found, token = [], None
    while True:
        page = call(**request, **({"NextToken": token} if token else {}))
        found.extend(page.get(items, []))
        token = page.get("NextToken")
        if not token:
            return found

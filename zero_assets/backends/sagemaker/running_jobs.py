"""The graph's running SageMaker jobs (those tagged `zero:asset`), and stopping those no run waits on.

A job whose `zero:lease` has had no live holder for the grace period is stopped (the caller keeps since
when, the sensor's cursor); untagged jobs are never judged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from zero_assets.backends.sagemaker.job_api import API, Kind
from zero_assets.backends.sagemaker.job_tags import ASSET_TAG, LEASE_TAG

_LISTS = {
    "training": ("list_training_jobs", "TrainingJobSummaries", "TrainingJobName", "TrainingJobArn"),
    "processing": ("list_processing_jobs", "ProcessingJobSummaries", "ProcessingJobName", "ProcessingJobArn"),
}


@dataclass(frozen=True)
class RunningJob:
    kind: Kind
    name: str
    tags: dict[str, str]


def running_jobs(sagemaker: Any) -> list[RunningJob]:
    """Every training and processing job of the graph that is InProgress now (one ListTags call per job)."""
    found = []
    for kind, (operation, summaries, name_key, arn_key) in _LISTS.items():
        for summary in _pages(getattr(sagemaker, operation), summaries, StatusEquals="InProgress", MaxResults=100):
            tags = {
                tag["Key"]: tag["Value"] for tag in _pages(sagemaker.list_tags, "Tags", ResourceArn=summary[arn_key])
            }
            if ASSET_TAG in tags:
                found.append(RunningJob(kind, summary[name_key], tags))
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


def _pages(call: Any, items: str, **request: Any) -> list[dict[str, Any]]:
    found, token = [], None
    while True:
        page = call(**request, **({"NextToken": token} if token else {}))
        found.extend(page.get(items, []))
        token = page.get("NextToken")
        if not token:
            return found

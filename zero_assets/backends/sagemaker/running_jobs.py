"""The graph's SageMaker jobs still running, with their tags, and stopping one: what
`defs/orphaned_jobs` judges and acts on.

A job is the graph's when it carries the `zero:asset` tag every request gets (`job_tags`); other
jobs of the account are listed by SageMaker but never returned here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from zero_assets.backends.sagemaker.job_api import API, Kind
from zero_assets.backends.sagemaker.job_tags import ASSET_TAG

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
    """Every training and processing job of the graph that is InProgress now (ListTags per job: the
    list calls carry no tags)."""
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


def _pages(call: Any, items: str, **request: Any) -> list[dict[str, Any]]:
    found, token = [], None
    while True:
        page = call(**request, **({"NextToken": token} if token else {}))
        found.extend(page.get(items, []))
        token = page.get("NextToken")
        if not token:
            return found

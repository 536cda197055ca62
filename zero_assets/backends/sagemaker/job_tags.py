"""The tags on every job the graph launches.

`zero:asset` marks a job as the graph's (`running_jobs`); `zero:lease`, set only for an S3 lease,
lets `defs/orphaned_jobs` stop a job no live run waits on. Operator tags come from `ZERO_SM_TAGS`.
"""

from __future__ import annotations

import re

from training_code.lib.storage import is_s3
from zero_assets.core.job_request import JobRequest

ASSET_TAG = "zero:asset"
FINGERPRINT_TAG = "zero:fingerprint"
LEASE_TAG = "zero:lease"
_TAG_VALUE = re.compile(r"^[\w\s.:/=+\-@]{0,256}$")  # SageMaker's rule for a tag value


def job_tags(request: JobRequest, operator_tags: dict[str, str]) -> list[dict[str, str]]:
    """The Tags of the request's Create*Job call."""
    tags = {**operator_tags, ASSET_TAG: request.asset, FINGERPRINT_TAG: request.fingerprint[:16]}
    if is_s3(request.lease) and _TAG_VALUE.match(request.lease):
        tags[LEASE_TAG] = request.lease
    return [{"Key": key, "Value": str(value)[:256]} for key, value in tags.items()]

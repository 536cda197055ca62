"""The tags on every job the graph launches, and who reads them.

- `zero:asset`, `zero:fingerprint` (its first 16 hex digits): which materialization the job builds;
  `running_jobs` takes a job with `zero:asset` for one of the graph's.
- `zero:lease`: where the output lease is that the building run holds while the job runs
  (`JobRequest.lease`); `defs/orphaned_jobs` stops a job whose lease no live run holds. Only a lease
  on S3 is named, the one place every host looks: a job without the tag is never judged.
- the operator's own (`ZERO_SM_TAGS`); the Pipes client adds Dagster's run tags at launch.
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

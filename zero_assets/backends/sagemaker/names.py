"""SageMaker job names: one per attempt, from `core.job_request.job_name` (the one job-name function
both backends use), and the attempt number read back from a name.

The same label, fingerprint and attempt always give the same name: that is what lets a restarted
Dagster run find the job its predecessor launched instead of launching a second one. Names follow
SageMaker's rule `[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}`.
"""

from __future__ import annotations

import re

from zero_assets.core.job_request import job_name

__all__ = ["attempt_of", "job_name"]


def attempt_of(name: str) -> int:
    """The attempt number a name from `job_name` ends with."""
    found = re.search(r"-a(\d+)$", name)
    if not found:
        raise ValueError(f"{name!r} is not a job name from job_name(): it does not end in -a<attempt>")
    return int(found.group(1))

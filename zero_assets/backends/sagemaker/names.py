"""SageMaker job names: `core.job_request.job_name` re-exported, and the attempt number read back from a name.

Names are deterministic, so a restarted run finds the job its predecessor launched.
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

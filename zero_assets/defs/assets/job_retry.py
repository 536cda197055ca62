"""The step retry policy of the job-backed assets.

On SageMaker a retried step is safe and cheap: it reattaches to the attempt still running, reuses a
completed attempt whose output is complete, and waits for a stopping one (see
`sagemaker/pipes_client.py`), so a retry launches a new job only where the last one failed. Locally
a failed job is the script's own verdict, visible at once, and a retry would run it all again, so
local steps are not retried unless ZERO_JOB_RETRIES asks for it.
"""

from __future__ import annotations

import os

from dagster import Backoff, RetryPolicy

SAGEMAKER_RETRIES = 2
FIRST_DELAY_S = 60  # then 120 s: long enough for a throttle or a short outage to pass


def job_retry_policy() -> RetryPolicy | None:
    default = SAGEMAKER_RETRIES if os.environ.get("ZERO_BACKEND", "local") == "sagemaker" else 0
    configured = os.environ.get("ZERO_JOB_RETRIES") or str(default)
    if not configured.isdigit():
        raise ValueError(
            f"ZERO_JOB_RETRIES={configured!r} is not a whole number of step retries; set it to 0 or more, or unset it"
        )
    retries = int(configured)
    return RetryPolicy(max_retries=retries, delay=FIRST_DELAY_S, backoff=Backoff.EXPONENTIAL) if retries > 0 else None


JOB_RETRY_POLICY = job_retry_policy()

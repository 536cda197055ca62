"""The step retry policy of the job-backed assets (`ZERO_JOB_RETRIES`).

Retried by default on SageMaker, where a retry reattaches to or reuses its attempts; not locally,
where a retry would rerun the whole job.
"""

from __future__ import annotations

from collections.abc import Mapping

from dagster import Backoff, RetryPolicy

from zero_assets.core.settings import backend_from_env, zero_env

SAGEMAKER_RETRIES = 2
FIRST_DELAY_S = 60  # then 120 s: long enough for a throttle or a short outage to pass


def job_retry_policy(environ: Mapping[str, str] | None = None) -> RetryPolicy | None:
    default = SAGEMAKER_RETRIES if backend_from_env(environ) == "sagemaker" else 0
    configured = zero_env("ZERO_JOB_RETRIES", environ) or str(default)
    if not configured.isdigit():
        raise ValueError(
            f"ZERO_JOB_RETRIES={configured!r} is not a whole number of step retries; set it to 0 or more, or unset it"
        )
    retries = int(configured)
    return RetryPolicy(max_retries=retries, delay=FIRST_DELAY_S, backoff=Backoff.EXPONENTIAL) if retries > 0 else None


# Read at load: a retry policy is part of each asset's definition.
JOB_RETRY_POLICY = job_retry_policy()

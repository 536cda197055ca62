"""When each asset runs by itself: cheap stages follow their inputs eagerly, training only at a `ZERO_TRAIN_CRON`
tick when its data changed (the index has no condition: the change-detection sensor requests it). And the
job-backed assets' step retries (`ZERO_JOB_RETRIES`): by default on SageMaker, where a retry reattaches to or
reuses its attempts, not locally, where it would rerun the whole job."""

from __future__ import annotations

from collections.abc import Mapping

from dagster import AssetSelection, AutomationCondition, Backoff, RetryPolicy

from zero_assets.core.settings import backend_from_env, zero_env

DEFAULT_TRAIN_CRON = "0 3 * * *"
SAGEMAKER_RETRIES = 2
FIRST_DELAY_S = 60  # then 120 s: long enough for a throttle or a short outage to pass

EAGER = AutomationCondition.eager()

# `eager()` without "no dependency missing": a missing or failing source must not hold the others back.
TRAINING_SET = (
    AutomationCondition.any_deps_updated().since_last_handled()
    & AutomationCondition.all_deps_blocking_checks_passed()
    # The quarantine check is per source: a dep passes when any source passed, so check failures here.
    & ~AutomationCondition.any_deps_match(
        AutomationCondition.any_checks_match(AutomationCondition.check_failed(), blocking_only=True)
    )
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("eager over the sources that have validated sets, once their blocking checks passed")

# A new warm state alone (training not run yet) is no reason to score again.
AFTER_CHECKPOINT = (
    AutomationCondition.any_deps_updated().ignore(AssetSelection.assets("fsx_warm_state")).since_last_handled()
    & ~AutomationCondition.any_deps_missing()
    & ~AutomationCondition.any_deps_in_progress()
    & ~AutomationCondition.in_progress()
).with_label("after a new checkpoint")


def train_cron(environ: Mapping[str, str] | None = None) -> str:
    return zero_env("ZERO_TRAIN_CRON", environ) or DEFAULT_TRAIN_CRON


def training_condition(cron: str) -> AutomationCondition:
    """At a tick of `cron`, when the training data's version changed since training last ran or was requested."""
    data_changed = AutomationCondition.any_deps_match(AutomationCondition.data_version_changed()).since_last_handled()
    return (
        AutomationCondition.cron_tick_passed(cron)
        & data_changed
        & AutomationCondition.all_deps_blocking_checks_passed()
        & ~AutomationCondition.any_deps_in_progress()
        & ~AutomationCondition.in_progress()
    ).with_label(f"on cron {cron!r} when the training set changed and blocking checks passed")


TRAINING = training_condition(train_cron())


def job_retry_policy() -> RetryPolicy | None:
    default = SAGEMAKER_RETRIES if backend_from_env() == "sagemaker" else 0
    configured = zero_env("ZERO_JOB_RETRIES") or str(default)
    if not configured.isdigit():
        raise ValueError(
            f"ZERO_JOB_RETRIES={configured!r} is not a whole number of step retries; set it to 0 or more, or unset it"
        )
    retries = int(configured)
    return RetryPolicy(max_retries=retries, delay=FIRST_DELAY_S, backoff=Backoff.EXPONENTIAL) if retries > 0 else None


JOB_RETRY_POLICY = job_retry_policy()

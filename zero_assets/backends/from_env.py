"""The one place the backend (`ZERO_BACKEND`) is chosen and its settings built, `ZERO_PROFILE` applied; the
code location and the `zero-assets` commands both take their settings from here.
"""

from __future__ import annotations

from typing import TypeVar

from dagster import ConfigurableResource

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.settings import (
    REHEARSAL_SAMPLE_IMAGES,
    SageMakerSettings,
    profile_fields,
    profile_from_env,
    s3_root_from_env,
    sagemaker_settings_from_env,
)
from zero_assets.core.settings import ZeroSettings, backend_from_env, settings_from_env

Resource = TypeVar("Resource", bound=ConfigurableResource)


def resources_from_env() -> dict[str, ZeroSettings | JobRunner]:
    """`settings` and `jobs` for the configured backend and profile."""
    settings, aws = backend_settings()
    if aws is None:
        return {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
    from zero_assets.backends.sagemaker.runner import SageMakerJobRunner  # boto3 and dagster-aws only when used

    return {"settings": settings, "jobs": SageMakerJobRunner(settings=settings, aws=aws)}


def backend_settings() -> tuple[ZeroSettings, SageMakerSettings | None]:
    """The configured backend's settings: `ZeroSettings`, and the SageMaker backend's own (None locally)."""
    if backend_from_env() == "sagemaker":
        return sagemaker_settings()
    return settings_from_env(**_sample(profile_from_env())), None


def sagemaker_settings() -> tuple[ZeroSettings, SageMakerSettings]:
    """The SageMaker backend's settings whatever `ZERO_BACKEND` says; lake and raw root under `s3://<bucket>/<prefix>/`."""
    profile = profile_from_env()
    aws = sagemaker_settings_from_env(**profile_fields(profile))
    root = s3_root_from_env()  # not `aws`'s: its fields are EnvVar bindings until Dagster resolves them
    return settings_from_env(lake_uri=f"{root}/lake", raw_uri=f"{root}/raw", **_sample(profile)), aws


def resolved(resource: Resource) -> Resource:
    """`resource` with its EnvVar bindings resolved now, as Dagster does for a run (for commands)."""
    return resource.process_config_and_initialize()


def _sample(profile: str) -> dict[str, int]:
    return {"sample_images": REHEARSAL_SAMPLE_IMAGES} if profile == "rehearsal" else {}

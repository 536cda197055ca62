"""The one place the backend is chosen: `ZERO_BACKEND` (local | sagemaker) and `ZERO_PROFILE`."""

from __future__ import annotations

import os

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker.profiles import apply_profile, profile_from_env, sample_images
from zero_assets.backends.sagemaker.settings import sagemaker_settings_from_env
from zero_assets.core.settings import ZeroSettings, settings_from_env


def resources_from_env() -> dict[str, ZeroSettings | JobRunner]:
    """`settings` and `jobs` for the configured backend and profile."""
    profile = profile_from_env()
    overrides = {"sample_images": sample_images(profile)} if sample_images(profile) else {}
    if os.environ.get("ZERO_BACKEND", "local") != "sagemaker":
        settings = settings_from_env(**overrides)
        return {"settings": settings, "jobs": LocalJobRunner(settings=settings)}
    from zero_assets.backends.sagemaker.runner import SageMakerJobRunner

    aws = apply_profile(sagemaker_settings_from_env(), profile)
    prefix = os.environ.get("ZERO_SM_PREFIX", "zero").strip("/")
    # Read from the environment, not `aws`: its fields are EnvVar bindings until Dagster resolves them.
    lake = (
        f"s3://{os.environ['ZERO_SM_BUCKET']}/{prefix}/lake" if prefix else f"s3://{os.environ['ZERO_SM_BUCKET']}/lake"
    )
    settings = settings_from_env(lake_uri=lake, **overrides)
    return {"settings": settings, "jobs": SageMakerJobRunner(settings=settings, aws=aws)}

"""Run profiles (`ZERO_PROFILE`): `production` uses the configured compute; `rehearsal` runs the graph
on AWS cheaply (a sample, small instances, two instances where multi-node paths need exercising).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zero_assets.backends.sagemaker.settings import DEFAULT_COMPUTE, JobCompute
from zero_assets.core.settings import zero_env

PROFILES = ("production", "rehearsal")
REHEARSAL_SAMPLE_IMAGES = 2000

REHEARSAL_COMPUTE = {
    "validated_images": JobCompute(
        instance_type="ml.m5.xlarge", instance_count=2, volume_size_gb=50, max_runtime_s=2 * 3600
    ),
    "arrow_shards": JobCompute(instance_type="ml.m5.xlarge", volume_size_gb=50, max_runtime_s=2 * 3600),
    "fsx_warm_state": JobCompute(instance_type="ml.m5.large", volume_size_gb=30, max_runtime_s=3600),
    # The rehearsal asset's own compute (training_rehearsal), so both rehearsals train on the same instances.
    "trained_checkpoint": DEFAULT_COMPUTE["training_rehearsal"],
    "map_report": DEFAULT_COMPUTE["rehearsal_evaluation"],
}


def profile_from_env(environ: Mapping[str, str] | None = None) -> str:
    profile = zero_env("ZERO_PROFILE", environ) or "production"
    if profile not in PROFILES:
        raise ValueError(f"ZERO_PROFILE={profile!r} is not a profile; use one of {PROFILES}")
    return profile


def profile_fields(profile: str) -> dict[str, Any]:
    """The `SageMakerSettings` fields a profile sets over the configured ones (production: none).

    Pass them to the constructor: Dagster rebuilds a resource from its constructor fields, dropping a
    `model_copy(update=...)`."""
    if profile == "production":
        return {}
    if profile == "rehearsal":
        # Spot capacity waits would slow a rehearsal down; it is short and cheap anyway.
        return {**REHEARSAL_COMPUTE, "use_spot": False}
    raise ValueError(f"profile {profile!r} is not one of {PROFILES}")


def sample_images(profile: str) -> int | None:
    """How many images of the raw index a profile runs on (None: all of them)."""
    return REHEARSAL_SAMPLE_IMAGES if profile == "rehearsal" else None

"""The one interface every backend implements: run a `JobRequest`, return the Pipes result and metadata."""

from __future__ import annotations

from typing import Any

from dagster import AssetExecutionContext, ConfigurableResource, MaterializeResult, PipesClientCompletedInvocation

from zero_assets.core.fingerprints import UpstreamOutput
from zero_assets.core.job_request import JobRequest


class JobRunner(ConfigurableResource):
    """Base of `LocalJobRunner` and `SageMakerJobRunner`; asset code depends on this alone."""

    def run(
        self, context: AssetExecutionContext, request: JobRequest
    ) -> tuple[PipesClientCompletedInvocation, dict[str, Any]]:
        raise TypeError(
            f"{type(self).__name__} does not run jobs; configure LocalJobRunner or SageMakerJobRunner as the `jobs` resource"
        )

    def instance_count(self, asset: str) -> int:
        """Instances the asset's Processing job may spread over (see `job_request.fan_out`)."""
        return 1

    def warm_shards(self, context: AssetExecutionContext, shards: UpstreamOutput) -> MaterializeResult:
        """Make the training set `shards` readable by the trainer, verified; its `dagster/uri` is what training reads."""
        raise TypeError(
            f"{type(self).__name__} does not warm shards; configure LocalJobRunner or SageMakerJobRunner as `jobs`"
        )

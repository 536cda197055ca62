"""`arrow_shards`: the validated set packed into Arrow IPC shards per split, run as a Processing job."""

from dagster import AssetExecutionContext, Config, MaterializeResult, asset

from ..fingerprints import upstream_output
from ..job_launch import launch_job
from ..resources.local_runner import LocalJobRunner
from ..resources.settings import ZeroSettings
from .validated_images import validated_images


class ShardConfig(Config):
    target_shard_bytes: int = 1_000_000_000  # roll over to a new shard at about this size


@asset(deps=[validated_images], group_name="zero", kinds={"arrow"})
def arrow_shards(context: AssetExecutionContext, config: ShardConfig, settings: ZeroSettings, jobs: LocalJobRunner) -> MaterializeResult:
    """Arrow IPC shards (`<split>-<n>.arrow`) and `manifest.json` with rows, bytes and sha256 per shard."""
    validated = upstream_output(context, "validated_images")
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module="training_code.shard",
        config=config.model_dump(),
        upstream=[validated],
        inputs={"validated": validated.uri, "raw": settings.raw_uri},
    )

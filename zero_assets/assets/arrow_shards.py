"""`arrow_shards`: the validated set packed into Arrow IPC shards per split, run as a Processing job."""

from typing import Literal

from dagster import AssetExecutionContext, Config, MaterializeResult, asset

from ..automation import PER_SOURCE
from ..fingerprints import previous_output, upstream_output
from ..job_launch import launch_job
from ..resources.job_runner import JobRunner
from ..partitions import RAW_SOURCES
from ..resources.settings import ZeroSettings, source_uri
from .validated_images import validated_images
from .job_retry import JOB_RETRY_POLICY


class ShardConfig(Config):
    target_shard_bytes: int = 1_000_000_000  # roll over to a new shard at about this size
    # Preprocessing, part of the fingerprint: keep the original bytes, or resize the longest side to
    # max_side and re-encode as JPEG. Augmentation is never done here.
    image_encoding: Literal["original", "resize"] = "original"
    max_side: int = 1024
    jpeg_quality: int = 90


@asset(deps=[validated_images], partitions_def=RAW_SOURCES, automation_condition=PER_SOURCE, group_name="zero", kinds={"arrow"}, retry_policy=JOB_RETRY_POLICY)
def arrow_shards(context: AssetExecutionContext, config: ShardConfig, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    """Arrow IPC shards (`<split>-<n>.arrow`) and `manifest.json` with rows, bytes and sha256 per shard."""
    validated = upstream_output(context, "validated_images", context.partition_key)
    # Unchanged earlier shards are carried over, not rewritten (see training_code/lib/shard_plan).
    previous = previous_output(context)
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module="training_code.shard",
        config=config.model_dump(),
        upstream=[validated],
        input_folders={"raw": context.partition_key},
        inputs={"validated": validated.uri, "raw": source_uri(settings, context.partition_key), **({"previous": previous} if previous else {})},
    )

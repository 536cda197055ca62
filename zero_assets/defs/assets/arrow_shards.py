"""`arrow_shards`: the validated set packed into Arrow IPC shards per split, run as a Processing job."""

from typing import Literal

from dagster import AssetExecutionContext, Config, MaterializeResult, asset
from pydantic import Field

from training_code.lib.shard_format import SHARD_SCHEMA
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import code_version
from zero_assets.core.settings import ZeroSettings, source_uri
from zero_assets.defs.assets.job_retry import JOB_RETRY_POLICY
from zero_assets.defs.assets.validated_images import validated_images
from zero_assets.defs.automation import EAGER
from zero_assets.defs.partitions import RAW_SOURCES
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import arrow_table_schema
from zero_assets.launch.upstream import previous_output, upstream_output

# The job script: its code version (the script and what it imports) is the asset's, in the UI and the cache alike.
SHARD_MODULE = "training_code.shard"


class ShardConfig(Config):
    target_shard_bytes: int = Field(
        1_000_000_000, description="Start a new shard file once the current one reaches about this many bytes."
    )
    # Preprocessing, part of the fingerprint. Augmentation is never done here.
    image_encoding: Literal["original", "resize"] = Field(
        "original",
        description=(
            "original: store each image's bytes as they are; resize: scale the longest side to max_side "
            "and re-encode as JPEG."
        ),
    )
    max_side: int = Field(1024, description="Longest side in pixels after resizing (image_encoding=resize only).")
    jpeg_quality: int = Field(90, description="JPEG quality 1-95 of re-encoded images (image_encoding=resize only).")


@asset(
    code_version=code_version(SHARD_MODULE),
    deps=[validated_images],
    partitions_def=RAW_SOURCES,
    automation_condition=EAGER,
    group_name="zero",
    kinds={"arrow"},
    retry_policy=JOB_RETRY_POLICY,
    metadata={"dagster/column_schema": arrow_table_schema(SHARD_SCHEMA)},
)
def arrow_shards(
    context: AssetExecutionContext, config: ShardConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Arrow IPC shards (`<split>-<n>.arrow`) and `manifest.json` with rows, bytes and sha256 per shard.

    `dagster/row_count` is the rows of every shard (train and val); the shard list is in the manifest,
    the materialization keeps a summary (`shard_sizes`)."""
    validated = upstream_output(context, "validated_images", context.partition_key)
    # Unchanged earlier shards are carried over, not rewritten (see training_code/lib/shard_plan).
    previous = previous_output(context)
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module=SHARD_MODULE,
        config=config.model_dump(),
        upstream=[validated],
        input_folders={"raw": context.partition_key},
        inputs={
            "validated": validated.uri,
            "raw": source_uri(settings, context.partition_key),
            **({"previous": previous} if previous else {}),
        },
    )

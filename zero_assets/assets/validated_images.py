"""`validated_images`: the corrupt-image pass over the index, run as a Processing job."""

from dagster import AssetExecutionContext, Config, MaterializeResult, asset

from training_code.lib.tables import ACCEPTED

from ..automation import PER_SOURCE
from ..fingerprints import previous_output, upstream_output
from ..job_launch import launch_job
from ..job_request import FanOut
from ..metadata import table_schema
from ..resources.job_runner import JobRunner
from ..partitions import RAW_SOURCES
from ..resources.settings import ZeroSettings, source_uri
from .raw_image_index import raw_image_index
from .job_retry import JOB_RETRY_POLICY


# On several instances each decodes its part of the raw images; one then decides (see training_code/validate.py).
VALIDATION_SPREAD = FanOut(split_input="raw", collected_input="decoded")


class ValidationConfig(Config):
    val_fraction: float = 0.2  # share of groups held out for evaluation
    split_seed: int = 0
    max_quarantine_rate: float = 0.5  # fail the asset when more of the images than this are rejected
    min_side: int = 8
    timeout_s: float = 20.0  # per-file decode limit
    # Past these an image is quarantined as too_large before it is read or decoded (README "Bad input").
    max_image_bytes: int = 128 << 20
    max_pixels: int = 1_000_000_000
    max_annotation_bytes: int = 1 << 30  # a larger annotations.json costs its source its labels, reported


@asset(deps=[raw_image_index], partitions_def=RAW_SOURCES, automation_condition=PER_SOURCE, group_name="zero", kinds={"parquet"}, metadata={"dagster/column_schema": table_schema(ACCEPTED)}, retry_policy=JOB_RETRY_POLICY)
def validated_images(
    context: AssetExecutionContext, config: ValidationConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Accepted images (sha256, size, format, mode, split, labels) and the quarantine, duplicate and label-rejection tables."""
    index = upstream_output(context, "raw_image_index", context.partition_key)
    # The previous output lets the job decode only new or changed images (see training_code/lib/verdict_cache).
    previous = previous_output(context)
    return launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module="training_code.validate",
        config=config.model_dump(),
        upstream=[index],
        inputs={"index": index.uri, "raw": source_uri(settings, context.partition_key), **({"previous": previous} if previous else {})},
        input_folders={"raw": context.partition_key},
        spread=VALIDATION_SPREAD,
    )

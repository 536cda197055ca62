"""`fsx_warm_state`: the shards on the file system the trainer reads, every one verified there."""

from dagster import AssetExecutionContext, MaterializeResult, asset

from ..fingerprints import upstream_output
from ..metadata import upstream_metadata
from ..resources.job_runner import JobRunner
from .arrow_shards import arrow_shards


@asset(deps=[arrow_shards], group_name="zero", kinds={"filesystem"})
def fsx_warm_state(context: AssetExecutionContext, jobs: JobRunner) -> MaterializeResult:
    """The location the trainer reads (a folder locally; FSx for Lustre or S3 on SageMaker), verified complete.

    Its data version is the shard set's: warming the same bytes again does not make training stale.
    """
    shards = upstream_output(context, "arrow_shards")
    warmed = jobs.warm_shards(context, shards)
    return MaterializeResult(metadata={**warmed.metadata, "upstream": upstream_metadata([shards])}, data_version=warmed.data_version)

"""`fsx_warm_state`: the shards on the file system the trainer reads, every one verified there."""

from dagster import AssetExecutionContext, MaterializeResult, asset

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, code_version
from zero_assets.core.output_marker import mark_output_complete, output_is_checkable
from zero_assets.defs.assets.job_retry import JOB_RETRY_POLICY
from zero_assets.defs.assets.training_set import training_set
from zero_assets.defs.automation import FOLLOW
from zero_assets.launch.cache import decide, miss_metadata, reported_row_count
from zero_assets.launch.metadata import upstream_metadata
from zero_assets.launch.upstream import upstream_output

# The code that warms and verifies: its code version is the asset's, in the UI and the cache alike.
WARM_MODULE = "zero_assets.backends.local.warm_state"


@asset(
    code_version=code_version(WARM_MODULE),
    deps=[training_set],
    automation_condition=FOLLOW,
    group_name="zero",
    kinds={"filesystem"},
    retry_policy=JOB_RETRY_POLICY,
)
def fsx_warm_state(context: AssetExecutionContext, jobs: JobRunner) -> MaterializeResult:
    """The training set's shards where the trainer reads them (a folder locally; FSx for Lustre or S3 on
    SageMaker), verified complete, with the training-set manifest written last.

    Its data version is the training set's: warming the same bytes again does not make training stale.
    `dagster/row_count` is the rows of the warm shards; `dagster/size_bytes` the bytes the trainer
    reads there (every shard, the training-set manifest and its excluded rows), as the backend counted them.
    """
    shards = upstream_output(context, "training_set")
    inputs = FingerprintInputs.of(WARM_MODULE, {"backend": type(jobs).__name__}, [shards])
    decision = decide(context, inputs)
    if decision.hit is not None:
        context.log.info(f"cache hit, shards already warm: {decision.reason}")
        return decision.hit
    warmed = jobs.warm_shards(context, shards)
    location = warmed.metadata["dagster/uri"]
    uri = str(getattr(location, "value", location))  # a path metadata value locally, a plain string on AWS
    if output_is_checkable(uri):
        mark_output_complete(uri, inputs.fingerprint, row_count=reported_row_count(warmed.metadata))
    metadata = {**warmed.metadata, "upstream": upstream_metadata([shards]), **miss_metadata(inputs, decision.reason)}
    return MaterializeResult(metadata=metadata, data_version=warmed.data_version)

"""`fsx_warm_state`: the shards on the file system the trainer reads, every one verified there."""

from dagster import AssetExecutionContext, MaterializeResult, asset

from ..automation import FOLLOW
from ..cache import decide, mark_output_complete, miss_metadata, output_is_checkable, reported_row_count
from ..fingerprints import FingerprintInputs, code_version, upstream_output
from ..metadata import upstream_metadata
from ..resources.job_runner import JobRunner
from .job_retry import JOB_RETRY_POLICY
from .training_set import training_set

# The code that warms and verifies: its code version is the asset's, in the UI and the cache alike.
WARM_MODULE = "zero_assets.warm_state"


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

"""`fsx_warm_state`: the shard set on the file system the trainer reads, every shard verified there."""

from typing import Any

from dagster import AssetExecutionContext, DataVersion, MaterializeResult, MetadataValue, asset

from zero_assets.backends.job_runner import JobRunner, WarmedShards
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, code_version, current_code_version
from zero_assets.core.job_request import output_lease_location
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.arrow_shards import arrow_shards
from zero_assets.defs.automation import EAGER, JOB_RETRY_POLICY
from zero_assets.launch.metadata import upstream_metadata
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import upstream_output

# The code that warms on either backend: one code version for both, as Dagster reads it once.
WARM_CODE = (
    "zero_assets.backends.local.warm_state",
    "zero_assets.backends.sagemaker.training_set_channel",
    "zero_assets.backends.sagemaker.fsx_warm",
    "training_code.warm",
)


@asset(
    code_version=code_version(*WARM_CODE),
    deps=[arrow_shards],
    automation_condition=EAGER,
    group_name="zero",
    kinds={"sagemaker", "arrow"},
    retry_policy=JOB_RETRY_POLICY,
)
def fsx_warm_state(context: AssetExecutionContext, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    """The shard set where the trainer reads it (a folder, FSx for Lustre or S3), every shard verified, the
    manifest last; the data version is arrow_shards', so rewarming does not make training stale."""
    shards = upstream_output(context, "arrow_shards")
    inputs = warm_inputs(type(jobs).__name__, shards)
    output = jobs.warm_location(shards)
    lease = warm_lease(settings, inputs, output)
    return materialize_once(
        context,
        inputs=inputs,
        output=output,
        lease=lease,
        build=lambda: warm_materialization(jobs.warm_shards(context, shards, lease), shards),
        known={"upstream": upstream_metadata([shards])},
        skipped="shards already warm",
    )


def warm_inputs(backend: str, shards: UpstreamOutput) -> FingerprintInputs:
    """What a warm of `shards` by `backend` (its runner's class name) is keyed by, with the code as it is now."""
    return FingerprintInputs(
        current_code_version(*WARM_CODE), {"backend": backend}, {shards.asset: shards.data_version}
    )


def warm_lease(settings: ZeroSettings, inputs: FingerprintInputs, output: str) -> str:
    """The lease the fsx_warm_state step holds while it warms into `output`; its warm job names it too."""
    return output_lease_location(settings.jobs_root(), "fsx_warm_state", inputs.fingerprint, output)


WARM_COUNTS = ("copied", "copied_bytes", "already_warm", "verified", "verified_bytes", "reused_verdicts")


def warm_materialization(warmed: WarmedShards, shards: UpstreamOutput) -> MaterializeResult:
    counts: dict[str, Any] = {name: value for name in WARM_COUNTS if (value := getattr(warmed, name)) is not None}
    return MaterializeResult(
        metadata={
            **{name: MetadataValue.path(where) for name, where in warmed.paths.items()},
            "dagster/row_count": warmed.rows,
            "dagster/size_bytes": warmed.bytes,
            "shards": warmed.shards,
            **warmed.details,
            **counts,  # after the details, which may use the same names in words
            "upstream": upstream_metadata([shards]),
        },
        data_version=DataVersion(shards.data_version),
    )

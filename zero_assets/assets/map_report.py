"""`map_report`: COCO metrics of the checkpoint on the val shards, run as a Processing job."""

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset

from ..fingerprints import upstream_output
from ..job_launch import launch_job
from ..resources.job_runner import JobRunner
from ..resources.settings import ZeroSettings
from ..automation import AFTER_CHECKPOINT
from .fsx_warm_state import fsx_warm_state
from .trained_checkpoint import trained_checkpoint
from .job_retry import JOB_RETRY_POLICY


class EvalConfig(Config):
    split: str = "val"
    score_threshold: float = 0.0  # keep every detection: COCO mAP integrates over the score ranking


@asset(deps=[trained_checkpoint, fsx_warm_state], automation_condition=AFTER_CHECKPOINT, group_name="zero", kinds={"json"}, retry_policy=JOB_RETRY_POLICY)
def map_report(context: AssetExecutionContext, config: EvalConfig, settings: ZeroSettings, jobs: JobRunner) -> MaterializeResult:
    """mAP, mAP@0.5, mAP@0.75 and per-class AP of the checkpoint on the held-out split."""
    checkpoint = upstream_output(context, "trained_checkpoint")
    shards = upstream_output(context, "fsx_warm_state")
    result = launch_job(
        context,
        jobs=jobs,
        settings=settings,
        kind="processing",
        module="training_code.evaluate",
        config=config.model_dump(),
        upstream=[checkpoint, shards],
        inputs={"model": checkpoint.uri, "shards": shards.uri},
    )
    # The job draws these beside metrics.json; the paths are where they were published.
    out = str(result.metadata["uri"].value).rstrip("/")
    pictures = {f"{name}_png": MetadataValue.path(f"{out}/{name}.png") for name in ("pr_curve", "sample_predictions")}
    return MaterializeResult(metadata={**result.metadata, **pictures}, data_version=result.data_version)

"""`map_report`: COCO metrics of the checkpoint on the val shards, run as a Processing job."""

from typing import Any, Literal

from dagster import AssetExecutionContext, Config, MaterializeResult, MetadataValue, asset
from pydantic import Field

from training_code.lib.storage import exists
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import UpstreamOutput, check_job_module, code_version
from zero_assets.core.job_request import MODULE_NAME_PATTERN
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.trained_checkpoint import trained_checkpoint
from zero_assets.defs.automation import AFTER_CHECKPOINT, JOB_RETRY_POLICY
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import rounded_for_display
from zero_assets.launch.upstream import upstream_output

EVALUATE_MODULE = "training_code.evaluate"  # the UI's code version; the cache fingerprints the config's module


class EvalConfig(Config):
    module: str = Field(
        EVALUATE_MODULE,
        pattern=MODULE_NAME_PATTERN,
        description=(
            "Evaluation script, run as `python -m <module> --model DIR --shards DIR --out DIR ...`: the default, "
            'or your own module keeping the contract in docs/local-backend.md ("Your own trainer"), '
            "paired with the trainer whose model folder it reads."
        ),
    )
    split: Literal["val", "train"] = Field(
        "val", description="Which split of the shards to evaluate on: val (held-out groups) or train."
    )
    score_threshold: float = Field(
        0.0,
        description=(
            "Drop detections scoring below this. 0 keeps every detection: COCO mAP integrates over the score ranking."
        ),
    )
    wandb_mode: Literal["as_training", "offline", "online", "disabled"] = Field(
        "as_training",
        description=(
            "W&B mode of the evaluation run, logged in the checkpoint's project and group; "
            "as_training: the training run's mode."
        ),
    )

    def arguments(self) -> dict:
        """The script's `--key value` arguments the fingerprint covers: all but the module and tracking."""
        return self.model_dump(exclude={"module", "wandb_mode"})

    def tracking(self) -> dict:
        return {"wandb_mode": self.wandb_mode}


def evaluation_job(config: EvalConfig, checkpoint: UpstreamOutput, shards: UpstreamOutput) -> dict[str, Any]:
    return {
        "kind": "processing",
        "module": config.module,
        "config": config.arguments(),
        "tracking": config.tracking(),
        "upstream": [checkpoint, shards],
        "inputs": {"model": checkpoint.uri, "shards": shards.uri},
    }


@asset(
    code_version=code_version(EVALUATE_MODULE),
    deps=[trained_checkpoint, fsx_warm_state],
    automation_condition=AFTER_CHECKPOINT,
    group_name="zero",
    kinds={"sagemaker", "pytorch", "wandb"},
    retry_policy=JOB_RETRY_POLICY,
)
def map_report(
    context: AssetExecutionContext, config: EvalConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """mAP, mAP@0.5, mAP@0.75 and per-class AP of the checkpoint on the held-out split."""
    check_job_module(config.module, "map_report config field `module`")
    checkpoint = upstream_output(context, "trained_checkpoint")
    shards = upstream_output(context, "fsx_warm_state")
    result = launch_job(context, jobs=jobs, settings=settings, **evaluation_job(config, checkpoint, shards))
    out = str(result.metadata["dagster/uri"].value).rstrip("/")
    pictures = {
        f"{name}_png": MetadataValue.path(f"{out}/{name}.png")
        for name in ("pr_curve", "sample_predictions")
        if exists(f"{out}/{name}.png")  # the default evaluator draws these; another may not
    }
    return MaterializeResult(
        metadata={**rounded_for_display(result.metadata), **pictures}, data_version=result.data_version
    )

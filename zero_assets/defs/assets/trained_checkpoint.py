"""`trained_checkpoint`: the detector trained from scratch on the warm shards, run as a Training job."""

from collections.abc import Iterator
from typing import Any, Literal

from dagster import AssetCheckResult, AssetCheckSpec, AssetExecutionContext, Config, Failure, MaterializeResult, asset
from pydantic import Field

from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, check_job_module, code_version
from zero_assets.core.job_request import MODULE_NAME_PATTERN
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.tuning_record import tuned_values
from zero_assets.defs.automation import JOB_RETRY_POLICY, TRAINING
from zero_assets.defs.rehearsal_gate import REHEARSAL_CHECK, training_gate
from zero_assets.launch.materialize import launch_job
from zero_assets.launch.metadata import rounded_for_display
from zero_assets.launch.upstream import upstream_output

TRAINING_POOL = "training"  # how many train at once: the pool's limit in the instance config (dagster.yaml)
TRAIN_MODULE = "training_code.train"  # the UI's code version; the cache fingerprints the config's module


class TrainConfig(Config):
    module: str = Field(
        TRAIN_MODULE,
        pattern=MODULE_NAME_PATTERN,
        description=(
            "Training script, run as `torchrun -m <module>` (SageMaker: its file as the entry point): the default, "
            'or your own module keeping the contract in docs/local-backend.md ("Your own trainer"). '
            "The cache fingerprints its code; the UI's code version stays the default's."
        ),
    )
    # training_code.lib.model.ARCHITECTURES, spelled out so this process need not import torch (a test checks).
    arch: Literal[
        "fcos_tiny",
        "fcos_resnet50_fpn",
        "retinanet_resnet50_fpn_v2",
        "fasterrcnn_mobilenet_v3_large_fpn",
        "fasterrcnn_resnet50_fpn_v2",
    ] = Field(
        "fcos_tiny",
        description="Detector: fcos_tiny (small, CPU-friendly) or a torchvision builder, initialised from scratch.",
    )
    width: int = Field(32, description="Channel width of fcos_tiny's backbone and FPN (a multiple of 32).")
    min_size: int = Field(160, description="Images are resized so the shorter side is at least this many pixels.")
    max_size: int = Field(320, description="... and the longer side at most this many pixels.")
    max_steps: int = Field(200, description="Optimizer steps to train for.")
    batch_size: int = Field(8, description="Images per step per process.")
    lr: float = Field(2e-3, description="Learning rate.")
    seed: int = Field(0, description="Seed of weight initialisation and data order.")
    checkpoint_every: int = Field(50, description="Save a resumable checkpoint every this many steps.")
    processes: int = Field(2, description="torchrun --nproc_per_node: one per GPU; on CPU, one per core.")
    use_tuning: bool = Field(
        False,
        description="Train with the best values of the newest tuned_hyperparameters of this data and trainer code "
        "(they replace the fields it tuned); fails when there is none.",
    )
    wandb_mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description=(
            "W&B: offline writes the run under the job's output data folder (or WANDB_DIR) for `wandb sync`, "
            "its folder in the metadata; online sends it to wandb_base_url, its URL in the metadata "
            "(key: docs/configuration.md, 'Weights & Biases')."
        ),
    )
    wandb_project: str = Field("zero", description="W&B project of the training run and of its evaluations.")
    wandb_entity: str = Field("", description="W&B team or user; empty: the API key's default entity.")
    wandb_group: str = Field(
        "",
        description="W&B group of the training run and of every evaluation of its checkpoint; empty: "
        "checkpoint-<fingerprint16>, the name of the checkpoint's output and checkpoint folders.",
    )
    wandb_base_url: str = Field(
        "https://api.wandb.ai", description="W&B server for online mode (your own server, or W&B's cloud)."
    )

    def hyperparameters(self) -> dict:
        """The script's `--key value` arguments the fingerprint covers: all but launch and tracking fields."""
        return self.model_dump(exclude={"processes", "module", "use_tuning", *WANDB_FIELDS})

    def tracking(self, fingerprint: str) -> dict:
        """The W&B arguments (outside the fingerprint), grouped by default by the input `fingerprint`."""
        chosen = {
            **self.model_dump(include=WANDB_FIELDS),
            "wandb_group": self.wandb_group or f"checkpoint-{fingerprint[:16]}",
        }
        if self.wandb_mode != "online":
            chosen.pop("wandb_base_url")  # named only where metrics would leave the machine
        return {key: value for key, value in chosen.items() if value != ""}


WANDB_FIELDS = {"wandb_mode", "wandb_project", "wandb_entity", "wandb_group", "wandb_base_url"}


def training_job(
    config: TrainConfig, hyperparameters: dict[str, Any], tracking: dict[str, Any], upstream: list[UpstreamOutput]
) -> dict[str, Any]:
    """The training job on the warm shards (`upstream[0]`), `build_job_request`'s fields."""
    return {
        "kind": "training",
        "module": config.module,
        "config": hyperparameters,
        "tracking": tracking,
        "upstream": upstream,
        "inputs": {"train": upstream[0].uri},
        "processes_per_host": config.processes,
    }


@asset(
    code_version=code_version(TRAIN_MODULE),
    deps=[fsx_warm_state],  # a tuning it trains with is named in its metadata: an optional input, no edge
    automation_condition=TRAINING,
    pool=TRAINING_POOL,
    group_name="zero",
    kinds={"sagemaker", "pytorch", "wandb"},
    retry_policy=JOB_RETRY_POLICY,
    check_specs=[
        AssetCheckSpec(
            REHEARSAL_CHECK,
            asset="trained_checkpoint",
            blocking=True,
            description="a training_rehearsal of this code version and configuration (less the scale knobs) passed",
        )
    ],
)
def trained_checkpoint(
    context: AssetExecutionContext, config: TrainConfig, settings: ZeroSettings, jobs: JobRunner
) -> Iterator[MaterializeResult | AssetCheckResult]:
    """`model.pt` (weights, model config, categories, step) trained under torchrun on the warm shards; where the
    rehearsal gate is enforced, fails without launching unless a rehearsal of this training passed."""
    check_job_module(config.module, "trained_checkpoint config field `module`")
    warm = upstream_output(context, "fsx_warm_state")
    hyperparameters, upstream, tuning = config.hyperparameters(), [warm], {}
    if config.use_tuning:
        tuned, tuned_output, tuning = tuned_values(context, config.module, warm)
        hyperparameters, upstream = {**hyperparameters, **tuned}, [warm, tuned_output]
    tracking = config.tracking(FingerprintInputs.of(config.module, hyperparameters, upstream).fingerprint)
    gate = training_gate(context.instance, jobs, config.module, hyperparameters, tracking)
    refusal = gate.refusal("trained_checkpoint")
    if refusal is not None:
        yield gate.check_result()
        raise Failure(refusal, allow_retries=False)  # a retry finds no rehearsal either
    result = launch_job(
        context, jobs=jobs, settings=settings, **training_job(config, hyperparameters, tracking, upstream)
    )
    yield MaterializeResult(
        metadata={**rounded_for_display(result.metadata), **tuning},
        data_version=result.data_version,
        check_results=[gate.check_result()],
    )

"""`training_rehearsal`: the production trainer and evaluator for a few steps on cheap instances; its pass
is what `trained_checkpoint`'s gate asks for."""

from dagster import AssetExecutionContext, Config, Failure, MaterializeResult, MetadataValue, asset
from pydantic import Field

from zero_assets.backends.job_runner import JobRunner
from zero_assets.backends.preflight import failed
from zero_assets.core.fingerprints import (
    FingerprintInputs,
    check_job_module,
    code_version,
    current_code_version,
    rehearsal_key,
)
from zero_assets.core.job_request import output_lease_location
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.map_report import EVALUATE_MODULE, EvalConfig
from zero_assets.defs.assets.trained_checkpoint import TRAIN_MODULE, TRAINING_POOL, TrainConfig
from zero_assets.defs.rehearsal_gate import REHEARSAL_KEY, REHEARSAL_KEY_INPUTS, training_key_inputs
from zero_assets.defs.rehearsal_run import rehearsal_jobs, run_rehearsal
from zero_assets.launch.metadata import upstream_metadata
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import upstream_output

REHEARSAL_CODE = (TRAIN_MODULE, EVALUATE_MODULE)


class RehearsalConfig(Config):
    training: TrainConfig = Field(
        default_factory=TrainConfig,
        description=(
            "The training to rehearse, as trained_checkpoint takes it (its run config's `config`): the rehearsal "
            "passes for this module, code version and configuration, less the scale knobs (max_steps, "
            "checkpoint_every, processes), which the fields below set."
        ),
    )
    evaluation: EvalConfig = Field(
        default_factory=EvalConfig, description="The evaluator to run on the rehearsal's model, as map_report takes it."
    )
    steps: int = Field(6, ge=2, description="Optimizer steps the rehearsal trains (its max_steps).")
    stop_after_steps: int = Field(
        3, ge=1, description="The forced stop: the first attempt checkpoints and stops after this many steps."
    )
    processes: int = Field(
        2,
        ge=2,
        description=(
            "Local backend: torchrun --nproc_per_node, a world of at least two. SageMaker: its instances "
            "(ZERO_SM_TRAINING_REHEARSAL_INSTANCE_COUNT, default 2) each run one process per GPU."
        ),
    )


@asset(
    code_version=code_version(*REHEARSAL_CODE),
    deps=[fsx_warm_state],
    pool=TRAINING_POOL,
    group_name="campaign",
    kinds={"sagemaker", "pytorch", "wandb"},
)
def training_rehearsal(
    context: AssetExecutionContext, config: RehearsalConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """Preflight, the production trainer force-stopped and resumed on two nodes or more, then the evaluator;
    materialized only when every proof held (`rehearsal.json`)."""
    training, evaluation = config.training, config.evaluation
    check_job_module(training.module, "training_rehearsal config field `training.module`")
    check_job_module(evaluation.module, "training_rehearsal config field `evaluation.module`")
    if config.stop_after_steps >= config.steps:
        raise Failure(
            f"training_rehearsal config: stop_after_steps ({config.stop_after_steps}) must be below steps "
            f"({config.steps}), so the resumed attempt has steps left to train"
        )
    warm = upstream_output(context, "fsx_warm_state")
    hyperparameters = training.hyperparameters()
    key_inputs = training_key_inputs(jobs, training.module, hyperparameters, training.tracking("0" * 16))
    key = rehearsal_key(key_inputs)
    train_arguments = {**hyperparameters, "max_steps": config.steps, "checkpoint_every": config.steps}
    inputs = FingerprintInputs(
        current_code_version(training.module, evaluation.module),
        {
            "training": train_arguments,
            "tracking": key_inputs["tracking"],
            "evaluation": {**evaluation.arguments(), **evaluation.tracking()},
            "modules": [training.module, evaluation.module],
            "stop_after_steps": config.stop_after_steps,
            "processes": config.processes,
            "environment": jobs.environment(),
        },
        {warm.asset: warm.data_version},
    )
    tracking = training.tracking(inputs.fingerprint)
    findings = jobs.preflight(settings, tracking)
    for finding in findings:
        context.log.info(f"preflight {'ok' if finding.ok else 'FAILED'}: {finding.line()}")
    problems = failed(findings)
    if problems:
        raise Failure(
            "rehearsal not started, preflight failed: " + "; ".join(finding.line() for finding in problems),
            metadata={"preflight": MetadataValue.md("\n".join(f"- {f.line()}" for f in findings))},
            allow_retries=False,
        )
    output = settings.asset_uri("training_rehearsal", inputs.fingerprint[:16])
    lease = output_lease_location(settings.jobs_root(), "training_rehearsal", inputs.fingerprint, output)
    planned = rehearsal_jobs(
        output=output,
        build_id=f"{context.run.run_id}/{context.retry_number}",
        training=(training.module, {**train_arguments, **tracking}),
        evaluation=(evaluation.module, {**evaluation.arguments(), **evaluation.tracking()}),
        processes=config.processes,
        stop_after_steps=config.stop_after_steps,
        steps=config.steps,
        key=key,
        key_inputs=key_inputs,
        warm=warm,
        lease=lease,
    )
    return materialize_once(
        context,
        inputs=inputs,
        output=output,
        lease=lease,
        build=lambda: run_rehearsal(context, jobs, planned, findings, output),
        known={
            REHEARSAL_KEY: key,
            REHEARSAL_KEY_INPUTS: MetadataValue.json(key_inputs),
            "upstream": upstream_metadata([warm]),
        },
        skipped="this rehearsal already passed",
    )

"""`tuned_hyperparameters`: a search over the trainer's hyperparameters on the warm shards, as a SageMaker
tuning job or local trials; `trained_checkpoint` trains with its best trial's values when `use_tuning` is set."""

import json
from typing import Any, Literal

from dagster import AssetExecutionContext, Config, DataVersion, Failure, MaterializeResult, MetadataValue, asset
from pydantic import Field

from training_code.lib.hashing import sha256_json
from training_code.lib.storage import join, write_bytes_atomic
from zero_assets.backends.job_runner import JobRunner
from zero_assets.core.fingerprints import FingerprintInputs, UpstreamOutput, check_job_module, code_version
from zero_assets.core.job_request import JobRequest, build_job_request
from zero_assets.core.settings import ZeroSettings
from zero_assets.core.tuning import ParameterRange, TuningSpec, typed_like
from zero_assets.defs.assets.fsx_warm_state import fsx_warm_state
from zero_assets.defs.assets.trained_checkpoint import TRAIN_MODULE, TRAINING_POOL, TrainConfig
from zero_assets.defs.assets.tuning_record import BEST, RECORD, TUNED_FOR, TUNING_ASSET, latest_tuning, tuned_for
from zero_assets.defs.automation import JOB_RETRY_POLICY
from zero_assets.defs.rehearsal_gate import training_gate
from zero_assets.launch.metadata import upstream_metadata
from zero_assets.launch.once import materialize_once
from zero_assets.launch.upstream import upstream_output


class RangeConfig(Config):
    name: str = Field(description="A trainer hyperparameter (a trained_checkpoint config field), e.g. lr.")
    kind: Literal["continuous", "integer", "categorical"] = "continuous"
    low: float = Field(0.0, description="continuous and integer: the lowest value tried")
    high: float = Field(0.0, description="continuous and integer: the highest value tried")
    scaling: Literal["Auto", "Linear", "Logarithmic", "ReverseLogarithmic"] = "Auto"
    values: list[str] = Field(default_factory=list, description="categorical: the values tried")


class TuningConfig(Config):
    training: TrainConfig = Field(
        default_factory=TrainConfig,
        description="The training each trial runs, as trained_checkpoint takes it; the ranges set the tuned fields.",
    )
    ranges: list[RangeConfig] = Field(
        default_factory=lambda: [RangeConfig(name="lr", low=5e-4, high=1e-2, scaling="Logarithmic")],
        description="SageMaker's ParameterRanges: each a hyperparameter and the values to try.",
    )
    objective_metric: str = Field(
        "final_loss", description="A number the trainer logs as a key of its JSON lines (and reports)."
    )
    objective_type: Literal["Minimize", "Maximize"] = "Minimize"
    strategy: Literal["Bayesian", "Random", "Hyperband", "Grid"] = Field(
        "Bayesian", description="SageMaker's search; the local backend runs Bayesian and Hyperband as Random."
    )
    max_trials: int = Field(4, ge=1, description="Trials in all (Grid: at most this many combinations locally).")
    max_parallel_trials: int = Field(2, ge=1, description="Trials at a time.")
    early_stopping: Literal["Off", "Auto"] = Field("Off", description="SageMaker stops trials that lag (Auto).")
    warm_start: bool = Field(
        True, description="Start from the newest earlier tuning of the same data and trainer code."
    )
    seed: int = Field(0, description="Seed of the search's draws.")
    trial_processes: int = Field(1, ge=1, description="torchrun --nproc_per_node of each local trial.")

    def spec(self) -> TuningSpec:
        ranges = tuple(ParameterRange(**{**r.model_dump(), "values": tuple(r.values)}) for r in self.ranges)
        fields = ("objective_metric", "objective_type", "strategy", "max_trials", "max_parallel_trials")
        return TuningSpec(
            ranges, **{f: getattr(self, f) for f in fields}, early_stopping=self.early_stopping, seed=self.seed
        )


def tuning_request(
    settings: ZeroSettings, config: TuningConfig, warm: UpstreamOutput
) -> tuple[JobRequest, TuningSpec, FingerprintInputs]:
    """The training request every trial varies, the search, and what the tuning is built from."""
    training, spec = config.training, config.spec()
    hyperparameters = training.hyperparameters()
    spec.check(hyperparameters, f"{TUNING_ASSET} config")
    search = config.model_dump(exclude={"training", "warm_start", "trial_processes"})
    inputs = FingerprintInputs.of(training.module, {"training": hyperparameters, "search": search}, [warm])
    tracking = training.tracking(inputs.fingerprint)
    tracking["wandb_group"] = training.wandb_group or f"tuning-{inputs.fingerprint[:16]}"
    request = build_job_request(
        TUNING_ASSET,
        settings=settings,
        kind="training",
        module=training.module,
        config=inputs.config,
        fingerprint_inputs=inputs,
        arguments=hyperparameters,
        tracking=tracking,
        upstream=[warm],
        inputs={"train": warm.uri},
        processes_per_host=config.trial_processes,
    )
    return request, spec, inputs


@asset(
    code_version=code_version(TRAIN_MODULE),
    deps=[fsx_warm_state],
    pool=TRAINING_POOL,
    group_name="campaign",
    kinds={"sagemaker", "pytorch"},
    retry_policy=JOB_RETRY_POLICY,  # a retry reattaches to the tuning job of the same name
)
def tuned_hyperparameters(
    context: AssetExecutionContext, config: TuningConfig, settings: ZeroSettings, jobs: JobRunner
) -> MaterializeResult:
    """The best trial's hyperparameters of a search on the warm shards (`manifest.json`: every trial)."""
    training = config.training
    check_job_module(training.module, f"{TUNING_ASSET} config field `training.module`")
    warm = upstream_output(context, "fsx_warm_state")
    try:
        request, spec, inputs = tuning_request(settings, config, warm)
    except ValueError as error:
        raise Failure(str(error), allow_retries=False) from None
    tuned = [r.name for r in spec.ranges]
    gate = training_gate(
        context.instance, jobs, training.module, training.hyperparameters(), training.tracking(request.fingerprint)
    )
    refusal = gate.refusal(TUNING_ASSET)
    if refusal is not None:
        raise Failure(refusal, allow_retries=False)
    key = tuned_for(training.module, warm)
    earlier = latest_tuning(context, key) if config.warm_start else None
    output = request.outputs["out"]

    def build() -> MaterializeResult:
        run = jobs.tune(context, request, spec, earlier[1] if earlier else None)
        if run.best is None:
            raise Failure(f"{TUNING_ASSET}: no trial of {run.job} reported {spec.objective_metric}")
        base = training.hyperparameters()  # SageMaker reports values as text: typed as the trainer takes them
        best = {
            name: typed_like(base[name], value) for name, value in run.best["hyperparameters"].items() if name in tuned
        }
        record = {"job": run.job, "objective_metric": spec.objective_metric, "best": run.best, "trials": run.trials}
        write_bytes_atomic(join(output, RECORD), json.dumps(record, indent=1, sort_keys=True).encode())
        return MaterializeResult(
            metadata={
                BEST: MetadataValue.json(best),
                "best_objective": run.best["objective"],
                "objective": f"{spec.objective_type} {spec.objective_metric}",
                "tuning_job": run.job,
                "strategy": spec.strategy,
                "trials": len(run.trials),
                "trials_failed": sum(t["objective"] is None for t in run.trials),
                "warm_started_from": earlier[1]["job"] if earlier else None,
                "trial_table": MetadataValue.md(_trial_table(run.trials, tuned)),
                TUNED_FOR: key,
                "upstream": upstream_metadata([warm]),
                **run.cost,
            },
            data_version=DataVersion(sha256_json({"best": best, "for": key})[:16]),
        )

    return materialize_once(
        context,
        inputs=inputs,
        output=output,
        lease=request.lease,
        build=build,
        known={TUNED_FOR: key, "upstream": upstream_metadata([warm])},
        skipped="this search already ran",
    )


def _trial_table(trials: list[dict[str, Any]], tuned: list[str]) -> str:
    rows = [f"| job | {' | '.join(tuned)} | objective | status |", "|" + " --- |" * (len(tuned) + 3)]
    for trial in trials:
        values = " | ".join(str(trial["hyperparameters"].get(name)) for name in tuned)
        rows.append(f"| {trial['job']} | {values} | {trial['objective']} | {trial['status']} |")
    return "\n".join(rows)

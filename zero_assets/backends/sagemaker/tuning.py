"""A tuning as one SageMaker CreateHyperParameterTuningJob: its parameters (pure) and its run.

The trial definition is the training job's own CreateTrainingJob request less what differs per trial or
would be shared by every trial: the name, the tuned hyperparameters, the job-name variable and the
checkpoint prefix. Trials report through their metrics (MetricDefinitions), not Pipes.
"""

from __future__ import annotations

import time
from typing import Any

from dagster import AssetExecutionContext, Failure

from zero_assets.backends.sagemaker.code_package import CodePackage
from zero_assets.backends.sagemaker.job_params import build_job_params
from zero_assets.backends.sagemaker.settings import SageMakerSettings
from zero_assets.core.job_request import JobRequest
from zero_assets.core.tuning import TuningSpec

OPERATION = "CreateHyperParameterTuningJob"
DONE = ("Completed", "Failed", "Stopped")
# CreateTrainingJob fields a trial definition takes as they are.
_SHARED = (
    "RoleArn",
    "InputDataConfig",
    "OutputDataConfig",
    "StoppingCondition",
    "VpcConfig",
    "EnableManagedSpotTraining",
)


def tuning_job_name(fingerprint: str, attempt: int = 1) -> str:
    """`zero-tune-<fingerprint16>-a<attempt>`: 29 characters, within SageMaker's 32."""
    return f"zero-tune-{fingerprint[:16]}-a{attempt}"


def tuning_params(
    request: JobRequest,
    aws: SageMakerSettings,
    lake_uri: str,
    spec: TuningSpec,
    package: CodePackage,
    parent: str | None,
) -> dict[str, Any]:
    """The CreateHyperParameterTuningJob request of the training `request`'s search."""
    name = tuning_job_name(request.fingerprint)
    _, training = build_job_params(request, aws, job_name=name, code=package, environment={}, lake_uri=lake_uri)
    training.pop("CheckpointConfig")  # shared by every trial, each would resume another's checkpoint
    return build_tuning_params(training, spec, name, parent)


def build_tuning_params(training: dict[str, Any], spec: TuningSpec, name: str, parent: str | None) -> dict[str, Any]:
    """CreateHyperParameterTuningJob for `training`; `parent`: an earlier tuning to warm-start from."""
    tuned = {r.name.replace("_", "-") for r in spec.ranges}
    environment = {k: v for k, v in training["Environment"].items() if k != "ZERO_JOB_NAME"}
    resources = {k: v for k, v in training["ResourceConfig"].items() if k != "KeepAlivePeriodInSeconds"}
    definition = {
        "StaticHyperParameters": {k: v for k, v in training["HyperParameters"].items() if k not in tuned},
        "AlgorithmSpecification": {
            **training["AlgorithmSpecification"],
            "MetricDefinitions": spec.metric_definitions(),
        },
        "ResourceConfig": resources,
        "Environment": environment,
        **{field: training[field] for field in _SHARED if field in training},
    }
    limits = {"MaxParallelTrainingJobs": spec.max_parallel_trials}
    if spec.strategy != "Grid":  # Grid runs every combination
        limits["MaxNumberOfTrainingJobs"] = spec.max_trials
    params: dict[str, Any] = {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobConfig": {
            "Strategy": spec.strategy,
            "HyperParameterTuningJobObjective": {"Type": spec.objective_type, "MetricName": spec.objective_metric},
            "ResourceLimits": limits,
            "ParameterRanges": _ranges(spec),
            "TrainingJobEarlyStoppingType": spec.early_stopping,
            "RandomSeed": spec.seed,
        },
        "TrainingJobDefinition": definition,
        "Tags": training.get("Tags", []),
    }
    if parent:
        params["WarmStartConfig"] = {
            "ParentHyperParameterTuningJobs": [{"HyperParameterTuningJobName": parent}],
            "WarmStartType": "IdenticalDataAndAlgorithm",
        }
    return params


def _ranges(spec: TuningSpec) -> dict[str, list[dict[str, Any]]]:
    ranges: dict[str, list[dict[str, Any]]] = {}
    for tuned in spec.ranges:
        name = tuned.name.replace("_", "-")
        if tuned.kind == "categorical":
            ranges.setdefault("CategoricalParameterRanges", []).append({"Name": name, "Values": list(tuned.values)})
            continue
        bounds = (int(tuned.low), int(tuned.high)) if tuned.kind == "integer" else (tuned.low, tuned.high)
        ranges.setdefault(f"{tuned.kind.capitalize()}ParameterRanges", []).append(
            {"Name": name, "MinValue": str(bounds[0]), "MaxValue": str(bounds[1]), "ScalingType": tuned.scaling}
        )
    return ranges


def run_tuning(
    context: AssetExecutionContext, sagemaker: Any, params: dict[str, Any], spec: TuningSpec, poll_s: float
) -> dict[str, Any]:
    """Create the tuning job unless it exists, wait for it: its trials and best trial."""
    name = params["HyperParameterTuningJobName"]
    try:
        described = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
        context.log.info(f"reattaching to tuning job {name} ({described['HyperParameterTuningJobStatus']})")
    except sagemaker.exceptions.ResourceNotFound:
        sagemaker.create_hyper_parameter_tuning_job(**params)
        context.log.info(f"launched tuning job {name}: {spec.max_trials} trials, {spec.max_parallel_trials} at a time")
        described = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    while described["HyperParameterTuningJobStatus"] not in DONE:
        time.sleep(poll_s)
        described = sagemaker.describe_hyper_parameter_tuning_job(HyperParameterTuningJobName=name)
    status = described["HyperParameterTuningJobStatus"]
    trials = [_trial(summary) for summary in _summaries(sagemaker, name)]
    if status != "Completed" and not any(t["objective"] is not None for t in trials):
        raise Failure(f"tuning job {name} {status}: {described.get('FailureReason', 'no reason given')}")
    best = described.get("BestTrainingJob")
    return {"job": name, "status": status, "trials": trials, "best": _trial(best) if best else None}


def _summaries(sagemaker: Any, name: str) -> list[dict[str, Any]]:
    pages = sagemaker.get_paginator("list_training_jobs_for_hyper_parameter_tuning_job")
    return [s for page in pages.paginate(HyperParameterTuningJobName=name) for s in page["TrainingJobSummaries"]]


def _trial(summary: dict[str, Any]) -> dict[str, Any]:
    metric = summary.get("FinalHyperParameterTuningJobObjectiveMetric") or {}
    started, ended = summary.get("TrainingStartTime"), summary.get("TrainingEndTime")
    return {
        "job": summary["TrainingJobName"],
        "hyperparameters": {k.replace("-", "_"): v for k, v in summary["TunedHyperParameters"].items()},
        "objective": metric.get("Value"),
        "status": summary["TrainingJobStatus"],
        "seconds": (ended - started).total_seconds() if started and ended else None,
    }

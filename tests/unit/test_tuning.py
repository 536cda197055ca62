"""The search itself, without jobs: local draws, the refusals that name the field, the metric the trainer's
JSON lines carry, the rehearsal key that one rehearsal of a sweep satisfies, and the SageMaker tuning job's
create-wait-read under botocore's Stubber (every request and answer checked against SageMaker's model)."""

from __future__ import annotations

import json
import logging
import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from training_code.lib.job_env import JsonLines
from zero_assets.backends.sagemaker.tuning import build_tuning_params, run_tuning, tuning_job_name
from zero_assets.core.fingerprints import rehearsal_key, rehearsal_key_inputs
from zero_assets.core.tuning import ParameterRange, TuningSpec
from zero_assets.defs.assets.trained_checkpoint import TrainConfig

BASE = TrainConfig().hyperparameters()
LR = ParameterRange("lr", "continuous", 1e-4, 1e-2, "Logarithmic")


def test_random_draws_are_seeded_typed_and_within_their_ranges():
    spec = TuningSpec((LR, ParameterRange("batch_size", "integer", 2, 16)), strategy="Random", max_trials=20)
    trials = spec.local_trials(BASE)
    assert trials == spec.local_trials(BASE), "the same seed draws the same trials"
    assert len(trials) == 20 and len({t["lr"] for t in trials}) == 20
    assert all(1e-4 <= t["lr"] <= 1e-2 and isinstance(t["lr"], float) for t in trials)
    assert all(2 <= t["batch_size"] <= 16 and isinstance(t["batch_size"], int) for t in trials)
    assert all(t["arch"] == BASE["arch"] for t in trials), "what is not tuned is the base config"
    # Logarithmic: about as many draws below 1e-3 (the range's geometric middle) as above it.
    below = sum(t["lr"] < 1e-3 for t in TuningSpec((LR,), max_trials=400).local_trials(BASE))
    assert 140 < below < 260, below


def test_grid_runs_each_combination_once_with_the_trainers_types():
    spec = TuningSpec(
        (
            ParameterRange("arch", "categorical", values=("fcos_tiny", "fcos_resnet50_fpn")),
            ParameterRange("width", "categorical", values=("16", "32")),
        ),
        strategy="Grid",
        max_trials=10,
    )
    trials = spec.local_trials(BASE)
    assert sorted((t["arch"], t["width"]) for t in trials) == [
        ("fcos_resnet50_fpn", 16),
        ("fcos_resnet50_fpn", 32),
        ("fcos_tiny", 16),
        ("fcos_tiny", 32),
    ]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (TuningSpec((ParameterRange("learning_rate", "continuous", 0.1, 1),)), "range 'learning_rate' names none"),
        (TuningSpec((ParameterRange("lr", "continuous", 0.1, 0.1),)), "range 'lr' low 0.1 is not below high 0.1"),
        (TuningSpec((ParameterRange("lr", "continuous", 0, 1, "Logarithmic"),)), "needs low above 0"),
        (TuningSpec((LR,), strategy="Grid"), "Grid strategy takes categorical ranges only"),
        (TuningSpec((LR,), max_trials=2, max_parallel_trials=3), "max_parallel_trials 3"),
        (TuningSpec(()), "no ranges"),
    ],
)
def test_a_search_that_cannot_run_is_refused_naming_what_is_wrong(spec, named):
    with pytest.raises(ValueError, match=re.escape(named)) as refused:
        spec.check(BASE, "tuned_hyperparameters config")
    assert str(refused.value).startswith("tuned_hyperparameters config: ")


def test_the_metric_definitions_match_the_trainers_json_lines():
    record = logging.LogRecord("zero.train", logging.INFO, __file__, 1, "done", None, None)
    record.fields = {"event": "done", "final_loss": 1.25e-05, "loss": 0.8125, "steps": 200}
    line = JsonLines().format(record)
    found = {d["Name"]: re.search(d["Regex"], line) for d in TuningSpec((LR,)).metric_definitions()}
    assert set(found) == {"final_loss", "loss"} and all(found.values()), line
    assert float(found["final_loss"].group(1)) == 1.25e-05 and float(found["loss"].group(1)) == 0.8125


def test_one_rehearsal_key_covers_a_sweep_of_numbers_but_not_another_model():
    def key(**changed):
        return rehearsal_key(rehearsal_key_inputs("training_code.train", {**BASE, **changed}, {}, {"runner": "x"}))

    assert key(lr=0.0007, seed=3, batch_size=16) == key()
    assert key(arch="fcos_resnet50_fpn") != key()
    assert key(lr="0.001") != key(), "a number that arrives as text is another type"


TRAINING = {
    "TrainingJobName": "zero-tune-0123456789abcdef-a1",
    "RoleArn": "arn:aws:iam::123456789012:role/zero",
    "AlgorithmSpecification": {
        "TrainingImage": "123.dkr.ecr.us-east-1.amazonaws.com/t:1",
        "TrainingInputMode": "FastFile",
    },
    "HyperParameters": {"lr": "0.002", "batch-size": "8", "sagemaker_program": "training_code/train.py"},
    "OutputDataConfig": {"S3OutputPath": "s3://b/zero/jobs/"},
    "ResourceConfig": {"InstanceType": "ml.g5.2xlarge", "InstanceCount": 1, "VolumeSizeInGB": 100},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
    "Environment": {"ZERO_JOB_NAME": "zero-tune-0123456789abcdef-a1", "ZERO_ASSET": "tuned_hyperparameters"},
    "Tags": [{"Key": "team", "Value": "vision"}],
}


def test_a_sagemaker_tuning_is_created_once_waited_for_and_its_best_trial_read():
    spec = TuningSpec((LR,), max_trials=2, max_parallel_trials=2)
    name = tuning_job_name("0123456789abcdef" * 4)
    params = build_tuning_params(TRAINING, spec, name, parent="zero-tune-fedcba9876543210-a1")
    assert params["TrainingJobDefinition"]["StaticHyperParameters"] == {
        "batch-size": "8",
        "sagemaker_program": "training_code/train.py",
    }
    assert "ZERO_JOB_NAME" not in params["TrainingJobDefinition"]["Environment"]
    assert params["WarmStartConfig"]["WarmStartType"] == "IdenticalDataAndAlgorithm"
    started = datetime(2026, 12, 7, tzinfo=UTC)
    trials = [
        {
            "TrainingJobName": f"{name}-00{n}-abc",
            "TrainingJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:training-job/{name}-00{n}-abc",
            "CreationTime": started,
            "TrainingStartTime": started,
            "TrainingEndTime": started + timedelta(seconds=600),
            "TrainingJobStatus": "Completed",
            "TunedHyperParameters": {"lr": lr},
            "FinalHyperParameterTuningJobObjectiveMetric": {"MetricName": "final_loss", "Value": loss},
        }
        for n, (lr, loss) in enumerate([("0.0031", 0.5), ("0.0004", 0.75)], start=1)
    ]
    described = {
        "HyperParameterTuningJobName": name,
        "HyperParameterTuningJobArn": f"arn:aws:sagemaker:us-east-1:123456789012:hyper-parameter-tuning-job/{name}",
        "HyperParameterTuningJobConfig": params["HyperParameterTuningJobConfig"],
        "CreationTime": started,
        "TrainingJobStatusCounters": {},
        "ObjectiveStatusCounters": {},
    }
    client = boto3.client("sagemaker", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        asked = {"HyperParameterTuningJobName": name}
        stub.add_client_error("describe_hyper_parameter_tuning_job", "ResourceNotFound", expected_params=asked)
        stub.add_response("create_hyper_parameter_tuning_job", {"HyperParameterTuningJobArn": "arn:x"}, params)
        stub.add_response(
            "describe_hyper_parameter_tuning_job", {**described, "HyperParameterTuningJobStatus": "InProgress"}, asked
        )
        stub.add_response(
            "describe_hyper_parameter_tuning_job",
            {**described, "HyperParameterTuningJobStatus": "Completed", "BestTrainingJob": trials[0]},
            asked,
        )
        stub.add_response("list_training_jobs_for_hyper_parameter_tuning_job", {"TrainingJobSummaries": trials}, asked)
        context = SimpleNamespace(log=logging.getLogger("test"))
        found = run_tuning(context, client, params, spec, poll_s=0)
        stub.assert_no_pending_responses()
    assert found["job"] == name and found["status"] == "Completed"
    assert found["best"]["hyperparameters"] == {"lr": "0.0031"} and found["best"]["objective"] == 0.5
    assert [t["seconds"] for t in found["trials"]] == [600.0, 600.0]
    assert json.dumps(found)  # plain values: the record is written as JSON

"""`render-jobs`: every request passes botocore's validation, for both profiles, with and without FSx and spot."""

from __future__ import annotations

import json

import botocore.session
import pytest
from botocore.validate import validate_parameters

from zero_assets.backends.sagemaker.code_package import build_code_package
from zero_assets.ops.cli import main

BASE_ENV = {
    "ZERO_SM_REGION": "us-east-1",
    "ZERO_SM_ROLE_ARN": "arn:aws:iam::123456789012:role/zero-jobs",
    "ZERO_SM_BUCKET": "zero-ml-lake",
    "ZERO_SM_TRAINING_IMAGE_URI": (
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/pytorch-training:2.5.1-gpu-py311-cu124-ubuntu22.04-sagemaker"
    ),
    "ZERO_SM_PROCESSING_IMAGE_URI": "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-processing:1",
    "ZERO_SM_KMS_KEY_ID": "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
    "ZERO_SM_TAGS": "team=vision,cost-center=ml-42",
}
FSX_ENV = {
    "ZERO_SM_FSX_FILE_SYSTEM_ID": "fs-0123456789abcdef0",
    "ZERO_SM_FSX_MOUNT_NAME": "abcdefgh",
    "ZERO_SM_SUBNETS": "subnet-0a1b2c3d,subnet-4e5f6a7b",
    "ZERO_SM_SECURITY_GROUP_IDS": "sg-0123456789abcdef0",
}
SESSION = botocore.session.get_session()


def render(tmp_path, monkeypatch, env: dict) -> dict:
    for key in [
        k
        for k in list(__import__("os").environ)
        if k.startswith("ZERO_SM_") or k in ("ZERO_PROFILE", "ZERO_LAKE_URI", "ZERO_RAW_URI")
    ]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "jobs"
    assert main(["render-jobs", "--out", str(out)]) == 0
    return {path.name: json.loads(path.read_text()) for path in sorted(out.glob("*.json"))}


@pytest.mark.parametrize("profile", ["production", "rehearsal"])
@pytest.mark.parametrize("fsx", [False, True], ids=["s3", "fsx"])
@pytest.mark.parametrize("spot", [False, True], ids=["on-demand", "spot"])
def test_every_rendered_request_is_valid(tmp_path, monkeypatch, profile, fsx, spot):
    env = {
        **BASE_ENV,
        **(FSX_ENV if fsx else {}),
        "ZERO_PROFILE": profile,
        "ZERO_SM_USE_SPOT": "true" if spot else "false",
    }
    requests = render(tmp_path, monkeypatch, env)
    # Rehearsal spreads validation over two instances: a map job with the raw input split by key, a reduce job.
    validation = (
        {"validated_images-map.CreateProcessingJob.json", "validated_images-reduce.CreateProcessingJob.json"}
        if profile == "rehearsal"
        else {"validated_images.CreateProcessingJob.json"}
    )
    expected = validation | {
        "training_set.CreateProcessingJob.json",
        "arrow_shards.CreateProcessingJob.json",
        "trained_checkpoint.CreateTrainingJob.json",
        "tuned_hyperparameters.CreateHyperParameterTuningJob.json",
        "map_report.CreateProcessingJob.json",
    }
    if fsx:
        expected |= {
            "fsx_warm_state.CreateDataRepositoryAssociation.json",
            "fsx_warm_state.CreateDataRepositoryTask.json",
            "fsx_warm_state.CreateTrainingJob.json",
        }
    assert set(requests) == expected
    for filename, params in requests.items():
        operation = filename.split(".")[1]
        service = "fsx" if "DataRepository" in operation else "sagemaker"
        validate_parameters(params, SESSION.get_service_model(service).operation_model(operation).input_shape)

    training = requests["trained_checkpoint.CreateTrainingJob.json"]
    channel = training["InputDataConfig"][0]
    assert ("FileSystemDataSource" in channel["DataSource"]) == fsx
    assert channel["InputMode"] == ("File" if fsx else "FastFile")
    assert ("VpcConfig" in training) == fsx
    # Rehearsal turns spot off (quick answers); production keeps what is configured.
    assert training.get("EnableManagedSpotTraining", False) == (spot and profile == "production")
    assert training["ResourceConfig"]["InstanceCount"] == 2
    if profile == "rehearsal":
        assert training["ResourceConfig"]["InstanceType"] == "ml.g4dn.xlarge"
        mapped = requests["validated_images-map.CreateProcessingJob.json"]
        assert mapped["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 2
        # Every host is handed the read list and decodes its own part of it.
        assert {i["InputName"]: i["S3Input"]["S3DataDistributionType"] for i in mapped["ProcessingInputs"]} == {
            "code": "FullyReplicated",
            "reads": "FullyReplicated",
        }
        reduced = requests["validated_images-reduce.CreateProcessingJob.json"]
        assert reduced["ProcessingResources"]["ClusterConfig"]["InstanceCount"] == 1
        assert [i["S3Input"]["S3Uri"] for i in reduced["ProcessingInputs"] if i["InputName"] == "decoded"] == [
            o["S3Output"]["S3Uri"] + "/" for o in mapped["ProcessingOutputConfig"]["Outputs"]
        ]
    assert training["CheckpointConfig"]["S3Uri"].startswith("s3://zero-ml-lake/zero/checkpoints/trained_checkpoint/")
    # Validation and packing are never handed a raw prefix: a read list names what they fetch by key (stand-in
    # upstream versions here, so an empty one), under the runner's own prefix.
    for name in (*validation, "arrow_shards.CreateProcessingJob.json"):
        inputs = {i["InputName"]: i["S3Input"]["S3Uri"] for i in requests[name]["ProcessingInputs"]}
        asset = name.split(".")[0].split("-")[0]
        assert "raw" not in inputs and inputs["reads"].startswith(f"s3://zero-ml-lake/zero/reads/{asset}/"), inputs
    # Prefixes SageMaker downloads end in "/": `s3://b/raw` would also pull `raw-old/`, `<fp>` its `<fp>-map` sibling.
    prefixes = [
        i["S3Input"]["S3Uri"]
        for params in requests.values()
        for i in params.get("ProcessingInputs", [])
        if i["S3Input"]["S3DataType"] == "S3Prefix"
    ]
    prefixes += [
        c["DataSource"]["S3DataSource"]["S3Uri"]
        for params in requests.values()
        for c in params.get("InputDataConfig", [])
        if "S3DataSource" in c["DataSource"]
    ]
    prefixes += [params["CheckpointConfig"]["S3Uri"] for params in requests.values() if "CheckpointConfig" in params]
    assert prefixes and all(uri.endswith("/") and not uri.endswith("//") for uri in prefixes), prefixes
    # The training set of any number of sources: the jobs read the shard root that holds every source's
    # shard sets, told the training set's folder there; the evaluator gets exactly its files from S3.
    folder = training["HyperParameters"]["training-set"]
    assert folder.startswith("_training_sets/") and folder.count("/") == 1
    if fsx:
        assert channel["DataSource"]["FileSystemDataSource"]["DirectoryPath"] == "/abcdefgh/arrow_shards"
        warm = requests["fsx_warm_state.CreateTrainingJob.json"]
        assert warm["HyperParameters"]["training-set"] == folder
        assert (
            warm["InputDataConfig"][0]["DataSource"]["FileSystemDataSource"]["DirectoryPath"]
            == "/abcdefgh/arrow_shards"
        )
        # With stand-in upstream versions no shard is known to be new: the set's folder alone is imported.
        assert requests["fsx_warm_state.CreateDataRepositoryTask.json"]["Paths"] == [f"arrow_shards/{folder}"]
    else:
        assert channel["DataSource"]["S3DataSource"]["S3Uri"] == "s3://zero-ml-lake/zero/lake/arrow_shards/"
    evaluation = requests["map_report.CreateProcessingJob.json"]
    shards_input = next(i["S3Input"] for i in evaluation["ProcessingInputs"] if i["InputName"] == "shards")
    assert shards_input["S3DataType"] == "ManifestFile"
    assert shards_input["S3Uri"] == f"s3://zero-ml-lake/zero/lake/arrow_shards/{folder}/files.manifest"
    arguments = evaluation["AppSpecification"]["ContainerArguments"]
    assert arguments[arguments.index("--shards") + 1] == "/opt/ml/processing/input/shards"
    assert arguments[arguments.index("--training-set") + 1] == folder
    for params in requests.values():
        for key, value in params.get("Environment", {}).items():
            assert len(value) <= (512 if "TrainingJobName" in params else 256), key
    # The tuning wraps the training job's own definition: same image, channels and role; the tuned value is
    # a range, not a static hyperparameter; the objective is a key of the trainer's JSON lines.
    tuning = requests["tuned_hyperparameters.CreateHyperParameterTuningJob.json"]
    trial = tuning["TrainingJobDefinition"]
    assert len(tuning["HyperParameterTuningJobName"]) <= 32
    assert trial["AlgorithmSpecification"]["TrainingImage"] == training["AlgorithmSpecification"]["TrainingImage"]
    assert trial["InputDataConfig"] == training["InputDataConfig"] and trial["RoleArn"] == training["RoleArn"]
    assert "lr" not in trial["StaticHyperParameters"] and "batch-size" in trial["StaticHyperParameters"]
    assert tuning["HyperParameterTuningJobConfig"]["ParameterRanges"]["ContinuousParameterRanges"][0]["Name"] == "lr"
    objective = tuning["HyperParameterTuningJobConfig"]["HyperParameterTuningJobObjective"]
    assert objective == {"Type": "Minimize", "MetricName": "final_loss"}
    assert not any(key.startswith("DAGSTER_PIPES") or key == "ZERO_JOB_NAME" for key in trial["Environment"])


def test_missing_settings_are_named(tmp_path, monkeypatch, capsys):
    env = {k: v for k, v in BASE_ENV.items() if k != "ZERO_SM_ROLE_ARN"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ZERO_SM_ROLE_ARN", raising=False)
    assert main(["render-jobs", "--out", str(tmp_path / "out")]) == 2
    assert "ZERO_SM_ROLE_ARN" in capsys.readouterr().err


def test_fsx_without_vpc_is_refused(tmp_path, monkeypatch, capsys):
    env = {**BASE_ENV, "ZERO_SM_FSX_FILE_SYSTEM_ID": "fs-0123456789abcdef0", "ZERO_SM_FSX_MOUNT_NAME": "abcdefgh"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["render-jobs", "--out", str(tmp_path / "out")]) == 2
    assert "ZERO_SM_SUBNETS" in capsys.readouterr().err


PLAN_ARN = "arn:aws:sagemaker:us-east-1:123456789012:training-plan/zero-p5-campaign"
PLAN_ENV = {
    **BASE_ENV,
    "ZERO_SM_TRAINING_PLAN_ARN": PLAN_ARN,
    "ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE": "ml.p5.48xlarge",
}


def valid(operation: str, params: dict, service: str = "sagemaker") -> None:
    validate_parameters(params, SESSION.get_service_model(service).operation_model(operation).input_shape)


def test_a_training_plan_is_in_the_training_request_and_render_jobs_says_the_runner_bounds_its_runtime(
    tmp_path, monkeypatch, capsys
):
    requests = render(tmp_path / "production", monkeypatch, {**PLAN_ENV, **FSX_ENV})
    training = requests["trained_checkpoint.CreateTrainingJob.json"]
    valid("CreateTrainingJob", training)
    assert training["ResourceConfig"]["TrainingPlanArn"] == PLAN_ARN
    assert training["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"
    assert training["InfraCheckConfig"] == {"EnableInfraCheck": True}  # two instances: health-checked first
    assert "KeepAlivePeriodInSeconds" not in training["ResourceConfig"]
    # No AWS call: the configured runtime, and the plan read the runner makes first, shown as a request.
    assert training["StoppingCondition"]["MaxRuntimeInSeconds"] == 5 * 24 * 3600
    described = requests["trained_checkpoint.DescribeTrainingPlan.json"]
    valid("DescribeTrainingPlan", described)
    assert described == {"TrainingPlanName": "zero-p5-campaign"}
    note = capsys.readouterr().err
    assert "training plan zero-p5-campaign" in note and "makes no AWS call" in note
    assert "bounds MaxRuntimeInSeconds by the plan's end" in note and "ZERO_SM_PLAN_CHECKPOINT_MARGIN_S=1800" in note
    # The warm job is a Training job too, on small instances: never on the plan.
    assert "TrainingPlanArn" not in requests["fsx_warm_state.CreateTrainingJob.json"]["ResourceConfig"]

    # The rehearsal profile brings its own compute: cheap instances, off the plan, in a warm pool when asked.
    rehearsal = render(
        tmp_path / "rehearsal",
        monkeypatch,
        {**PLAN_ENV, "ZERO_PROFILE": "rehearsal", "ZERO_SM_WARM_POOL_KEEP_ALIVE_S": "1800"},
    )
    training = rehearsal["trained_checkpoint.CreateTrainingJob.json"]
    valid("CreateTrainingJob", training)
    assert "TrainingPlanArn" not in training["ResourceConfig"] and not any("TrainingPlan" in f for f in rehearsal)
    assert training["ResourceConfig"]["KeepAlivePeriodInSeconds"] == 1800
    assert training["InfraCheckConfig"] == {"EnableInfraCheck": True}
    checkless = render(tmp_path / "no-check", monkeypatch, {**PLAN_ENV, "ZERO_SM_INFRA_CHECK": "false"})
    assert "InfraCheckConfig" not in checkless["trained_checkpoint.CreateTrainingJob.json"]


@pytest.mark.parametrize(
    "env, named",
    [
        ({**PLAN_ENV, "ZERO_SM_USE_SPOT": "true"}, ["ZERO_SM_TRAINING_PLAN_ARN", "ZERO_SM_USE_SPOT"]),
        (
            {**BASE_ENV, "ZERO_SM_TRAINING_PLAN_ARN": "zero-p5-campaign"},
            ["ZERO_SM_TRAINING_PLAN_ARN", "not a training plan ARN"],
        ),
        (
            {**BASE_ENV, "ZERO_SM_WARM_POOL_KEEP_ALIVE_S": "1800", "ZERO_SM_USE_SPOT": "true"},
            ["ZERO_SM_WARM_POOL_KEEP_ALIVE_S", "ZERO_SM_USE_SPOT"],
        ),
        ({**BASE_ENV, "ZERO_SM_WARM_POOL_KEEP_ALIVE_S": "30000"}, ["ZERO_SM_WARM_POOL_KEEP_ALIVE_S", "21600"]),
        ({**BASE_ENV, "ZERO_SM_PLAN_CHECKPOINT_MARGIN_S": "half an hour"}, ["ZERO_SM_PLAN_CHECKPOINT_MARGIN_S"]),
    ],
    ids=["plan-and-spot", "plan-name-not-arn", "warm-pool-and-spot", "warm-pool-too-long", "margin-not-seconds"],
)
def test_plan_and_warm_pool_settings_that_cannot_work_are_refused_naming_them(
    tmp_path, monkeypatch, capsys, env, named
):
    for key in [k for k in __import__("os").environ if k.startswith("ZERO_SM_") or k == "ZERO_PROFILE"]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["render-jobs", "--out", str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    for words in named:
        assert words in error, (words, error)


def test_with_the_plan_as_read_the_request_is_bounded_by_its_end_or_refused(tmp_path, monkeypatch):
    from datetime import timedelta

    from helpers.sagemaker_fakes import FakeSageMaker

    from zero_assets.backends.from_env import resolved, sagemaker_settings
    from zero_assets.backends.sagemaker.training_plan import TrainingPlan
    from zero_assets.ops.job_plan import render_jobs

    for key, value in PLAN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("ZERO_PROFILE", raising=False)
    settings, aws = (resolved(resource) for resource in sagemaker_settings())
    fake = FakeSageMaker(tmp_path, None, None, {})  # only its plans: DescribeTrainingPlan, validated by botocore
    fake.add_training_plan(
        "zero-p5-campaign", instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=-60, lasts_s=48 * 3600
    )
    plan = TrainingPlan.from_description(fake.describe_training_plan(TrainingPlanName="zero-p5-campaign"))
    now = plan.start + timedelta(hours=2)
    rendered = {
        (label, operation): params
        for label, _, operation, params in render_jobs(settings, aws, training_plan=plan, now=now)
    }
    training = rendered[("trained_checkpoint", "CreateTrainingJob")]
    valid("CreateTrainingJob", training)
    # 46 h of the plan left, less the 30 min checkpoint margin: under the configured 5 days.
    assert training["StoppingCondition"]["MaxRuntimeInSeconds"] == 46 * 3600 - 1800
    assert training["ResourceConfig"]["TrainingPlanArn"] == PLAN_ARN

    fake.add_training_plan(
        "zero-p5-campaign", instance_type="ml.p4d.24xlarge", instance_count=2, starts_in_s=-60, lasts_s=48 * 3600
    )
    other = TrainingPlan.from_description(fake.describe_training_plan(TrainingPlanName="zero-p5-campaign"))
    with pytest.raises(
        ValueError, match="ResourceConfig.InstanceType is ml.p5.48xlarge .ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE."
    ) as refused:
        render_jobs(settings, aws, training_plan=other, now=now)
    assert "training plan zero-p5-campaign" in str(refused.value) and "reserves 2 x ml.p4d.24xlarge" in str(
        refused.value
    )


def test_with_the_job_image_every_request_names_it_and_the_code_carries_no_requirements(tmp_path, monkeypatch):
    image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/zero-jobs:7"  # built from docker/Dockerfile
    env = {**BASE_ENV, "ZERO_SM_TRAINING_IMAGE_URI": image, "ZERO_SM_PROCESSING_IMAGE_URI": image}
    toolkit = render(tmp_path / "toolkit", monkeypatch, env)
    held = render(tmp_path / "held", monkeypatch, {**env, "ZERO_SM_IMAGES_HOLD_REQUIREMENTS": "true"})
    assert held.keys() == toolkit.keys() and held
    no_pip = build_code_package(requirements=False).digest
    for name, params in held.items():
        if name.endswith("CreateTrainingJob.json"):
            assert params["AlgorithmSpecification"]["TrainingImage"] == image
            assert f"/code/{no_pip}/" in params["HyperParameters"]["sagemaker_submit_directory"], name
        elif name.endswith("CreateProcessingJob.json"):
            assert params["AppSpecification"]["ImageUri"] == image
            code = [i["S3Input"]["S3Uri"] for i in params["ProcessingInputs"] if i["InputName"] == "code"]
            assert code and f"/code/{no_pip}/" in code[0], name
    assert toolkit != held, "the toolkit route's packages carry requirements.txt: another digest"

"""`campaign_ready`, the readiness check before the Training Plan starts: it names whatever is not ready (the warm
state of the chosen training set, a passed rehearsal, the checks, the preflight) with the time left until the
plan's start, and the warm state's lead time from the measured throughput of a warm materialization.

Stand-ins record the training set (with a blocking check) and the warm state (its bytes, a measured wall time);
the check is the real one, on the real SageMaker runner with the fake's plan, the role simulated by FakeIam and
the checkpoint prefixes on moto's S3; the local runner without a plan warns and blocks nothing. The readiness
sensor runs the check every half hour while the plan waits.
"""

import time

import pytest
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetMaterialization,
    AssetSelection,
    Config,
    DataVersion,
    MaterializeResult,
    asset,
    build_sensor_context,
    materialize,
)
from helpers.sagemaker_fake_preflight import FakeIam
from helpers.sagemaker_fakes import FakeSageMaker, aws_env, fake_settings

from training_code.lib.aws_clients import client as aws_client
from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker import preflight as sagemaker_preflight
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.preflight import PreflightClients
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.fingerprints import rehearsal_key
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets.trained_checkpoint import TrainConfig
from zero_assets.defs.campaign_ready import campaign_readiness_sensor, campaign_ready
from zero_assets.defs.rehearsal_gate import GATE_VARIABLE, training_key_inputs

PLAN, BUCKET = "zero-p5-campaign", "zero-ready"
SET_BYTES, WARMED_BYTES, WARM_WALL_S = 4 * 10**12, 2 * 10**8, 0.5


class Version(Config):
    version: str
    checks_pass: bool = True


@asset(name="training_set", check_specs=[AssetCheckSpec("selection_sane", asset="training_set", blocking=True)])
def training_set_stand_in(config: Version) -> MaterializeResult:
    return MaterializeResult(
        data_version=DataVersion(config.version),
        check_results=[AssetCheckResult(passed=config.checks_pass, check_name="selection_sane")],
    )


@asset(name="fsx_warm_state", deps=["training_set"])
def warm_state_stand_in(config: Version) -> MaterializeResult:
    time.sleep(WARM_WALL_S)  # the measured wall time: 0.2 GB warmed in about half a second
    return MaterializeResult(
        data_version=DataVersion(config.version),
        metadata={
            "dagster/uri": f"fsx://fs-0123456789abcdef0/abcdefgh/arrow_shards/{config.version}",
            "dagster/size_bytes": SET_BYTES,
            "copied_bytes": WARMED_BYTES,
            "shards": 4000,
        },
    )


@asset(name="trained_checkpoint", deps=["fsx_warm_state"])
def trained_checkpoint_stand_in() -> None:
    raise AssertionError("readiness never trains")


ASSETS = [training_set_stand_in, warm_state_stand_in, trained_checkpoint_stand_in, campaign_ready]


def record_set(instance, version: str, checks_pass: bool = True) -> None:
    materialize(
        [training_set_stand_in],
        instance=instance,
        run_config={"ops": {"training_set": {"config": {"version": version, "checks_pass": checks_pass}}}},
        raise_on_error=False,
    )


def warm(instance, jobs, version: str):
    """Materialize the warm state from the latest training set; its readiness check runs after it."""
    result = materialize(
        ASSETS,
        selection=[warm_state_stand_in],
        instance=instance,
        resources={"settings": jobs.settings, "jobs": jobs},
        run_config={"ops": {"fsx_warm_state": {"config": {"version": version}}}},
        raise_on_error=False,
    )
    return readiness(result)


def check_only(instance, jobs):
    result = materialize(
        ASSETS,
        selection=AssetSelection.checks(campaign_ready),
        instance=instance,
        resources={"settings": jobs.settings, "jobs": jobs},
        raise_on_error=False,
    )
    return readiness(result)


def readiness(result):
    (evaluation,) = [e for e in result.get_asset_check_evaluations() if e.check_name == "campaign_ready"]
    return evaluation


@pytest.fixture
def aws(moto_endpoint, tmp_path, monkeypatch):
    """A SageMaker runner whose plan starts in an hour (the fake's), its role simulated, its prefixes on moto."""
    for key, value in aws_env(moto_endpoint).items():
        monkeypatch.setenv(key, value)
    s3 = aws_client("s3", endpoint_url=moto_endpoint)
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    plans, iam = FakeSageMaker(tmp_path / "sm", None, None, {}), FakeIam()
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(plans, None, None, None))
    monkeypatch.setattr(sagemaker_preflight, "make_preflight_clients", lambda region: PreflightClients(iam, None))
    arn = plans.add_training_plan(
        PLAN, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=3600, lasts_s=86400
    )
    compute = JobCompute(instance_type="ml.p5.48xlarge", instance_count=2, training_plan_arn=arn)
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=f"s3://{BUCKET}/{tmp_path.name}/lake")
    aws = fake_settings(bucket=BUCKET, prefix=tmp_path.name, trained_checkpoint=compute)
    return SageMakerJobRunner(settings=settings, aws=aws), iam


def pass_rehearsal(instance, jobs) -> None:
    """What a passed training_rehearsal records for the training the plan's sensor starts (the defaults)."""
    default = TrainConfig()
    inputs = training_key_inputs(jobs, default.module, default.hyperparameters(), default.tracking("0" * 16))
    instance.report_runless_asset_event(
        AssetMaterialization("training_rehearsal", metadata={"rehearsal_key": rehearsal_key(inputs)})
    )


def test_before_the_plan_starts_it_names_what_is_not_ready_with_the_time_left(instance, aws, monkeypatch):
    monkeypatch.delenv(GATE_VARIABLE, raising=False)
    jobs, iam = aws
    record_set(instance, "set-one")
    evaluation = warm(instance, jobs, "set-one")
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.ERROR, "with a plan, it blocks"
    description = evaluation.description
    assert description.startswith(f"training plan {PLAN} starts in 0:59:"), description
    assert "not ready: rehearsal: no passed rehearsal of training_code.train" in description
    assert "warm lead time ~" in description and "measured on run" in description
    lead = evaluation.metadata["warm_lead_time_s"].value
    assert SET_BYTES / WARMED_BYTES * WARM_WALL_S <= lead <= SET_BYTES / WARMED_BYTES * (WARM_WALL_S + 5), lead
    assert 3500 <= evaluation.metadata["time_left_s"].value <= 3600
    assert iam.calls, "the preflight simulated the job role"

    pass_rehearsal(instance, jobs)
    evaluation = check_only(instance, jobs)
    assert evaluation.passed, evaluation.description
    assert evaluation.description.startswith(f"training plan {PLAN} starts in 0:59:")

    record_set(instance, "set-two")  # a newer training set: the warm state is of the one before
    iam.denied = [("*", "logs:PutLogEvents")]
    evaluation = check_only(instance, jobs)
    assert not evaluation.passed
    not_ready = evaluation.metadata["not_ready"].value
    assert not_ready == ["warm state", "preflight: job role", "warm lead time"], not_ready
    assert "fsx_warm_state: the latest materialization is not built from training set set-two" in (
        evaluation.description
    )
    assert "more than the time left: warm it now" in evaluation.description
    assert "logs:PutLogEvents" in evaluation.description


def test_without_a_plan_it_warns_and_blocks_nothing(instance, tmp_path, monkeypatch):
    monkeypatch.setenv(GATE_VARIABLE, "on")  # enforced here too: no rehearsal is not ready
    settings = ZeroSettings(lake_uri=str(tmp_path / "lake"), fsx_mount=str(tmp_path))
    jobs = LocalJobRunner(settings=settings)
    record_set(instance, "set-one", checks_pass=False)
    evaluation = warm(instance, jobs, "set-one")
    assert not evaluation.passed and evaluation.severity == AssetCheckSeverity.WARN
    assert evaluation.description.startswith("no Training Plan configured (ZERO_SM_TRAINING_PLAN_ARN); not ready:")
    assert "training set: none passed its blocking checks (set-one: training_set:selection_sane failed" in (
        evaluation.description
    )
    monkeypatch.setenv(GATE_VARIABLE, "off")
    record_set(instance, "set-two")
    assert warm(instance, jobs, "set-two").passed


def test_the_readiness_sensor_checks_every_half_hour_while_the_plan_waits(instance, tmp_path, monkeypatch):
    plans = FakeSageMaker(tmp_path / "sm", None, None, {})
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(plans, None, None, None))

    def tick(starts_in_s: float):
        name = f"plan-{abs(int(starts_in_s))}"
        arn = plans.add_training_plan(
            name, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=starts_in_s, lasts_s=7200
        )
        compute = JobCompute(instance_type="ml.p5.48xlarge", instance_count=2, training_plan_arn=arn)
        settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=f"s3://{BUCKET}/lake")
        jobs = SageMakerJobRunner(settings=settings, aws=fake_settings(bucket=BUCKET, trained_checkpoint=compute))
        with build_sensor_context(instance=instance, resources={"jobs": jobs}) as context:
            return name, campaign_readiness_sensor.evaluate_tick(context)

    name, waiting = tick(3600)
    (request,) = waiting.run_requests
    assert request.run_key.startswith(f"readiness:{name}:") and request.tags["zero/training_plan"] == name
    assert tick(3600)[1].run_requests[0].run_key == request.run_key, "one check a half hour"
    name, active = tick(-5)
    assert not active.run_requests and f"training plan {name} is Active" in active.skip_message
    with build_sensor_context(
        instance=instance, resources={"jobs": LocalJobRunner(settings=ZeroSettings())}
    ) as context:
        assert "no Training Plan configured" in campaign_readiness_sensor.evaluate_tick(context).skip_message

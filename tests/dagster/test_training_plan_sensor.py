"""The timeline's start: `training_plan_start_sensor` requests `trained_checkpoint` once the plan is
Active, from the latest training set whose blocking checks passed, warming it first when the warm
state is of another one; it waits while the plan is Scheduled and makes no AWS call without a plan.

The definitions hold the real sensor beside stand-ins for the three assets it targets (a blocking
check on the training set, decided by its config), so the tests record real materializations and
check evaluations without running the graph; the plan is the SageMaker fake's, read through the real
`SageMakerJobRunner`.
"""

import time

import pytest
from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    Config,
    DataVersion,
    Definitions,
    MaterializeResult,
    RunRequest,
    SkipReason,
    asset,
    build_sensor_context,
    materialize,
)
from helpers.sagemaker_fakes import FakeSageMaker, fake_settings

from zero_assets.backends.local.runner import LocalJobRunner
from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.training_plan_start import training_plan_start_sensor

PLAN = "zero-p5-campaign"


class Version(Config):
    version: str
    checks_pass: bool = True


@asset(name="training_set", check_specs=[AssetCheckSpec("selection_sane", asset="training_set", blocking=True)])
def training_set_stand_in(config: Version) -> MaterializeResult:
    return MaterializeResult(
        data_version=DataVersion(config.version),
        check_results=[
            AssetCheckResult(passed=config.checks_pass, severity=AssetCheckSeverity.ERROR, check_name="selection_sane")
        ],
    )


@asset(name="fsx_warm_state", deps=["training_set"])
def warm_state_stand_in(config: Version) -> MaterializeResult:
    return MaterializeResult(data_version=DataVersion(config.version))  # a warm state carries its set's version


@asset(name="trained_checkpoint", deps=["fsx_warm_state"])
def trained_checkpoint_stand_in() -> None:
    raise AssertionError("the sensor requests runs; these tests never train")


DEFINITIONS = Definitions(
    assets=[training_set_stand_in, warm_state_stand_in, trained_checkpoint_stand_in],
    sensors=[training_plan_start_sensor],
)


@pytest.fixture
def plans(tmp_path, monkeypatch):
    """The fake's plans, behind the runner's clients (only DescribeTrainingPlan is called)."""
    fake = FakeSageMaker(tmp_path / "sm", None, None, {})
    monkeypatch.setattr(sagemaker_runner, "make_aws_clients", lambda region: AwsClients(fake, None, None, None))
    return fake


def sagemaker_jobs(arn: str | None) -> SageMakerJobRunner:
    compute = JobCompute(instance_type="ml.p5.48xlarge", instance_count=2, training_plan_arn=arn)
    settings = ZeroSettings(raw_uri="s3://zero-plan/raw", lake_uri="s3://zero-plan/lake")
    return SageMakerJobRunner(settings=settings, aws=fake_settings(bucket="zero-plan", trained_checkpoint=compute))


def record(instance, asset_name: str, version: str, checks_pass: bool = True) -> None:
    stand_in = training_set_stand_in if asset_name == "training_set" else warm_state_stand_in
    config = {"version": version, "checks_pass": checks_pass} if asset_name == "training_set" else {"version": version}
    materialize(
        [stand_in],
        instance=instance,
        run_config={"ops": {asset_name: {"config": config}}},
        raise_on_error=False,  # a failed blocking check fails the step; its materialization is recorded
    )


def tick(instance, jobs):
    with build_sensor_context(instance=instance, resources={"jobs": jobs}, definitions=DEFINITIONS) as context:
        return training_plan_start_sensor.evaluate_tick(context)


def only_request(result) -> RunRequest:
    assert not result.skip_message, result.skip_message
    [request] = result.run_requests
    return request


def test_a_scheduled_plan_waits_and_an_active_one_starts_training_once_from_the_set_that_passed(instance, plans):
    record(instance, "training_set", "set-one")
    record(instance, "fsx_warm_state", "set-one")
    record(instance, "training_set", "set-two", checks_pass=False)  # newer, but its blocking check failed
    arn = plans.add_training_plan(PLAN, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=2, lasts_s=3600)
    jobs = sagemaker_jobs(arn)

    waiting = tick(instance, jobs)
    assert not waiting.run_requests and f"training plan {PLAN} is Scheduled" in waiting.skip_message
    time.sleep(2.2)
    request = only_request(tick(instance, jobs))
    assert request.asset_selection == [AssetKey("trained_checkpoint")]  # set-one is warm: train on it
    assert request.tags["zero/training_set"] == "set-one" and request.tags["zero/training_plan"] == PLAN
    assert request.run_key == f"training-plan:{PLAN}:{plans.plans[PLAN]['start']:%Y%m%dT%H%M%SZ}"
    assert only_request(tick(instance, jobs)).run_key == request.run_key  # one run key per window: started once


def test_a_set_that_passed_but_is_not_warm_is_warmed_first(instance, plans):
    arn = plans.add_training_plan(PLAN, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=-5, lasts_s=3600)
    record(instance, "training_set", "set-one")
    record(instance, "fsx_warm_state", "set-one")
    record(instance, "training_set", "set-two")
    request = only_request(tick(instance, sagemaker_jobs(arn)))
    assert request.asset_selection == [AssetKey("fsx_warm_state"), AssetKey("trained_checkpoint")]
    assert request.tags["zero/training_set"] == "set-two" and request.tags["zero/rebuilt_first"] == "fsx_warm_state"


def test_no_set_that_passed_its_checks_means_no_training(instance, plans):
    arn = plans.add_training_plan(PLAN, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=-5, lasts_s=3600)
    record(instance, "training_set", "set-one", checks_pass=False)
    result = tick(instance, sagemaker_jobs(arn))
    assert not result.run_requests
    assert "no training set passed its blocking checks" in result.skip_message
    assert "training_set:selection_sane failed" in result.skip_message


@pytest.mark.parametrize("backend", ["sagemaker without a plan", "local"])
def test_without_a_plan_the_sensor_skips_and_calls_no_aws(instance, plans, backend):
    settings = ZeroSettings()
    jobs = sagemaker_jobs(None) if backend != "local" else LocalJobRunner(settings=settings)
    result = tick(instance, jobs)
    assert isinstance(result, SkipReason) or not result.run_requests
    assert "no Training Plan configured" in result.skip_message
    assert plans.calls == []


@asset(name="arrow_shards", deps=["training_set"])
def shards_stand_in() -> None:
    """Between the training set and the warm state, as when the shards are packed from the selection."""


@asset(name="fsx_warm_state", deps=["arrow_shards"])
def warm_of_shards_stand_in() -> None:
    pass


CHAIN = Definitions(
    assets=[training_set_stand_in, shards_stand_in, warm_of_shards_stand_in, trained_checkpoint_stand_in],
    sensors=[training_plan_start_sensor],
)


def test_what_lies_between_is_rebuilt_from_the_set_when_its_provenance_is_another(instance, plans):
    """Provenance, not names: each asset between counts as built from the chosen set only when the
    parent materialization it read (Dagster's input event pointer) is the one on the path."""
    arn = plans.add_training_plan(PLAN, instance_type="ml.p5.48xlarge", instance_count=2, starts_in_s=-5, lasts_s=3600)
    jobs = sagemaker_jobs(arn)

    def chain_tick() -> RunRequest:
        with build_sensor_context(instance=instance, resources={"jobs": jobs}, definitions=CHAIN) as context:
            return only_request(training_plan_start_sensor.evaluate_tick(context))

    record(instance, "training_set", "set-one")
    materialize([shards_stand_in], instance=instance)
    materialize([warm_of_shards_stand_in], instance=instance)
    assert chain_tick().asset_selection == [AssetKey("trained_checkpoint")]
    materialize([shards_stand_in], instance=instance)  # new shards: the warm state read the earlier ones
    assert chain_tick().asset_selection == [AssetKey("fsx_warm_state"), AssetKey("trained_checkpoint")]
    record(instance, "training_set", "set-two")
    request = chain_tick()
    assert request.asset_selection == [
        AssetKey("arrow_shards"),
        AssetKey("fsx_warm_state"),
        AssetKey("trained_checkpoint"),
    ]
    assert request.tags["zero/rebuilt_first"] == "arrow_shards,fsx_warm_state"

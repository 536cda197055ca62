"""`trained_checkpoint` on a SageMaker Training Plan, under the fake (moto for S3 and CloudWatch Logs):
a scheduled plan holds the job, reported as waiting, until it is Active; a request the plan cannot take,
or an ended plan, is refused before launch naming the plan and the field; a job reaching the plan's
end checkpoints and stops, and the next materialization resumes from its checkpoint.

The trainer is a test module kept to the README's trainer contract (checkpoint folder, model folder
with its manifest, one Pipes report): one step every PLAN_TRAINER_STEP_S seconds, a checkpoint only
when SIGTERM arrives (so a job killed at the plan's end, without the bound, leaves nothing to resume).
"""

from __future__ import annotations

import json
import sys
import time

import pytest
from dagster import AssetKey, AssetMaterialization, materialize
from helpers.sagemaker_fakes import fake_aws, fake_settings

from zero_assets.backends.sagemaker import runner as sagemaker_runner
from zero_assets.backends.sagemaker.runner import AwsClients, SageMakerJobRunner
from zero_assets.backends.sagemaker.settings import JobCompute
from zero_assets.backends.sagemaker.training_plan import read_training_plan
from zero_assets.core.fingerprints import DATA_VERSION_TAG
from zero_assets.core.settings import ZeroSettings
from zero_assets.defs.assets import fsx_warm_state, trained_checkpoint

BUCKET = "zero-plan"
PLAN = "zero-p5-campaign"
INSTANCE = "ml.p5.48xlarge"
TRAINER = '''
"""python -m zero_plan_jobs.trainer --max-steps N: a step every PLAN_TRAINER_STEP_S s, a checkpoint on SIGTERM."""
import argparse, json, os, signal, sys, time
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))  # before the imports: a loaded host is slow
from training_code.lib import job_env
from training_code.lib.output_manifest import write_output_manifest

parser = argparse.ArgumentParser()
parser.add_argument("--max-steps", type=int, required=True)
args, _ = parser.parse_known_args()
checkpoints = job_env.checkpoint_dir()
checkpoints.mkdir(parents=True, exist_ok=True)
saved = sorted(checkpoints.glob("step-*.json"))
first = json.loads(saved[-1].read_text())["step"] if saved else 0
with job_env.pipes_session() as pipes:
    step = first
    print(f"starting at step {first} of {args.max_steps}", flush=True)
    while step < args.max_steps:
        if stopping:
            (checkpoints / f"step-{step:06d}.json").write_text(json.dumps({"step": step}))
            print(f"SIGTERM: checkpoint at step {step}", flush=True)
            sys.exit(143)
        time.sleep(float(os.environ["PLAN_TRAINER_STEP_S"]))
        step += 1
    model = job_env.model_dir()
    (model / "weights.json").write_text(json.dumps({"steps": step}))
    write_output_manifest(model, ["weights.json"], format="plan-test/1")
    pipes.report_asset_materialization(
        metadata={"steps": step, "resumed_from_step": first}, data_version=f"steps-{step}"
    )
'''


def _forget_test_package() -> None:
    for name in [name for name in sys.modules if name.split(".")[0] == "zero_plan_jobs"]:
        del sys.modules[name]


@pytest.fixture
def plan_aws(moto_endpoint, tmp_path, monkeypatch, instance):
    """The fake with the trainer's package importable here (the code package) and in the job, the
    runner's clients on it, and an upstream warm state on record for trained_checkpoint to read."""
    setup = fake_aws(moto_endpoint, tmp_path, monkeypatch, BUCKET, "zero_plan_jobs", {"trainer": TRAINER})
    # These tests are about the plan, not about the rehearsal that gates a production training.
    monkeypatch.setenv("ZERO_REHEARSAL_GATE", "off")
    _forget_test_package()
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    setup.fake.env["PLAN_TRAINER_STEP_S"] = "0.1"
    monkeypatch.setattr(
        sagemaker_runner, "make_aws_clients", lambda region: AwsClients(setup.fake, setup.logs, setup.s3, None)
    )
    warm = f"s3://{BUCKET}/{tmp_path.name}/lake/arrow_shards/_training_sets/0123456789abcdef"
    instance.report_runless_asset_event(
        AssetMaterialization("fsx_warm_state", metadata={"dagster/uri": warm}, tags={DATA_VERSION_TAG: "ts-1"})
    )
    yield setup
    _forget_test_package()


def runner(setup, tmp_path, arn: str, *, count: int = 1, margin_s: int = 8, min_left_s: int = 5, max_runtime_s=3600):
    settings = ZeroSettings(raw_uri=f"s3://{BUCKET}/raw", lake_uri=f"s3://{BUCKET}/{tmp_path.name}/lake")
    aws = fake_settings(
        bucket=BUCKET,
        prefix=tmp_path.name,  # every test its own checkpoints, Pipes and job prefixes
        trained_checkpoint=JobCompute(
            instance_type=INSTANCE, instance_count=count, max_runtime_s=max_runtime_s, training_plan_arn=arn
        ),
        poll_interval_s=0.2,
        plan_checkpoint_margin_s=margin_s,
        plan_min_time_left_s=min_left_s,
    )
    return settings, SageMakerJobRunner(settings=settings, aws=aws)


def train(instance, settings, jobs, max_steps: int):
    return materialize(
        [fsx_warm_state, trained_checkpoint],
        selection=[trained_checkpoint],
        instance=instance,
        resources={"settings": settings, "jobs": jobs},
        run_config={
            "ops": {
                "trained_checkpoint": {
                    "config": {"module": "zero_plan_jobs.trainer", "max_steps": max_steps, "processes": 1}
                }
            }
        },
        raise_on_error=False,
    )


def training_metadata(instance) -> dict:
    event = instance.get_latest_materialization_event(AssetKey("trained_checkpoint"))
    return {key: value.value for key, value in event.asset_materialization.metadata.items()}


def failure_message(result) -> str:
    return result.get_step_failure_events()[0].step_failure_data.error.message


def created(fake) -> list[str]:
    return [name for operation, name in fake.calls if operation == "CreateTrainingJob"]


def test_a_scheduled_plan_holds_the_job_as_waiting_and_it_trains_once_the_plan_is_active(plan_aws, instance, tmp_path):
    fake = plan_aws.fake
    arn = fake.add_training_plan(PLAN, instance_type=INSTANCE, instance_count=2, starts_in_s=600, lasts_s=3600)
    # The window DescribeTrainingPlan gave at launch; the fake moves it to start now once the job waits.
    announced = fake.plans[PLAN]["start"], fake.plans[PLAN]["end"]
    starter = fake.start_plan_once_a_job_waits(PLAN)
    settings, jobs = runner(plan_aws, tmp_path, arn)
    result = train(instance, settings, jobs, max_steps=3)
    starter.join()

    assert result.success
    [name] = created(fake)
    job = fake.jobs[name]
    assert job["params"]["ResourceConfig"]["TrainingPlanArn"] == arn
    statuses = [status for status, _ in job["transitions"]]
    assert statuses.index("Pending") < statuses.index("Training")
    plan_start = fake.plans[PLAN]["start"]
    assert job["started"] >= plan_start  # nothing ran before the plan was Active
    # Bounded from the plan's start (the job was submitted before it): its end less the margin.
    assert job["params"]["StoppingCondition"]["MaxRuntimeInSeconds"] == 3600 - 8
    messages = [e.user_message or "" for e in instance.all_logs(result.run_id)]
    assert any(f"is waiting for training plan {PLAN}" in m and "starts 20" in m for m in messages), messages
    assert any("waited" in m and f"for training plan {PLAN}" in m for m in messages)
    metadata = training_metadata(instance)
    assert metadata["training_plan"] == PLAN and metadata["training_plan_arn"] == arn
    assert metadata["training_plan_reserved"] == f"2 x {INSTANCE}"
    assert metadata["training_plan_window"] == f"{announced[0]:%Y-%m-%dT%H:%M:%SZ} to {announced[1]:%Y-%m-%dT%H:%M:%SZ}"
    # The cost is the job's share of the upfront fee: 7200 USD over 2 instances x 1 h is 3600 USD an instance-hour.
    assert metadata["training_plan_fee_per_instance_hour"] == 3600.0
    share = round(metadata["billable_instance_seconds"] / 3600 * 3600.0, 4)
    assert metadata["estimated_cost_usd"] == metadata["training_plan_fee_share"] == share
    assert "training plan" in metadata["price_source"]


@pytest.mark.parametrize(
    "case",
    ["expired", "failed", "instance type", "instance count", "time left"],
)
def test_a_request_the_plan_cannot_take_is_refused_before_launch_naming_the_plan_and_the_field(
    plan_aws, instance, tmp_path, case
):
    fake = plan_aws.fake
    plan = {"instance_type": INSTANCE, "instance_count": 2, "starts_in_s": -60, "lasts_s": 3600}
    options, expected = {}, []
    if case == "expired":
        plan.update(starts_in_s=-120, lasts_s=60)
        expected = ["Status is Expired", "ZERO_SM_TRAINING_PLAN_ARN"]
    elif case == "failed":
        expected = ["Status is Failed", "payment failed"]
    elif case == "instance type":
        plan["instance_type"] = "ml.p4d.24xlarge"
        expected = [f"ResourceConfig.InstanceType is {INSTANCE}", "ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_TYPE"]
    elif case == "instance count":
        options["count"] = 4
        expected = ["ResourceConfig.InstanceCount is 4", "ZERO_SM_TRAINED_CHECKPOINT_INSTANCE_COUNT"]
    else:
        plan["lasts_s"] = 60 + 1800  # 30 min left, an hour asked for
        options["min_left_s"] = 3600
        expected = ["EndTime is", "ZERO_SM_PLAN_MIN_TIME_LEFT_S"]
    arn = fake.add_training_plan(PLAN, **plan)
    if case == "failed":
        fake.fail_training_plan(PLAN)
    settings, jobs = runner(plan_aws, tmp_path, arn, **options)
    result = train(instance, settings, jobs, max_steps=3)

    assert not result.success
    message = failure_message(result)
    assert f"training plan {PLAN} ({arn})" in message and "not launched" in message, message
    for words in expected:
        assert words in message, (words, message)
    assert ("DescribeTrainingPlan", PLAN) in fake.calls
    assert created(fake) == []  # refused by the runner, not by SageMaker


def test_a_job_reaching_the_plans_end_checkpoints_and_the_next_materialization_resumes_from_it(
    plan_aws, instance, tmp_path
):
    fake = plan_aws.fake
    margin = 8
    # Active now, ending in 29 s: the job may run 29 - 8 = 21 s, the plan's instances go back 8 s later.
    # (With 11 s, on a host loaded by the rest of the suite the trainer's imports alone could outlast it.)
    arn = fake.add_training_plan(PLAN, instance_type=INSTANCE, instance_count=1, starts_in_s=-1, lasts_s=30)
    settings, jobs = runner(plan_aws, tmp_path, arn, margin_s=margin)
    steps = 300  # 30 s of steps: more than the plan has left
    first = train(instance, settings, jobs, max_steps=steps)

    assert not first.success
    [stopped] = created(fake)
    job = fake.jobs[stopped]
    assert job["status"] == "Stopped" and job["secondary"] == "MaxRuntimeExceeded", (job["status"], job["failure"])
    assert job["params"]["StoppingCondition"]["MaxRuntimeInSeconds"] <= 29 - margin
    message = failure_message(first)
    checkpoints = job["params"]["CheckpointConfig"]["S3Uri"]
    assert f"at the end of its time on training plan {PLAN}" in message, message
    assert checkpoints in message and "materialize it again" in message and "resume" in message
    bucket, prefix = checkpoints[len("s3://") :].split("/", 1)
    saved = plan_aws.s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    assert [o["Key"].rsplit("/", 1)[1] for o in saved][-1].startswith("step-"), saved
    reached = json.loads(plan_aws.s3.get_object(Bucket=bucket, Key=saved[-1]["Key"])["Body"].read())["step"]
    assert 0 < reached < steps

    fake.extend_training_plan(PLAN, 3600)  # the plan's extension: time left again
    second = train(instance, settings, jobs, max_steps=steps)

    assert second.success
    resumed = [name for name in created(fake) if name != stopped]
    assert resumed == [stopped.replace("-a1", "-a2")]  # the next attempt of the same materialization
    assert fake.jobs[resumed[0]]["params"]["CheckpointConfig"]["S3Uri"] == checkpoints
    metadata = training_metadata(instance)
    assert metadata["resumed_from_step"] == reached and metadata["steps"] == steps
    assert metadata["training_plan"] == PLAN


def test_the_plan_read_follows_the_clock_scheduled_active_expired(plan_aws):
    """Each DescribeTrainingPlan answer passed botocore's output model in the fake (validated_response)."""
    fake = plan_aws.fake
    arn = fake.add_training_plan(PLAN, instance_type=INSTANCE, instance_count=2, starts_in_s=1.5, lasts_s=2)
    statuses = []
    for _ in range(3):
        plan = read_training_plan(fake, arn)
        statuses.append(plan.status)
        assert plan.instance_type == INSTANCE and plan.instance_count == 2 and plan.upfront_fee == 7200.0
        time.sleep(1.9)
    assert statuses == ["Scheduled", "Active", "Expired"]
    with pytest.raises(ValueError, match="knows no training plan zero-unknown"):
        read_training_plan(fake, arn.replace(PLAN, "zero-unknown"))
